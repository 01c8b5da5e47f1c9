"""The whole pipeline as one Prefect flow:

    python -m flows.pipeline [--params params.yaml | --preset local]

corpus -> task data -> teacher MLM pre-training -> word vectors -> teacher fine-tuning -> augmentation ->
general distillation -> task distillation (intermediate, then the prediction grid) -> evaluation ->
registry -> report, as a DAG: every (stage, item) is a Prefect task submitted as a future that waits only for
the stages whose outputs it reads (flows.stages.upstream, the graph `dvc.yaml` declares), so independent ones
run at once on the task runner of params `orchestration` (a thread pool, or Dask), with at most
`device_slots` device stages at a time. Every task has a content-addressed cache key (stage, code version, the
params that matter, fingerprints of its inputs; see tasks.stage), so an unchanged re-run is `Cached` for every
task, and a changed parameter reruns only what depends on it. One MLflow parent run per flow run, a nested run
per executed stage. In a DVC repository, the stages the flow completed are then recorded in `dvc.lock`
(flows.dvc.record), so `dvc repro` afterwards runs none of them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from tasks import env  # noqa: F401  (before prefect)

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from distillery.config import ConfigError, Params
from distillery.preflight import load_params
from distillery.errors import EXIT_USER_ERROR, UserError, debug_requested, report
from distillery.precision import describe
from flows import api_server
from flows import dvc as dvc_lock
from flows.stages import STAGES, Node, upstream
from tasks import changes, paths, tracking
from tasks.evaluate import verdict_lines
from tasks.execute import execute, label, say
from tasks.lock import project_lock
from tasks.stage import Stage, is_fresh, stage_key

PRESETS_DIR = env.ROOT / "params"


#: The key the Prefect cache-key function computed, with the params it was computed for, for the task body that
#: follows it (one key per stage run). One entry per (stage, item): a cache hit's entry is overwritten next run.
_KEYS: dict[tuple[str, str | None], tuple[Params, str]] = {}


def _prefect_task(stage: Stage):
    def key(_context, parameters: dict[str, Any]) -> str:
        params, item = parameters["params"], parameters["item"]
        k = stage_key(stage, params, item)
        _KEYS[(stage.name, item)] = (params, k)
        return k

    @task(name=stage.name, cache_key_fn=key, persist_result=True, result_serializer="json")
    def run(params: Params, item: str | None, parent_run_id: str | None, say_cached: bool) -> dict[str, Any]:
        computed_for, k = _KEYS.pop((stage.name, item), (None, None))
        if computed_for is not params:  # another flow run's key, or none: compute it here
            k = stage_key(stage, params, item)
        if stage.device and not is_fresh(stage, params, item, k):
            slots = device_slots(params.orchestration.device_slots)
            return slots.run(execute, stage, params, item, parent_run_id, say_cached=say_cached, key=k,
                             exclusive=stage.device == "exclusive")
        return execute(stage, params, item, parent_run_id, say_cached=say_cached, key=k)

    return run


PREFECT_TASKS = {name: _prefect_task(stage) for name, stage in STAGES.items()}


class DeviceSlots:
    """At most `n` device stages at once in this process, each on one of `n` device threads; an exclusive one
    (latency) waits for all `n`. The device threads are the only ones that run training: torch's OpenMP keeps a team
    of worker threads per calling thread, and when consecutive stages ran on different pool threads (a team each) a
    training stage used about one of 2 CPU cores."""

    def __init__(self, n: int):
        self.n, self.free = n, threading.BoundedSemaphore(n)
        self.exclusive = threading.Lock()  # one exclusive holder gathers slots at a time: no deadlock between two
        self.threads = concurrent.futures.ThreadPoolExecutor(n, thread_name_prefix="device")

    @contextlib.contextmanager
    def hold(self, *, exclusive: bool = False):
        count = self.n if exclusive else 1
        with self.exclusive if exclusive else contextlib.nullcontext():
            for _ in range(count):
                self.free.acquire()
        try:
            yield
        finally:
            for _ in range(count):
                self.free.release()

    def run(self, fn, /, *args, exclusive: bool = False, **kwargs):
        """`fn(*args, **kwargs)` on a device thread once a slot (all of them when `exclusive`) is free, in the
        caller's context (Prefect's run context, for its logger)."""
        with self.hold(exclusive=exclusive):
            return self.threads.submit(contextvars.copy_context().run, functools.partial(fn, *args, **kwargs)).result()


@functools.lru_cache(maxsize=None)
def device_slots(n: int) -> DeviceSlots:
    """The device's slots, shared by every flow run in this process."""
    return DeviceSlots(n)


