"""Where every stage reads and writes (relative to the project root; `dvc.yaml` uses the same paths)."""

from __future__ import annotations

from pathlib import Path

from tasks.env import ROOT

DATA, MODELS, METRICS, REPORTS = ROOT / "data", ROOT / "models", ROOT / "metrics", ROOT / "reports"


def raw_task(task: str) -> Path:
    return DATA / "raw" / task


def task_data(task: str) -> Path:
    return DATA / "tasks" / task


def trivial(task: str) -> Path:
    """The prepared task's trivial baseline on dev (its metrics), written with the task by `prepare_task`."""
    return task_data(task) / "trivial.json"


def raw_corpus() -> Path:
    return DATA / "corpus" / "raw.txt"


def corpus() -> Path:
    return DATA / "corpus" / "sentences.txt"


def word_vectors_dir() -> Path:
    return DATA / "word_vectors"


def word_vectors() -> Path:
    return word_vectors_dir() / "vectors.txt"


def teacher_mlm() -> Path:
    return MODELS / "teacher-mlm"


def teacher(task: str) -> Path:
    return MODELS / "teacher" / task


def teacher_metrics(task: str) -> Path:
    """The fine-tuned teacher's dev metrics (``eval_``-prefixed, as the Trainer writes them)."""
    return teacher(task) / "model" / "metrics.json"


def augmented(task: str) -> Path:
    return DATA / "augmented" / f"{task}.tsv"


def student_stage(folder: str, student: str) -> Path:
    """Where a student-level stage of a recipe writes for one student (`models/<folder>/<student>`; the folder is
    the recipe's declaration, `Recipe.STUDENT_STAGES`)."""
    return MODELS / folder / student


def search(student: str) -> Path:
    """A budgeted student's shape search: search.json (every candidate, the winner) and pareto.png."""
    return MODELS / "search" / student


def student(student: str, task: str) -> Path:
    return MODELS / "students" / f"{student}-{task}"


#: beside a task stage's model (a student's or its direct baseline's): the training rows of each kind it read
ROWS = "rows.json"


def baseline(student: str, task: str) -> Path:
    """The student's architecture and initialisation trained on the task's gold labels, without a teacher."""
    return MODELS / "baseline" / f"{student}-{task}"


def export(student: str, task: str) -> Path:
    return MODELS / "export" / task / student


def evaluation(task: str) -> Path:
    return METRICS / "eval" / f"{task}.json"


def curves(name: str) -> Path:
    return METRICS / "curves" / f"{name}.csv"


def untracked(name: str) -> Path:
    """What a stage logged (its flat metrics) when it ran with tracking off (`tasks.tracking`)."""
    return METRICS / "untracked" / f"{name}.json"


def registry(student: str, task: str) -> Path:
    return METRICS / "registry" / f"{student}-{task}.json"


def summary() -> Path:
    return METRICS / "summary.json"


def predictions(task: str) -> Path:
    """Test-set predictions of every model for one task, in the GLUE server's format (one dir per model)."""
    return DATA / "predictions" / task


def answers_dir(task: str) -> Path:
    """A span task's dev answers, one directory per model."""
    return METRICS / "answers" / task


def answers(task: str, model: str) -> Path:
    """A span task's dev answers of one model, in the official SQuAD format ({question id: answer text})."""
    return answers_dir(task) / model / "predictions.json"


def submission() -> Path:
    """One zip per model with its predictions for every task, ready to upload."""
    return REPORTS / "submission"
