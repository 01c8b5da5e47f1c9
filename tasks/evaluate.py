"""Evaluation, summary/report and registration stages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.distill import search_deps
from tasks.stage import Stage, skipped, write_skipped
from tasks.teacher import encoding, gate_failure, load_task, trivial_baseline

from distillery.config import Params
from distillery.io import write_json
from distillery.report import retention
from distillery.task_kinds import extra_split, task_kind


def evaluated_models(p: Params, task: str) -> dict[str, Path]:
    """name -> model dir: the fine-tuned teacher and every student distilled for this task (the stage's inputs: a
    student skipped for a teacher that failed the gate is a skip record, see `present`)."""
    models = {"teacher": paths.teacher(task) / "model"}
    models.update({name: paths.student(name, task) / "model" for name in p.students})
    return models


def runnable(model_dir: Path) -> bool:
    """Whether a model directory holds a model (a teacher known by its predictions holds none)."""
    from distillery.teacher_predictions import is_predicted

    return not is_predicted(model_dir)


def _predicted_rows(p: Params, task: str, model_dir: Path) -> dict[str, dict[str, Any]]:
    """The rows of a teacher known by predictions (`distillery.teacher_predictions`): its dev metrics as the teacher
    stage computed them and where they came from; an ensemble's members' rows too (``member_of``: teacher)."""
    from distillery.teacher_predictions import MEMBERS

    kind = task_kind(task, p.data)
    metrics = {k.removeprefix("eval_"): v for k, v in json.loads((model_dir / "metrics.json").read_text()).items()}
    given = p.teacher.predictions.get(task)
    rows = {"teacher": {**metrics, "main": kind.main_score(metrics),
                        "predictions": given.source if given is not None else "ensemble"}}
    if (model_dir / MEMBERS).is_file():
        for name, row in json.loads((model_dir / MEMBERS).read_text()).items():
            scores = {k: v for k, v in row.items() if k not in ("weight", "source")}
            rows[name] = {**row, "main": kind.main_score(scores), "member_of": "teacher"}
    return rows


def present(models: dict[str, Path]) -> dict[str, Path]:
    """The models that were trained: skip records (tasks.stage.write_skipped) left out."""
    return {name: d for name, d in models.items() if skipped(d) is None}


def baselines(p: Params, task: str) -> dict[str, Path]:
    """row name -> model dir of each student's direct baseline (`<student>-direct`), when they are trained."""
    if not p.evaluation.baselines:
        return {}
    return {f"{name}-direct": paths.baseline(name, task) / "model" for name in p.students}


