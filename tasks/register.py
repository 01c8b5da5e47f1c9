"""Registration stage: a task's distilled student becomes a new version of the registered model
`<student>-<task>`, gated by its dev score.

- It runs after `evaluate` and reads `metrics/eval/<task>.json` (a dependency): the version is tagged with its dev
  metrics, retention, int8 change, speed, the params hash, the git commit and the content hashes of its inputs
  (and their DVC md5s when `dvc.lock` has them); the model directory logged with it carries a model card
  (`README.md` with Hugging Face metadata: teacher, recipe, data, metrics, speed).
- It is logged as a pyfunc model (models from code) with a signature and an input example: for a GLUE task
  `tasks/pyfunc_classifier.py` (labels with the task's names, the raw score for STS-B, both sentences for pair
  tasks); for a span task (SQuAD) `tasks/pyfunc_reader.py` ({question, context} -> {answer, score, start, end}), with
  the library's `distillery` package as its code (its SQuAD windows and answer extraction).
- Every new version gets the alias `candidate`; `champion` moves to it only when its main dev score beats its direct
  baseline's (the same student trained without the teacher) and the current champion's by more than
  `registry.promote_margin`. Otherwise the run says why it did not promote
  (printed, tagged on the version and the MLflow run, and written to `metrics/registry/<student>-<task>.json`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tasks import paths, tracking
from tasks.distill import chosen, search_deps
from tasks.execute import say
from tasks.provenance import git_commit, lock_outs
from tasks.stage import SkipStage, Stage, fingerprint, skipped, split_item

from distillery.config import Params
from distillery.io import write_json
from distillery.report import retention
from distillery.task_kinds import task_kind

CANDIDATE, CHAMPION = "candidate", "champion"
#: the pyfunc of each task kind (`TaskKind.pyfunc`)
PYFUNC = {name: Path(__file__).with_name(f"pyfunc_{name}.py") for name in ("classifier", "reader")}


def pip_requirements(span: bool = False) -> list[str]:
    import pandas
    import torch
    import transformers

    out = [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}",
           f"pandas=={pandas.__version__}"]
    if span:  # the shipped distillery.squad modules read their tables with datasets and numpy
        import datasets
        import numpy

        out += [f"datasets=={datasets.__version__}", f"numpy=={numpy.__version__}"]
    return out


# ------------------------------------------------------------------------------------------------ provenance

def params_hash(p: Params) -> str:
    return hashlib.sha256(json.dumps(p.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(paths.ROOT.resolve()).as_posix()
    except ValueError:
        return str(path)


def dvc_md5s(inputs: dict[str, Path]) -> dict[str, str]:
    """name -> the md5 `dvc.lock` records for that input (outputs of `dvc repro`), when there is one."""
    recorded = lock_outs(paths.ROOT)
    return {name: recorded[_rel(path)] for name, path in inputs.items() if recorded.get(_rel(path))}


def registry_inputs(student: str, task: str) -> dict[str, Path]:
    return {"model": paths.student(student, task) / "model", "eval": paths.evaluation(task),
            "teacher": paths.teacher(task) / "model", "task_data": paths.task_data(task)}


# ------------------------------------------------------------------------------------------------ metrics

def version_metrics(p: Params, student: str, task: str) -> dict[str, Any]:
    """The student's row of metrics/eval/<task>.json with retention (main over the teacher's) added."""
    evaluation = paths.evaluation(task)
    if not evaluation.is_file():
        from distillery.errors import InputNotFoundError

        raise InputNotFoundError(f"register: {evaluation} not found; the evaluate stage writes it (run it first)")
    results = json.loads(evaluation.read_text(encoding="utf-8"))
    if student not in results:
        from distillery.errors import UserError

        raise UserError(f"register: {evaluation} has no row for {student}; re-run the evaluate stage for {task}")
    row, teacher = results[student], results.get("teacher", {})
    names = task_kind(task).metric_names
    out: dict[str, Any] = {f"dev.{m}": row[m] for m in names if isinstance(row.get(m), (int, float))}
    out["dev.main"] = row["main"]
    if isinstance((direct := results.get(f"{student}-direct", {})).get("main"), (int, float)):
        out["direct.dev.main"] = direct["main"]  # the same student trained without the teacher
    if teacher.get("main") is not None:
        out["teacher.dev.main"] = teacher["main"]
        if (kept := retention(row["main"], teacher["main"])) is not None:
            out["retention"] = kept
    for key, name in (("int8_main_change", "int8.main_change"), ("params", "params"), ("flops", "flops"),
                      ("latency_ms_b1", "latency_ms_b1"), ("speedup_b1", "speedup_b1"),
                      ("latency_ms_b1_int8", "latency_ms_b1_int8"), ("bytes_int8_onnx", "bytes_int8_onnx"),
                      ("best_f1_thresh", "null_threshold")):  # SQuAD v2.0: the dev-tuned null-odds threshold
        if isinstance(row.get(key), (int, float)):
            out[name] = row[key]
    return out


def promotion(main: float, champion_main: float | None, champion_version: str | None, margin: float,
              direct_main: float | None = None) -> tuple[bool, str]:
    """(promote?, why): `champion` never moves to a candidate that does not beat its direct baseline (the same
    student trained without the teacher: distillation bought nothing), and otherwise only to one whose main dev
    score beats the champion's by more than `margin` (a tie keeps the champion)."""
    if direct_main is not None and main <= direct_main:
        return False, (f"not promoted: dev main {main:.4f} does not beat its direct baseline {direct_main:.4f} (the "
                       "same student without distillation); it stays the candidate")
    if champion_version is None:
        return True, "no champion yet: the first version becomes champion"
    if champion_main is None:
        return True, f"the champion (version {champion_version}) has no dev.main tag to compare with: promoted"
    if main > champion_main + margin:
        return True, (f"dev main {main:.4f} beats the champion (version {champion_version}) {champion_main:.4f} by "
                      f"more than registry.promote_margin {margin}")
    return False, (f"not promoted: dev main {main:.4f} does not beat the champion (version {champion_version}) "
                   f"{champion_main:.4f} by more than registry.promote_margin {margin}; it stays the candidate")