def _drop_dask_close_timeout(record: logging.LogRecord) -> bool:
    """False for the one asyncio error an in-process Dask cluster leaves when it closes on a busy machine: a worker's
    close waits at most 30 s for its batched stream to flush (tornado's `with_timeout`, whose error reads "Timeout";
    the worker closes anyway), and when that timeout fires as the cluster's event loop stops, its future is never
    read ("Future exception was never retrieved"; seen once in CI with another test process on both cores). Every
    other asyncio record passes."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (record.getMessage().startswith("Future exception was never retrieved")
                and isinstance(exc, TimeoutError) and exc.args == ("Timeout",))


def task_runner(p: Params):
    """The Prefect task runner that `orchestration` names."""
    o = p.orchestration
    if o.runner == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as exc:
            raise UserError("orchestration.runner: dask needs prefect-dask (pip install -e '.[cluster]')") from exc
        if o.dask_address:
            return DaskTaskRunner(address=o.dask_address)
        logging.getLogger("asyncio").addFilter(_drop_dask_close_timeout)
        # a local cluster in this process (device slots are per process); its HTTP servers on the loopback only
        return DaskTaskRunner(cluster_kwargs={"n_workers": 1, "threads_per_worker": o.max_workers, "processes": False,
                                              "dashboard_address": "127.0.0.1:0",
                                              "worker_dashboard_address": "127.0.0.1:0"})
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=o.max_workers)


def submit_stages(runner, p: Params, parent_run_id: str) -> dict[Node, Any]:
    """Submit every (stage, item) once the stages whose outputs it reads are submitted, waiting for them
    (`wait_for`: the DAG Prefect shows). A stage whose producers were all fresh when it was submitted is checked now:
    fresh, it is a Prefect cache hit (`Cached`), or runs no body when Prefect's result store misses (after `dvc
    repro`); otherwise its body decides when its inputs exist (runs, or says `cached` when they came out the same).
    The teacher gate is the bodies' too: a stage that distils from a task's teacher, or serves that (augmentation,
    registration), is skipped for a task whose teacher failed it (tasks.stage.SkipStage), as under `dvc repro`.
    Returns the futures."""
    graph = upstream(p)
    futures: dict[Node, Any] = {}
    fresh: set[Node] = set()
    for node, producers in graph.items():
        name, item = node
        stage = STAGES[name]
        prefect_task = PREFECT_TASKS[name].with_options(task_run_name=label(stage, item))  # as on the console
        if all(u in fresh for u in producers) and is_fresh(stage, p, item):
            fresh.add(node)
            say(f"{label(stage, item)}: cached")
            say_cached = False
        else:
            prefect_task = prefect_task.with_options(refresh_cache=True)
            say_cached = True
        futures[node] = runner.submit(prefect_task, {"params": p, "item": item, "parent_run_id": parent_run_id,
                                                     "say_cached": say_cached},
                                      wait_for=[futures[u] for u in producers])
    return futures


#: the result of the last flow body that ran to its end, for `main` when the server lost the flow run's final state
_FINISHED: dict[str, dict[str, Any]] = {}


@flow(name="distillery-pipeline")
def pipeline(params_file: str = "params.yaml") -> dict[str, Any]:
    """Run every stage as a DAG (see `submit_stages`). A user error (bad params, input file, model) stops the run: its
    one-line message is printed last (``error: ...``) and returned in the result's "stopped"; stages that do not
    depend on the failed one still finish. A task whose teacher failed the gate is not distilled, the others are; the
    run ends with one line per such task (``teacher gate: ...``), or, with `teacher_finetune.stop_on_failed_gate`, with
    them as ``error:`` lines and the result's "stopped" (exit code 2). A Prefect API server that goes away meanwhile is
    one console line (flows.api_server); the stages go on."""
    api_server.install()
    with project_lock():  # one run at a time per project (tasks.lock): held already when `main` started this flow
        _FINISHED["result"] = result = _pipeline(params_file)
    return result


def _pipeline(params_file: str) -> dict[str, Any]:
    try:
        tracking.require("the pipeline", "run its stages untracked with `python -m flows.stage all`")
        p = load_params(params_file, inputs=True, root=env.ROOT)
    except UserError as exc:
        if debug_requested([]):
            raise
        return _stopped([str(exc)], {})
    say(describe(p.precision))
    started = time.perf_counter()
    with tracking.run("pipeline", params={"params_file": params_file}) as parent:
        import mlflow
        from prefect.futures import wait

        with task_runner(p) as runner:
            futures = submit_stages(runner, p, parent.info.run_id)
            wait(list(futures.values()))
        done: list[Node] = []
        timings: dict[str, float] = {}
        statuses: dict[str, str] = {}
        for (name, item), future in futures.items():  # in sequential order: the first failure is the one reported
            if future.state.is_completed():
                done.append((name, item))
                statuses[label(STAGES[name], item)] = changes.status(future.result(),
                                                                     cached=future.state.name == "Cached")
                seconds = (future.result() or {}).get("seconds")
                if seconds is not None:
                    timings[f"{name}[{item}]" if item else name] = seconds
                continue
            error = future.result(raise_on_failure=False) if future.state.is_failed() else None
            if isinstance(error, UserError):
                mlflow.set_tag("stopped", f"{name}[{item or ''}]: {error}"[:5000])
                if debug_requested([]):
                    raise error
                return _stopped([str(error)], timings)
            if isinstance(error, BaseException):
                raise error
        from tasks.teacher import failed_gates

        failed_teachers = failed_gates(p)  # the tasks not distilled: their gated stages said `skipped`
        stop = bool(failed_teachers) and p.teacher_finetune.stop_on_failed_gate
        if failed_teachers:
            mlflow.set_tag("teacher_gate_failed", "\n".join(failed_teachers)[:5000])
        if stop:
            mlflow.set_tag("stopped", "teacher gate (teacher_finetune.stop_on_failed_gate)")
            # report not recorded in dvc.lock: `dvc repro` then runs its report stage, which ends the same way
            done = [node for node in done if node[0] != "report"]
        mlflow.log_metrics({f"seconds.{k.replace('[', '.').replace(']', '').replace(':', '.')}": v
                            for k, v in timings.items()})
        mlflow.log_artifact(str(paths.summary()))
        say(changes.console_line(changes.record(p, statuses, [(STAGES[name], item) for name, item in futures])))
        mlflow.log_artifact(str(changes.report_path()))
        if (paths.REPORTS / "table.md").is_file():
            mlflow.log_artifacts(str(paths.REPORTS), artifact_path="reports")
    _publish(p)
    if (problem := dvc_lock.record(params_file, done)) is not None:  # one cache truth: `dvc repro` reruns nothing
        say(problem)
    total = round(time.perf_counter() - started, 1)
    if not stop:
        for message in failed_teachers:
            say(f"teacher gate: {message}")
    for line in verdict_lines(p):
        say(line)
    print(f"pipeline finished in {total} s; summary: {paths.summary()}")
    if stop:
        return {**_stopped(failed_teachers, timings), "seconds": total, "summary": str(paths.summary())}
    return {"seconds": total, "stages": timings, "summary": str(paths.summary())}


def _stopped(messages: list[str], timings: dict[str, float]) -> dict[str, Any]:
    for message in messages:
        report(UserError(message))  # `error: <message>` on stderr, after Prefect's one-line log of a failed task
    return {"stopped": messages, "stages": timings}



def _publish(p: Params) -> None:
    """The report as Prefect artifacts (a Markdown table and the summary as a table); none when the API server is
    gone (after the client's retries: a restarted server gets them)."""
    try:
        _artifacts()
    except Exception as exc:
        if not api_server.unreachable(exc):
            raise
        api_server.GONE.say_once()


def _artifacts() -> None:
    import json

    if changes.report_path().is_file():
        create_markdown_artifact(key="distillery-changes", markdown=changes.report_path().read_text(encoding="utf-8"),
                                 description="What changed since the last run, what ran, the promotion decisions")
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
    parser.add_argument("--no-wait", action="store_true",
                        help="stop with one line when another run holds the project, instead of waiting for it")
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
    _FINISHED.clear()
    try:
        with project_lock(wait=not args.no_wait):  # before the flow run starts: a second run waits (or stops) here
            result = pipeline(str(Path(path)))  # prints its `error:` lines when a user error stops it
    except UserError as exc:
        if debug:
            raise
        return report(exc)
    except Exception as exc:
        if debug or not api_server.unreachable(exc):
            raise
        if "result" not in _FINISHED:  # the flow body stopped on the lost server
            return report(UserError(f"the Prefect API server ({api_server.url()}) went away and the run stopped; the "
                                    "stages that finished are kept: run the same command again to run the rest"))
        result = _FINISHED["result"]  # every stage ran; only the flow run's final state did not reach the server
    return EXIT_USER_ERROR if result.get("stopped") else 0


if __name__ == "__main__":
    api_server.end(main())
