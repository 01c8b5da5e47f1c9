"""The TinyBERT ablations (Jiao et al. 2020, Tables 2-3) as one command:

    python -m flows.ablation [--params params.yaml | --preset local] [--student NAME]

Each variant is a copy of one TinyBERT student with one recipe switch changed: without general distillation
(`general_distillation: false`, only where the student has it), without data augmentation
(`augmentation: false`), without task-distillation step 1 (`intermediate_step: false`) and without the
attention loss (`attention_loss: 0`). The variants join the params as students named `<student>-<variant>`
(written to reports/ablation/params.yaml) and go through the same cached pipeline: the teacher,
augmentation and the full student are cache hits; only the variants train. The evaluation and report of
that run cover the variants too. Written: reports/ablation.md, reports/ablation.png (logged to MLflow).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tasks import env  # (before prefect)

import yaml

from distillery.config import ConfigError, Params
from distillery.preflight import load_params
from distillery.errors import debug_requested, run_main
from distillery.io import atomic_path, write_text
from flows.pipeline import add_params_options, params_path, pipeline
from tasks import paths, tracking

def variants(p: Params, student: str) -> dict[str, Any]:
    """`<student>-<variant>` -> recipe: the ablations the student's recipe defines (`Recipe.ablations`)."""
    return {f"{student}-{name}": recipe for name, (_, recipe) in p.students[student].ablations().items()}


def ablation_params(p: Params, student: str) -> dict[str, Any]:
    """The params of the ablation run: the base student and its variants; no direct baselines, export,
    latency or registry (the variants are compared on dev scores)."""
    data = p.model_dump(mode="json", exclude_none=True)
    data["students"] = {student: data["students"][student],
                        **{n: r.model_dump(mode="json", exclude_none=True) for n, r in variants(p, student).items()}}
    data["evaluation"] = {**data["evaluation"], "baselines": False, "latency": False, "export_onnx": False}
    data["registry"] = {"enabled": False}
    return data


def _default_student(p: Params, params_file: str) -> str:
    for name, recipe in p.students.items():
        if recipe.ablations():
            return name
    raise ConfigError(f"{params_file}: students: no student's recipe defines ablations (TinyBERT's do)")


def table(p: Params, student: str, summary: dict[str, Any]) -> tuple[list[str], list[tuple[str, str, list[float | None]]]]:
    """(tasks, rows): one row per variant (the full student first) with its main dev score per task."""
    from distillery.report import task_score

    tasks = list(p.data.tasks)
    rows = []
    labels = {f"{student}-{n}": label for n, (label, _) in p.students[student].ablations().items()}
    for name in [student, *variants(p, student)]:
        label = "full" if name == student else labels[name]
        rows.append((name, label, [task_score(t, summary[t][name]) for t in tasks]))
    return tasks, rows


def render(tasks: list[str], rows: list[tuple[str, str, list[float | None]]]) -> str:
    full = rows[0][2]
    head = ["Variant", "Student"] + [t.upper() for t in tasks] + ["Avg", "Δ Avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(tasks) + 2)) + "|"]
    full_avg = _avg(full)
    for name, label, scores in rows:
        avg = _avg(scores)
        delta = "-" if avg is None or full_avg is None or name == rows[0][0] else f"{100 * (avg - full_avg):+.1f}"
        cells = [f"{100 * s:.1f}" if s is not None else "-" for s in scores]
        lines.append("| " + " | ".join([label, name, *cells, "-" if avg is None else f"{100 * avg:.1f}", delta]) + " |")
    return ("Ablations of the TinyBERT procedure (Jiao et al. 2020, Tables 2-3): dev main scores (x100) of the student "
            "with one part removed; Δ Avg against the full student.\n\n" + "\n".join(lines) + "\n")


def _avg(scores: list[float | None]) -> float | None:
    known = [s for s in scores if s is not None]
    return sum(known) / len(known) if known else None


def plot(tasks: list[str], rows: list[tuple[str, str, list[float | None]]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(tasks) * len(rows) / 3, 3.6))
    width = 0.8 / len(rows)
    for i, (_, label, scores) in enumerate(rows):
        xs = [t + i * width for t in range(len(tasks))]
        ax.bar(xs, [100 * (s or 0) for s in scores], width, label=label)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], [t.upper() for t in tasks])
    ax.set_ylabel("dev main score (x100)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def run(params_file: str, student: str | None = None) -> Path:
    p = load_params(params_file)
    student = student or _default_student(p, params_file)
    if student not in p.students:
        raise ConfigError(f"{params_file}: students: no student {student!r}; students: {sorted(p.students)}")
    if not p.students[student].ablations():
        raise ConfigError(f"{params_file}: students.{student}: its recipe {p.students[student].recipe!r} defines no "
                          "ablations (TinyBERT's do)")
    ablation_file = paths.REPORTS / "ablation" / "params.yaml"
    write_text(ablation_file, yaml.safe_dump(ablation_params(p, student), sort_keys=False))
    ablated = load_params(ablation_file)
    result = pipeline(str(ablation_file))
    if result.get("stopped"):
        raise SystemExit(2)
    tasks, rows = table(ablated, student, json.loads(paths.summary().read_text()))
    md = write_text(paths.REPORTS / "ablation.md", render(tasks, rows))
    png = plot(tasks, rows, paths.REPORTS / "ablation.png")
    import mlflow

    with tracking.run("ablation", params={"student": student, "params_file": params_file}):
        mlflow.log_artifact(str(md))
        mlflow.log_artifact(str(png))
        mlflow.log_metrics({f"{name}.{t}": s for name, _, scores in rows for t, s in zip(tasks, scores) if s is not None})
    print(f"ablation table: {md}")
    return md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.ablation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_params_options(parser)
    parser.add_argument("--student", help="the TinyBERT student to ablate (default: the first)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)

    def go() -> int:
        path = params_path(args.params, args.preset)
        load_params(path, inputs=True, root=env.ROOT)  # every input checked before any work
        run(path, args.student)
        return 0

    return run_main(go, debug=args.debug or debug_requested([]))


if __name__ == "__main__":
    sys.exit(main())