# ------------------------------------------------------------------------------------------------ model card

def _card_task(p: Params, task: str) -> dict[str, Any]:
    """What the model card says about the task (`TaskKind.card`)."""
    return task_kind(task, p.data).card(p.data)


def model_card(p: Params, student: str, task: str, metrics: dict[str, Any]) -> str:
    """A Hugging Face model card (README.md: YAML metadata + text) for the registered student."""
    import yaml

    about = _card_task(p, task)
    from tasks.distill import recipe_of

    from distillery.recipes import recipe_options

    recipe = recipe_of(p, student)
    teacher = (p.teacher.name_or_path if p.teacher.init == "pretrained"
               else f"a {p.teacher.shape.as_spec()} teacher trained from scratch in this pipeline")
    if task in p.teacher.predictions:
        teacher = f"a teacher's predictions ({p.teacher.predictions[task].source})"
    elif task in p.teacher.ensemble:
        teacher = f"an ensemble of {len(p.teacher.ensemble[task])} teachers (the mean of their probabilities)"
    dev = {k.removeprefix("dev."): v for k, v in metrics.items() if k.startswith("dev.") and k != "dev.main"}
    meta: dict[str, Any] = {
        "library_name": "transformers",
        "pipeline_tag": about["pipeline_tag"],
        "tags": ["distillation", recipe.recipe, about["tag"]],
        "model-index": [{"name": f"{student}-{task}", "results": [{
            "task": {"type": about["type"]},
            "dataset": about["dataset"],
            "metrics": [{"type": k, "value": round(float(v), 6)} for k, v in dev.items()],
        }]}],
    }
    if p.teacher.init == "pretrained":
        meta["base_model"] = p.teacher.name_or_path
    if about["hub"]:
        meta["datasets"] = [about["hub"]]
    rows = [("dev " + k, f"{v:.4f}") for k, v in dev.items()]
    rows += [(k, f"{metrics[k]:.4f}" if isinstance(metrics[k], float) else str(metrics[k]))
             for k in ("retention", "teacher.dev.main", "int8.main_change", "params", "flops", "latency_ms_b1",
                       "speedup_b1", "latency_ms_b1_int8") if k in metrics]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    data = (f"`{p.data.source}` task data"
            + (f", at most {p.data.max_train_examples} training examples" if p.data.max_train_examples else "")
            + (f", dev scores on at most {p.data.max_eval_examples} examples" if p.data.max_eval_examples else ""))
    return (f"---\n{yaml.safe_dump(meta, sort_keys=False)}---\n\n"
            f"# {student}-{task}\n\n"
            f"A `{recipe.recipe}` student ({recipe.shape.as_spec()}, init {recipe.init.kind}) distilled from {teacher} "
            f"for {about['what']}.\n\n"
            f"- Recipe: objectives {dict(recipe.weights.weights)}, options {recipe_options(recipe)}\n"
            f"- Data: {data}\n\n"
            f"| metric | value |\n|---|---|\n{table}\n\n"
            "Speed: CPU median latency in ms at batch 1 (`latency_ms_b1`), speedup over the teacher (`speedup_b1`), "
            "the int8 ONNX export's latency and dev-score change.\n\n"
            f"```python\nimport mlflow, pandas as pd\nmodel = mlflow.pyfunc.load_model(\"models:/{student}-{task}@champion\")\n"
            f"{about['use']}\n```\n")


