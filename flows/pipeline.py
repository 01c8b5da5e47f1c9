"""The whole pipeline as one Prefect flow:

    python -m flows.pipeline [--params params.yaml | --preset local]

corpus -> task data -> teacher MLM pre-training -> word vectors -> teacher fine-tuning -> augmentation ->
general distillation -> task distillation (intermediate, then the prediction grid) -> evaluation ->
registry -> report. Every stage is a Prefect task with a content-addressed cache key (stage, code version,
the params that matter, fingerprints of its inputs; see tasks.stage), so an unchanged re-run hits the cache
for every heavy task, and a changed parameter reruns only what depends on it. One MLflow parent run per
flow run, a nested run per executed stage.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from tasks import env  # noqa: F401  (before prefect)

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from distillery.config import ConfigError, Params, load_params
from distillery.errors import EXIT_USER_ERROR, UserError, debug_requested, report
from flows.stages import STAGES, items
from tasks import paths, tracking
from tasks.execute import execute, label, say
from tasks.stage import Stage, is_fresh, stage_key

PRESETS_DIR = env.ROOT / "params"


def _prefect_task(stage: Stage):
    def key(_context, parameters: dict[str, Any]) -> str:
        return stage_key(stage, parameters["params"], parameters["item"])

    @task(name=stage.name, cache_key_fn=key, persist_result=True, task_run_name="{item}",
          result_serializer="json")
    def run(params: Params, item: str | None, parent_run_id: str | None) -> dict[str, Any]:
        return execute(stage, params, item, parent_run_id, say_cached=False)  # run_stage said it

    return run


PREFECT_TASKS = {name: _prefect_task(stage) for name, stage in STAGES.items()}


def run_stage(name: str, p: Params, item: str | None, parent_run_id: str | None) -> dict[str, Any]:
    """Call a stage's Prefect task. The stamp decides (tasks.stage.is_fresh): a stale stage bypasses Prefect's result
    cache; a fresh one is a Prefect cache hit, or runs no body when Prefect's store misses (after `dvc repro`)."""
    stage, prefect_task = STAGES[name], PREFECT_TASKS[name]
    if is_fresh(stage, p, item):
        say(f"{label(stage, item)}: cached")
    else:
        prefect_task = prefect_task.with_options(refresh_cache=True)
    return prefect_task(p, item, parent_run_id)


@flow(name="distillery-pipeline")
def pipeline(params_file: str = "params.yaml") -> dict[str, Any]:
    """Run every stage. A user error (bad params, input file, model; a teacher that failed the gate) stops the run:
    its one-line message is printed last (``error: ...``) and returned in the result's "stopped"."""
    try:
        p = load_params(params_file, inputs=True, root=env.ROOT)
    except UserError as exc:
        if debug_requested([]):
            raise
        return _stopped([str(exc)], {})
    started = time.perf_counter()
    timings: dict[str, float] = {}
    with tracking.run("pipeline", params={"params_file": params_file}) as parent:
        parent_id = parent.info.run_id
        import mlflow

        for name in STAGES:
            for item in items(name, p):
                t0 = time.perf_counter()
                try:
                    run_stage(name, p, item, parent_id)
                except UserError as exc:
                    mlflow.set_tag("stopped", f"{name}[{item or ''}]: {exc}"[:5000])
                    if debug_requested([]):
                        raise
                    return _stopped([str(exc)], timings)
                timings[f"{name}[{item}]" if item else name] = round(time.perf_counter() - t0, 2)
            if name == "finetune_teacher" and (failed := _failed_teachers(p)):
                mlflow.set_tag("stopped", "teacher gate")
                return _stopped(failed, timings)

        mlflow.log_metrics({f"seconds.{k.replace('[', '.').replace(']', '').replace(':', '.')}": v
                            for k, v in timings.items()})
        mlflow.log_artifact(str(paths.summary()))
        if (paths.REPORTS / "table.md").is_file():
            mlflow.log_artifacts(str(paths.REPORTS), artifact_path="reports")
    _publish(p)
    total = round(time.perf_counter() - started, 1)
    print(f"pipeline finished in {total} s; summary: {paths.summary()}")
    return {"seconds": total, "stages": timings, "summary": str(paths.summary())}


def _stopped(messages: list[str], timings: dict[str, float]) -> dict[str, Any]:
    for message in messages:
        report(UserError(message))  # `error: <message>` on stderr, after Prefect's one-line log of a failed task
    return {"stopped": messages, "stages": timings}


def _failed_teachers(p: Params) -> list[str]:
    """The teacher gate, before any distillation: one message per task whose teacher learned nothing."""
    from tasks.teacher import TeacherGateError, teacher_gate

    failed = []
    for task in p.data.tasks:
        try:
            teacher_gate(p, task)
        except TeacherGateError as exc:
            failed.append(str(exc))
    return failed


def _publish(p: Params) -> None:
    """The report as Prefect artifacts (a Markdown table and the summary as a table)."""
    import json

    table = paths.REPORTS / "table.md"
    if table.is_file():
        create_markdown_artifact(key="distillery-report", markdown=table.read_text(encoding="utf-8"),
                                 description="Students vs teacher: size, speed, GLUE dev scores")
    summary = json.loads(paths.summary().read_text())
    rows = [{"task": task, "model": model, **{k: v for k, v in r.items() if isinstance(v, (int, float, str))}}
            for task, models in summary.items() for model, r in models.items()]
    create_table_artifact(key="distillery-summary", table=rows)


def add_params_options(parser: argparse.ArgumentParser) -> None:
    """--params FILE | --preset NAME, read back with `params_path(args.params, args.preset)`."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--params", help="params file (default params.yaml)")
    group.add_argument("--preset", help="a file in params/ by name, e.g. local, paper-tinybert4")


def params_path(params: str | None, preset: str | None) -> str:
    if preset:
        names = sorted(f.stem for f in PRESETS_DIR.glob("*.yaml"))
        if preset not in names:  # a name, never a path
            raise ConfigError(f"--preset: unknown preset {preset!r}; presets in {PRESETS_DIR}: {', '.join(names)}")
        return str(PRESETS_DIR / f"{preset}.yaml")
    return params or "params.yaml"


class _UserErrorsOnOneLine(logging.Filter):
    """Prefect logs a failing task with its traceback; for a user error the one-line message is the point
    (the command prints it again at the end), so the traceback is dropped unless --debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], UserError):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_error_tracebacks() -> None:
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logging.getLogger(name).addFilter(_UserErrorsOnOneLine())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_params_options(parser)
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)
    debug = args.debug or debug_requested([])
    if debug:
        os.environ["DISTILLERY_DEBUG"] = "1"  # the flow re-raises user errors too
    try:
        path = params_path(args.params, args.preset)
        # fail before any work (and before the Prefect server starts): params, then every input they name
        load_params(path, inputs=True, root=env.ROOT)
    except UserError as exc:
        if debug:
            raise
        return report(exc)
    if not debug:
        quiet_user_error_tracebacks()
    try:
        result = pipeline(str(Path(path)))  # prints its `error:` lines when a user error stops it
    except UserError as exc:
        if debug:
            raise
        return report(exc)
    return EXIT_USER_ERROR if result.get("stopped") else 0


if __name__ == "__main__":
    sys.exit(main())