def run_evaluate(p: Params, task: str) -> dict[str, Any]:
    from datasets import DatasetDict
    from transformers import AutoConfig

    from distillery import glue, precision
    from distillery.efficiency import flops_if_counted, parameter_counts
    from distillery.models import load_model

    data = load_task(task)
    kind = task_kind(task, p.data)
    failure = gate_failure(p, task)  # not distilled: every model's submission files get the trivial predictions

    def evaluate(name: str, model_dir: Path, form: str = "fp32"):
        """Dev metrics (and test logits) of the model's fp32 forward, or of its bf16 autocast forward (`form`)."""
        with precision.use(form):  # a span task writes its dev answers (metrics/answers/<task>/<model>/)
            return kind.evaluate(model_dir, data, p.data.max_length,
                                 paths.answers(task, name) if form == "fp32" else None)

    results: dict[str, dict[str, Any]] = {}
    for name, model_dir in present(evaluated_models(p, task)).items():
        if not runnable(model_dir):  # a teacher known by predictions: its dev score is theirs; an ensemble's members
            results.update(_predicted_rows(p, task, model_dir))
            continue
        metrics, test_logits = evaluate(name, model_dir)
        counts = parameter_counts(load_model(model_dir, head=kind.head))
        results[name] = {
            "params": counts["total"],
            "non_embedding_params": counts["non_embedding"],
            "flops": flops_if_counted(AutoConfig.from_pretrained(str(model_dir)), p.evaluation.latency_seq_len),
            **metrics,
            "main": kind.main_score(metrics),
        }
        if test_logits is not None and failure is None:
            glue.write_submission(task, test_logits, paths.predictions(task) / name, indices=data["test"]["idx"][:])
        for extra in kind.extra_tasks():  # MNLI-mm and AX from the MNLI model
            extra_data = DatasetDict({s: data[extra_split(extra, s)] for s in ("dev", "test")
                                      if extra_split(extra, s) in data})
            extra_metrics, extra_test = task_kind(extra).evaluate(model_dir, extra_data, p.data.max_length)
            results[name].update({f"{extra}.{k}": v for k, v in extra_metrics.items()})
            if extra_test is not None and failure is None:
                glue.write_submission(extra, extra_test, paths.predictions(task) / name,
                                      indices=extra_data["test"]["idx"][:])
    for (name, model_dir), student in zip(baselines(p, task).items(), p.students):
        if skipped(model_dir) is not None:
            continue
        metrics, _ = evaluate(name, model_dir)
        params = (results[student]["params"] if student in results else
                  parameter_counts(load_model(model_dir, head=kind.head))["total"])
        results[name] = {"params": params, **metrics, "main": kind.main_score(metrics), "baseline_of": student}
    results["trivial"] = {**trivial_baseline(task), "baseline_of": "teacher"}
    results["teacher"]["passed_gate"] = failure is None
    if failure is not None:
        results["teacher"]["gate"] = str(failure)
        if kind.submits_test_predictions:
            _trivial_submission(p, task, data)
    if bf16_served(p):  # each student served in bf16 (PyTorch autocast): its dev score beside the fp32 one
        for name in [s for s in p.students if s in results]:
            metrics, _ = evaluate(name, paths.student(name, task) / "model", "bf16")
            results[name].update({**{f"bf16_{k}": v for k, v in metrics.items()},
                                  "bf16_main_change": kind.main_score(metrics) - results[name]["main"]})
    sessions = {}
    if p.evaluation.export_onnx:
        for name in p.students:
            if name in results:
                sessions[f"{name}-int8"] = _export(p, task, name, data, results[name])
            else:  # not distilled: the stage's declared output says why
                write_skipped([paths.export(name, task)], skipped(paths.student(name, task) / "model") or "skipped")
    if p.evaluation.latency:
        results = _add_latency(p, task, results, sessions)
    write_json(paths.evaluation(task), results)
    predictions_dir(task).mkdir(parents=True, exist_ok=True)  # a declared output, empty for a task without test split
    return {"metrics": {f"{m}.{k}": v for m, r in results.items() for k, v in r.items() if isinstance(v, (int, float))}}


def bf16_served(p: Params) -> bool:
    """Whether the evaluate stage measures a bf16 form of each student: where the run's precision is bf16 here (part
    of the stage's key; `precision: fp32` is fp32 everywhere)."""
    from distillery.precision import resolve

    return resolve(p.precision) == "bf16"


def _trivial_submission(p: Params, task: str, data) -> None:
    """A task whose teacher failed the gate: every model's submission files hold the trivial baseline's predictions
    (majority class of the training labels, or their mean score), as the BERT paper submitted for WNLI."""
    from distillery import glue

    train_labels = data["train"]["label"][:]
    for name in glue.tasks_evaluated_with(task):  # MNLI-mm and AX too, from MNLI's training labels
        split = "test" if name == task else extra_split(name, "test")
        if split not in data:
            continue
        test = data[split]
        predictions = glue.trivial_predictions(task, train_labels, len(test))
        for model in _models(p):
            glue.write_submission(name, predictions, paths.predictions(task) / model, indices=test["idx"][:])