# ------------------------------------------------------------------------------------------------ stage

def _already_registered(client, name: str, model_sha: str, metrics: dict[str, Any]):
    """The latest version of `name` when it holds the same model (content hash) with the same dev scores."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    if not versions:
        return None
    latest = max(versions, key=lambda v: int(v.version))
    dev = {k: _tag(v) for k, v in metrics.items() if k.startswith("dev.")}
    same = latest.tags.get("inputs.model.sha256") == model_sha and all(latest.tags.get(k) == v for k, v in dev.items())
    return latest if same else None


def _new_version(client, name: str, info, tags: dict[str, Any]):
    """Register the logged model as a new version of `name`, its tags with it (one write: no version without its
    tags), through the client API (the fluent `registered_model_name=` prints two lines per version on stderr; this
    run prints its own one)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"):
            raise
    return client.create_model_version(name, source=info.model_uri, run_id=info.run_id, model_id=info.model_id,
                                       tags={k: str(v) for k, v in tags.items()})


def _tag(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def serving(p: Params, task: str, null_threshold: float) -> dict[str, Any]:
    """`mlflow.pyfunc.log_model` keywords of the task's pyfunc (`TaskKind.serving`: its columns, configuration and
    input example, here two dev examples): its code, signature, requirements (and, for a reader, the library as its
    code). `null_threshold`: SQuAD v2.0's null-odds threshold the reader answers "" above."""
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, Schema

    from tasks.teacher import load_task

    dev = load_task(task)["dev"]
    kind = task_kind(task, p.data)
    io = kind.serving(p.data, dev.select(range(min(2, len(dev)))), null_threshold)

    def schema(columns) -> Schema:
        return Schema([ColSpec(getattr(DataType, kind_), *([name] if name else [])) for name, kind_ in columns])

    out = {"python_model": str(PYFUNC[kind.pyfunc]), "model_config": io["config"],
           "signature": ModelSignature(inputs=schema(io["inputs"]), outputs=schema(io["outputs"])),
           "pip_requirements": pip_requirements(span=io["ships_library"]), "input_example": pd.DataFrame(io["example"])}
    if io["ships_library"]:
        import distillery

        out["code_paths"] = [str(Path(distillery.__file__).parent)]
    return out


def _number(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def champion_score(p: Params, client, name: str, champion, task: str) -> tuple[float | None, str | None]:
    """(the champion's main dev score on this run's dev data, a note when it had to be measured again). A champion
    registered on other task data (its `inputs.task_data.sha256` tag differs) is evaluated on the current dev split
    (once per data version: tagged `dev.main.data-<data sha>`), so that challenger and champion are compared on the same
    examples."""
    if champion is None:
        return None, None
    tags = champion.tags
    main = _number(tags.get("dev.main"))
    was, now = tags.get("inputs.task_data.sha256"), fingerprint(paths.task_data(task))
    if main is None or was is None or was == now:
        return main, None
    key = f"dev.main.data-{now[:12]}"
    if (again := _number(tags.get(key))) is None:
        import mlflow

        from tasks.teacher import load_task

        local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{champion.version}"))
        kind = task_kind(task, p.data)
        metrics, _ = kind.evaluate(local / "artifacts" / "model", load_task(task), p.for_task(task).data.max_length)
        again = float(kind.main_score(metrics))
        client.set_model_version_tag(name, champion.version, key, str(again))
    return again, (f"the task data changed since the champion (version {champion.version}) was registered: "
                   f"re-evaluated on the new dev split, {again:.4f} (was {main:.4f})")


def served_form(p: Params, student: str, task: str) -> str:
    """The form the registered model runs in: a budgeted student's, the one its search chose (and measured); fp32
    otherwise. A span task's reader and a run without ONNX export serve fp32."""
    found = chosen(student) if p.students[student].budget is not None else None
    form = found["winner"]["form"] if found else "fp32"
    why = ("the task's model serves " + ", ".join(task_kind(task).served_forms)
           if form not in task_kind(task).served_forms else
           "there is no int8 export (evaluation.export_onnx is off)" if form == "int8" and not _int8(student, task).is_file()
           else None)
    if why:
        say(f"register {student}-{task}: served in fp32, not the search's {form}: {why}")
        return "fp32"
    return form


def _int8(student: str, task: str) -> Path:
    return paths.export(student, task) / "model.int8.onnx"


def run_register(p: Params, item: str) -> dict[str, Any]:
    tracking.require("the register stage")
    import mlflow
    from mlflow.exceptions import MlflowException

    student, task = split_item(item)
    model_dir = paths.student(student, task) / "model"
    if (reason := skipped(model_dir)) is not None:  # not distilled (its teacher failed the gate): nothing to register
        raise SkipStage(f"register: {student}-{task} was not distilled: {reason}", reason)
    metrics = version_metrics(p, student, task)
    name = f"{student}-{task}"
    client = mlflow.MlflowClient()
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    model_sha = fingerprint(model_dir)
    if (same := _already_registered(client, name, model_sha, metrics)) is not None:
        # evaluate re-ran (another student, new timings) but this model and its dev scores are unchanged
        why = f"version {same.version} already holds this model with these dev scores: nothing new registered"
        say(f"register {name}: {why}")
        record = json.loads(paths.registry(student, task).read_text()) if paths.registry(student, task).is_file() else {}
        write_json(paths.registry(student, task), {**record, "name": name, "version": int(same.version),
                                                   "reason": why, "metrics": metrics})
        return {"metrics": {"registered_version": int(same.version), "promoted": 0}}

    form = served_form(p, student, task)
    with tempfile.TemporaryDirectory() as tmp:  # the logged model dir = the student + its model card
        staged = Path(tmp) / "model"
        # served from its int8 ONNX export: the tokenizer and config without the fp32 weights
        shutil.copytree(model_dir, staged, ignore=shutil.ignore_patterns("*.safetensors", "*.bin")
                        if form == "int8" else None)
        (staged / "README.md").write_text(model_card(p, student, task, metrics), encoding="utf-8")
        artifacts = {"model": str(staged), **({"onnx": str(_int8(student, task))} if form == "int8" else {})}
        kwargs = serving(p, task, metrics.get("null_threshold", 0.0))
        kwargs["model_config"] = {**kwargs["model_config"], "form": form}
        if form == "int8":
            import onnxruntime

            kwargs["pip_requirements"] = [*kwargs["pip_requirements"], f"onnxruntime=={onnxruntime.__version__}"]
        info = mlflow.pyfunc.log_model(name="model", artifacts=artifacts, **kwargs)

    inputs = registry_inputs(student, task)
    tags: dict[str, Any] = {"task": task, "student": student, "recipe": p.students[student].recipe, "served_form": form,
                            **{k: _tag(v) for k, v in metrics.items()},
                            "params_sha256": params_hash(p),
                            **{f"inputs.{k}.sha256": model_sha if k == "model" else fingerprint(v)
                               for k, v in inputs.items()},
                            **{f"inputs.{k}.dvc_md5": v for k, v in dvc_md5s(inputs).items()}}
    if commit := git_commit(paths.ROOT):
        tags["git_commit"] = commit
    champion_main, note = champion_score(p, client, name, champion, task)
    promote, why = promotion(metrics["dev.main"], champion_main, None if champion is None else champion.version,
                             p.registry.promote_margin, metrics.get("direct.dev.main"))
    if note:
        why = f"{note}; {why}"
    tags.update({"promoted": str(promote).lower(), "promotion": why})
    version = str(_new_version(client, name, info, tags).version)
    client.set_registered_model_alias(name, CANDIDATE, version)
    if promote:
        client.set_registered_model_alias(name, CHAMPION, version)
    client.update_model_version(name, version, description=f"{student} on {task}: dev main {metrics['dev.main']:.4f}"
                                + (f", retention {metrics['retention']:.3f}" if "retention" in metrics else "") + f". {why}")
    if mlflow.active_run():
        mlflow.set_tags({"registered_version": version, "promotion": why})
    say(f"register {name} version {version}: {why}")

    champion_version = version if promote else (champion.version if champion is not None else None)
    alias = CHAMPION if promote else CANDIDATE
    if promote:
        held = {"version": int(version), **{k: metrics.get(k) for k in ("dev.main", "latency_ms_b1")}}
    elif champion is not None:
        held = {"version": int(champion.version), "dev.main": champion_main,
                "latency_ms_b1": _number(champion.tags.get("latency_ms_b1"))}
    else:
        held = None
    record = {"name": name, "version": int(version), "alias": alias,
              "aliases": [CANDIDATE, CHAMPION] if promote else [CANDIDATE],
              "uri": f"models:/{name}@{alias}", "version_uri": f"models:/{name}/{version}",
              "promoted": promote, "reason": why, "champion": held,
              "champion_version": None if champion_version is None else int(champion_version),
              "champion_uri": f"models:/{name}@{CHAMPION}", "metrics": metrics,
              "run_id": mlflow.active_run().info.run_id if mlflow.active_run() else None}
    write_json(paths.registry(student, task), record)
    return {"metrics": {"registered_version": int(version), "promoted": int(promote)}}


REGISTER = Stage(
    "register", run_register, device="shared",  # MLflow loads the pyfunc and predicts its input example
    deps=lambda p, item: [paths.student(*split_item(item)) / "model", paths.evaluation(split_item(item)[1]),
                          *search_deps(p, split_item(item)[0])],
    outs=lambda p, item: [paths.registry(*split_item(item))],
    params=lambda p, item: {"registry": p.registry.model_dump(mode="json", exclude={"enabled"})},
    code=("tasks/register.py", "tasks/pyfunc_classifier.py", "tasks/pyfunc_reader.py", "tasks/search.py"),
)
