"""Evaluation, summary/report and registration stages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.data import extra_split
from tasks.stage import Stage
from tasks.teacher import load_task

from distillery.config import Params
from distillery.io import write_json


def evaluated_models(p: Params, task: str) -> dict[str, Path]:
    """name -> model dir: the fine-tuned teacher and every student distilled for this task."""
    models = {"teacher": paths.teacher(task) / "model"}
    models.update({name: paths.student(name, task) / "model" for name in p.students})
    return models


def run_evaluate(p: Params, task: str) -> dict[str, Any]:
    from datasets import DatasetDict
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from distillery import glue
    from distillery.efficiency import flops_per_example, parameter_counts
    from distillery.evaluation import evaluate_model

    data = load_task(task)
    spec = glue.get_task(task)
    results: dict[str, dict[str, Any]] = {}
    for name, model_dir in evaluated_models(p, task).items():
        metrics, test_predictions = evaluate_model(model_dir, task, data, max_length=p.data.max_length)
        model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
        counts = parameter_counts(model)
        results[name] = {
            "params": counts["total"],
            "non_embedding_params": counts["non_embedding"],
            "flops": flops_per_example(AutoConfig.from_pretrained(str(model_dir)), p.evaluation.latency_seq_len),
            **metrics,
            "main": glue.main_score(task, metrics),
        }
        if test_predictions is not None and spec.submission_file:
            glue.write_submission(task, test_predictions, paths.submission() / name, indices=data["test"]["idx"][:])
        for extra in glue.tasks_evaluated_with(task)[1:]:  # MNLI-mm and AX from the MNLI model
            extra_data = DatasetDict({s: data[extra_split(extra, s)] for s in ("dev", "test")
                                      if extra_split(extra, s) in data})
            extra_metrics, extra_test = evaluate_model(model_dir, extra, extra_data, max_length=p.data.max_length)
            results[name].update({f"{extra}.{k}": v for k, v in extra_metrics.items()})
            if extra_test is not None:
                glue.write_submission(extra, extra_test, paths.submission() / name,
                                      indices=extra_data["test"]["idx"][:])
    if p.evaluation.latency:
        results = _add_latency(p, task, results)
    write_json(paths.evaluation(task), results)
    return {"metrics": {f"{m}.{k}": v for m, r in results.items() for k, v in r.items() if isinstance(v, (int, float))}}


def _add_latency(p: Params, task: str, results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    from transformers import AutoModelForSequenceClassification

    from distillery.efficiency import measure_latency

    models = {name: AutoModelForSequenceClassification.from_pretrained(str(d)).eval()
              for name, d in evaluated_models(p, task).items()}
    for batch in p.evaluation.latency_batch_sizes:
        table = measure_latency(models, batch_size=batch, seq_len=p.evaluation.latency_seq_len, reference="teacher")
        for name, row in table.items():
            results[name][f"latency_ms_b{batch}"] = row["median_ms"]
            results[name][f"speedup_b{batch}"] = row["speedup"]
    return results


def run_report(p: Params, _: str | None) -> dict[str, Any]:
    from distillery.report import write_report

    summary = _summary(p)
    write_json(paths.summary(), summary)
    curves = {f.stem: f for f in sorted((paths.METRICS / "curves").glob("*.csv"))}
    written = write_report(summary, paths.REPORTS, loss_curves=curves)
    if any((paths.submission() / m).is_dir() for m in _models(p)):
        from distillery import glue

        for model in _models(p):
            if (paths.submission() / model).is_dir():
                glue.zip_submission(paths.submission() / model, paths.submission() / f"{model}.zip")
    return {"artifacts": [str(w) for w in written] + [str(paths.summary())]}


def _models(p: Params) -> list[str]:
    return ["teacher", *p.students]


def _summary(p: Params) -> dict[str, Any]:
    """metrics/summary.json: task -> model -> {"params", GLUE metrics..., "retention" (students)}."""
    summary: dict[str, Any] = {}
    for task in p.data.tasks:
        results = json.loads(paths.evaluation(task).read_text())
        teacher_main = results["teacher"]["main"]
        summary[task] = {}
        for name, r in results.items():
            entry = {k: v for k, v in r.items() if k != "main"}
            if name != "teacher":
                entry["retention"] = r["main"] / teacher_main if teacher_main else float("nan")
            summary[task][name] = entry
    return summary


EVALUATE = Stage(
    "evaluate", run_evaluate,
    deps=lambda p, t: [paths.task_data(t), *evaluated_models(p, t).values()],
    outs=lambda p, t: [paths.evaluation(t)],
    params=lambda p, t: {"max_length": p.data.max_length, "evaluation": p.evaluation.model_dump(mode="json")},
)
REPORT = Stage(
    "report", run_report,
    deps=lambda p, _: [paths.evaluation(t) for t in p.data.tasks],
    outs=lambda p, _: [paths.summary(), paths.REPORTS / "table.md"],
    params=lambda p, _: {"tasks": p.data.tasks, "students": sorted(p.students)},
)