def _export(p: Params, task: str, student: str, data, result: dict[str, Any]):
    """ONNX export (checked against PyTorch) and int8 dynamic quantisation of a student, with the int8
    model's dev metrics next to the fp32 ones; returns the int8 model for timing."""
    from transformers import AutoTokenizer

    from distillery.efficiency import OnnxModel, disk_size_bytes, export_onnx, int8_export, load_model_for_export

    model_dir = paths.student(student, task) / "model"
    out = paths.export(student, task)
    model = load_model_for_export(model_dir)
    exported = export_onnx(model, out / "model.onnx")
    int8_path = out / "model.int8.onnx"
    fused = int8_export(model, out / "model.onnx", int8_path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    int8 = OnnxModel(int8_path, vocab_size=len(tokenizer))
    # the same inputs (a span task: windows, answers, official EM/F1) and metrics as the PyTorch model's row
    kind = task_kind(task, p.data)
    metrics, _ = kind.evaluate(model_dir, data, p.data.max_length, session=int8)
    result.update({
        "onnx_max_abs_diff": exported.max_abs_diff,
        "bytes_fp32_onnx": disk_size_bytes(out / "model.onnx"),
        "bytes_int8_onnx": disk_size_bytes(int8_path),
        "int8_fused_operators": sum(fused.values()),
        **{f"int8_{k}": v for k, v in metrics.items()},
        "int8_main_change": kind.main_score(metrics) - result["main"],
    })
    return int8


def _add_latency(p: Params, task: str, results: dict[str, dict[str, Any]], sessions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Latency, throughput and speedup over the fp32 teacher on CPU (with the int8 ONNX sessions and each student's bf16
    form, where `bf16_served`) and, when a GPU is present, again on it, in paired rounds (`measure_latency`) in a
    process of their own (`distillery.efficiency.apart`): keys
    latency_ms_b<batch>[_int8|_bf16][_cuda], throughput_b..., speedup_b... (the median of the per-round ratios),
    speedup_p10_b..., speedup_p90_b... (their spread) and speedup_ci_low_b..., speedup_ci_high_b... (the median's
    95% interval); `latency_rounds` rounds for a speedup not pinned down after the first ones, up to three times as
    many for one that is unresolved after them (`time_sessions`)."""
    import torch

    from distillery.efficiency.apart import time_apart

    head = task_kind(task).head
    # every timing in a process of its own that loads the models and does nothing else (`time_apart`)
    models = {name: {"torch": str(d), "head": head} for name, d in present(evaluated_models(p, task)).items()
              if runnable(d)}
    reference = "teacher" if "teacher" in models else None  # a teacher known by its predictions: no speedups
    bf16 = {f"{name}-bf16": models[name] for name in p.students if name in models} if bf16_served(p) else {}
    int8 = {name: {"onnx": str(s.path), "vocab_size": s.vocab_size} for name, s in sessions.items()}
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        timed = {**models, **bf16, **int8} if device == "cpu" else models
        # the int8 forms in several fresh sessions, as the budget search times them (`time_sessions`)
        tables = time_apart(timed, batches=p.evaluation.latency_batch_sizes, seq_len=p.evaluation.latency_seq_len,
                            reps=p.evaluation.latency_rounds, max_reps=3 * p.evaluation.latency_rounds,
                            reference=reference or next(iter(timed)),
                            device=device, precisions=dict.fromkeys(bf16, "bf16"))
        for batch, table in tables.items():
            for name, row in table.items():
                target, suffix = name, ""
                for form in FORMS:
                    if name.endswith(f"-{form}") and (name in sessions or name in bf16):
                        target, suffix = name[: -len(form) - 1], f"_{form}"
                suffix = f"_b{batch}{suffix}" + ("" if device == "cpu" else f"_{device}")
                results[target].update({
                    f"latency_ms{suffix}": round(row.median_ms, 3), f"throughput{suffix}": round(row.throughput, 1)})
                if reference is not None:
                    results[target].update({
                        f"speedup{suffix}": round(row.speedup, 3), f"speedup_p10{suffix}": round(row.speedup_p10, 3),
                        f"speedup_p90{suffix}": round(row.speedup_p90, 3),
                        **{f"{k}{suffix}": round(v, 3) for k, v in (
                            ("speedup_ci_low", row.speedup_ci_low), ("speedup_ci_high", row.speedup_ci_high))
                           if v is not None}})
    return results


def run_report(p: Params, _: str | None) -> dict[str, Any]:
    from distillery.efficiency.spread import KEYS
    from distillery.report import rows_lines, write_report

    summary = _summary(p)
    write_json(paths.summary(), summary)
    # training curves that logged a loss (a run shorter than `logging_steps` logs only its summary row; a skipped
    # stage's curve is a header alone)
    curves = {f.stem: f for f in sorted((paths.METRICS / "curves").glob("*.csv"))
              if _has_loss(f.read_text(encoding="utf-8"))}
    batch = min(p.evaluation.latency_batch_sizes)
    latency = {m: {"median_ms": r[f"latency_ms_b{batch}"],
                   **{k: r[f"{k}_b{batch}"] for k in KEYS if f"{k}_b{batch}" in r}}
               for task in summary.values() for m, r in task.items() if f"latency_ms_b{batch}" in r}
    from distillery.precision import resolve

    used = resolve(p.precision)
    notes = [f"Training, teacher logits and augmentation ran in {used}"
             + (" (bf16 autocast, weights fp32)" if used == "bf16" else "") + f" (precision: {p.precision});"
             " every row's dev score is its fp32 forward unless the row says otherwise."]
    if p.data.max_eval_examples:
        notes.append(f"Dev scores on a random subset of at most {p.data.max_eval_examples} examples per task "
                     "(data.max_eval_examples), not the full dev split.")
    # one line per task whose teacher failed the gate: not distilled, no retention, trivial submission files
    failed = [f"{summary[t]['teacher']['gate']}. Its submission files hold the trivial baseline's predictions."
              for t in p.data.tasks if not summary[t]["teacher"]["passed_gate"]]
    from tasks.search import budget_lines, budgeted

    written = write_report(summary, paths.REPORTS, loss_curves=curves, latency=latency or None, teacher="teacher",
                           notes=notes, lines=failed + budget_lines(p, summary) + rows_lines(summary))
    for student in budgeted(p):  # the search's plot beside the report's
        if (plot := paths.search(student) / "pareto.png").is_file():
            written.append(Path(shutil.copyfile(plot, paths.REPORTS / f"search-{student}.png")))
    if any(task_kind(t).submits_test_predictions for t in p.data.tasks):  # the GLUE server's files
        written += [z for model in _models(p) if (z := _zip_predictions(p, model)) is not None]
    return {"artifacts": [str(w) for w in written] + [str(paths.summary())]}


def verdict_lines(p: Params) -> list[str]:
    """The run's result in words, one line per task (`distillery.report.verdicts`), from the summary it wrote."""
    from distillery.report import verdicts

    from tasks.search import budget_lines

    if not paths.summary().is_file():
        return []
    summary = json.loads(paths.summary().read_text(encoding="utf-8"))
    return verdicts(summary, list(p.students)) + budget_lines(p, summary)


def _has_loss(csv_text: str) -> bool:
    header, _, rows = csv_text.partition("\n")
    return "loss" in header.split(",") and bool(rows.strip())


def _zip_predictions(p: Params, model: str) -> Path | None:
    """reports/submission/<model>.zip: the model's test predictions for every task, files at the top level (None when
    no task has a test split, e.g. tasks of your own given without `test`)."""
    import tempfile

    from distillery import glue

    files = [f for t in p.data.tasks if task_kind(t).submits_test_predictions
             for f in sorted((paths.predictions(t) / model).glob("*.tsv"))]
    if not files:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            shutil.copyfile(f, Path(tmp) / f.name)
        return glue.zip_submission(tmp, paths.submission() / f"{model}.zip")


def predictions_dir(task: str) -> Path:
    """A task's predictions: GLUE test files for the server; a span task's dev answers in the official format."""
    return paths.predictions(task) if task_kind(task).submits_test_predictions else paths.answers_dir(task)


def _models(p: Params) -> list[str]:
    return ["teacher", *p.students]


def _summary(p: Params) -> dict[str, Any]:
    """metrics/summary.json: task -> model -> {"params", GLUE metrics..., "retention"}. Rows: the teacher, its trivial
    baseline (`trivial`), the students, their int8 exports and their direct baselines (`<s>-direct`, with `baseline_of`;
    each with `train_rows_<kind>`, the rows of each kind it trained on). The teacher's row says whether it passed the
    gate (`passed_gate`, as the evaluate stage recorded it; when not, `gate` holds the one-line reason and the task has
    no student rows: nothing was distilled). Retention (main dev score over the teacher's) is given only when the
    teacher passed the gate (beat the trivial baseline by `teacher_finetune.min_gain_over_trivial`); each student also
    gets `gain_over_direct`, its main score minus its direct baseline's. Under `average`: each model's mean main score
    over the tasks and, when every teacher passed its gate, the students' retention of the teacher's average (and the
    mean of their per-task retentions)."""
    from distillery.report import AVERAGE, averages

    summary: dict[str, Any] = {}
    main: dict[str, dict[str, float]] = {}
    all_passed = True
    for task in p.data.tasks:
        results = json.loads(paths.evaluation(task).read_text())
        teacher_main = results["teacher"]["main"]
        passed = results["teacher"]["passed_gate"]
        all_passed = all_passed and passed
        main[task] = {name: r["main"] for name, r in results.items()}
        summary[task] = {}
        for name, r in results.items():
            entry = {k: v for k, v in r.items() if k != "main"}
            if name not in ("teacher", "trivial") and passed and (kept := retention(r["main"], teacher_main)) is not None:
                entry["retention"] = kept
            if f"{name}-direct" in results:
                entry["gain_over_direct"] = r["main"] - results[f"{name}-direct"]["main"]
            entry.update(_rows(p, name, task))
            summary[task][name] = entry
            for form in FORMS:  # the student's int8 ONNX export and its bf16 form, each a row of its own
                if f"{form}_main_change" in r:
                    summary[task][f"{name}-{form}"] = _form_entry(r, form, teacher_main if passed else None)
    average = averages(main, "teacher")
    # no retention for a teacher that failed its gate, nor for the trivial baseline (as in the per-task rows)
    average = {m: {k: v for k, v in r.items() if "retention" not in k} if m == "trivial" or not all_passed else r
               for m, r in average.items()}
    if len(p.data.tasks) > 1:
        summary[AVERAGE] = average
    return summary


def _rows(p: Params, name: str, task: str) -> dict[str, int]:
    """The training rows of each kind a student (or its direct baseline) read, from its task stage's rows.json."""
    student = name.removesuffix("-direct")
    if student not in p.students:
        return {}
    path = (paths.baseline if name.endswith("-direct") else paths.student)(student, task) / paths.ROWS
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


#: a student's served forms beside its fp32 row: the int8 ONNX export (ONNX Runtime) and bf16 autocast (PyTorch)
FORMS = ("int8", "bf16")


def _form_entry(r: dict[str, Any], form: str, teacher_main: float | None) -> dict[str, Any]:
    """A served form's metrics (<form>_<metric>) and timings (<timing>_<form>) under the plain names."""
    entry = {k: r[k] for k in ("params", "flops") if k in r}
    entry.update({k[len(form) + 1:]: v for k, v in r.items()
                  if k.startswith(f"{form}_") and k != f"{form}_main_change"})
    entry.update({k[: -len(form) - 1]: v for k, v in r.items() if k.endswith(f"_{form}")})
    if f"bytes_{form}_onnx" in r:
        entry["bytes_onnx"] = r[f"bytes_{form}_onnx"]
    main = r["main"] + r[f"{form}_main_change"]
    entry["main_change_vs_fp32"] = r[f"{form}_main_change"]
    if teacher_main is not None and (kept := retention(main, teacher_main)) is not None:
        entry["retention"] = kept
    return entry


EVALUATE = Stage(
    "evaluate", run_evaluate, device="exclusive",
    deps=lambda p, t: [paths.task_data(t), *evaluated_models(p, t).values(), *baselines(p, t).values()],
    outs=lambda p, t: [paths.evaluation(t), predictions_dir(t)]
    + ([paths.export(s, t) for s in p.students] if p.evaluation.export_onnx else []),
    params=lambda p, t: {**encoding(p, t), "evaluation": p.evaluation.model_dump(mode="json"),
                         "min_gain_over_trivial": p.teacher_finetune.min_gain_over_trivial},
    code=("distillery/evaluation.py", "distillery/efficiency", "distillery/glue", "distillery/squad",
          "distillery/task_kinds.py", "tasks/evaluate.py", "tasks/teacher.py"),
)
REPORT = Stage(
    "report", run_report,
    deps=lambda p, _: [paths.evaluation(t) for t in p.data.tasks] + [predictions_dir(t) for t in p.data.tasks]
    + [d for s in p.students for d in search_deps(p, s)],
    outs=lambda p, _: [paths.summary(), paths.REPORTS / "table.md"],
    params=lambda p, _: {"tasks": p.data.tasks, "students": sorted(p.students), "baselines": p.evaluation.baselines,
                         "precision": p.precision,
                         "max_eval_examples": p.data.max_eval_examples,
                         "min_gain_over_trivial": {t: p.for_task(t).teacher_finetune.min_gain_over_trivial
                                                   for t in p.data.tasks}},
    code=("distillery/report.py", "tasks/evaluate.py", "tasks/search.py"),
)
