"""A task as a plan's steps read it (`distillery.training.plan`): the fine-tuned teacher, its tokenizer, the label
settings, and the training and dev sets, opened from the paths the pipeline gives (`TaskFiles`, `open_task`).

Training sets: the gold rows; with the augmented set, the augmented file (the first ``covered`` training examples and
their variants) plus the training examples it left out, so that distillation never sees fewer of the task's examples
than fine-tuning does; with unlabelled rows, those after the others (the teacher labels them; their gold label is the
unlabelled marker, which a gold-label loss skips).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

@dataclass(frozen=True)
class TaskFiles:
    """What the pipeline hands the executor: paths and values, nothing callable.

    ``prepared``: the prepared task (`datasets.load_from_disk`); ``teacher``: its fine-tuned teacher's directory;
    ``augmented``: the augmented set's file (None: this task is not augmented), covering the first ``covered`` training
    rows; ``unlabeled``: the prepared task holds unlabelled rows (`distillery.unlabeled`); ``general``: the
    student's general model (None: it has none); ``pretrained``: the pre-trained teacher;
    ``kind``: the task's `distillery.task_kinds` kind; ``train_examples``: the first N rows of the shuffled training set
    only (the budget search's brief rounds)."""

    task: str
    kind: Any
    prepared: Path
    teacher: Path
    max_length: int
    augmented: Path | None = None
    covered: int | None = None
    unlabeled: bool = False
    general: Path | None = None
    pretrained: str | None = None
    train_examples: int | None = None


@dataclass
class Task:
    """A task as the steps read it: the fine-tuned teacher, its tokenizer, the label settings every student is built
    with, the model head, and the training and dev sets (``sets``: (augmented, unlabeled) -> (train, dev, rows), or
    read from ``files`` on first use). ``train_args``: the task kind's own TrainingArguments (label names, length
    grouping); ``metrics``: (compute_metrics, main_score) of a grid's selection on dev. A teacher known by its
    predictions (`distillery.teacher_predictions`) is no model (``teacher`` None) but ``soft_targets``: row idx ->
    its logits."""

    teacher: Any
    tokenizer: Any
    labels: Mapping[str, Any]
    head: str = "sequence-classification"
    files: TaskFiles | None = None
    sets: dict[tuple[bool, bool], tuple[Any, Any, dict[str, int]]] = field(default_factory=dict)
    train_args: Mapping[str, Any] = field(default_factory=dict)
    metrics: tuple[Any, Any] = (None, None)
    general: Path | None = None
    pretrained: Any = None
    augmented: bool = False
    unlabeled: bool = False
    caches_logits: bool = True
    train_examples: int | None = None
    seed: int = 42
    rows: dict[str, int] = field(default_factory=dict)
    soft_targets: Mapping[int, Any] | None = None

    def data(self, augmented: bool, unlabeled: bool = False) -> tuple[Any, Any]:
        """(train, dev), encoded; the rows of each kind the steps read are counted in ``rows``. ``augmented`` and
        ``unlabeled`` ask for what the task has: none of either, the gold rows."""
        key = (augmented and self.augmented, unlabeled and self.unlabeled)
        if key not in self.sets:
            self.sets[key] = read_sets(self.files, self.tokenizer, *key)
        train, dev, rows = self.sets[key]
        for kind, n in rows.items():  # the most of each kind any step read
            self.rows[kind] = max(self.rows.get(kind, 0), n)
        if self.train_examples is not None:
            train = train.shuffle(seed=self.seed)
            train = train.select(range(min(self.train_examples, len(train))))
        return train, dev

    def load(self, path: Path):
        """A saved student of the task (its head, the task's label settings)."""
        from distillery.models import load_model

        return load_model(path, head=self.head, **self.labels)


def load_prepared(path: Path, *, unlabeled: bool = False):
    """A prepared task (`datasets.load_from_disk`); its unlabelled rows only when asked. Caching is off so that `.map`
    never writes cache files into a stage's output (that would change its fingerprint, and DVC would see a modified
    output)."""
    import datasets

    from distillery.unlabeled import SPLIT

    datasets.disable_caching()
    data = datasets.load_from_disk(str(path))
    if not unlabeled and SPLIT in data:
        del data[SPLIT]
    return data


def open_task(files: TaskFiles, seed: int) -> Task:
    """The task of `files`: its fine-tuned teacher and tokenizer loaded, its sets read on first use."""
    from transformers import AutoTokenizer

    from distillery.models import load_model
    from distillery.teacher_predictions import is_predicted, load_soft_targets

    kind = files.kind
    tokenizer = AutoTokenizer.from_pretrained(str(files.teacher))
    predicted = is_predicted(files.teacher)
    teacher = None if predicted else load_model(files.teacher, head=kind.head)
    task = Task(teacher=teacher, tokenizer=tokenizer, labels=kind.model_kwargs(teacher and teacher.config),
                head=kind.head, files=files, train_args=kind.train_args, general=files.general,
                pretrained=files.pretrained, augmented=files.augmented is not None, unlabeled=files.unlabeled,
                caches_logits=kind.caches_teacher_logits, train_examples=files.train_examples, seed=seed,
                soft_targets=load_soft_targets(files.teacher) if predicted else None)
    task.metrics = kind.training_metrics(lambda: (load_prepared(files.prepared)["dev"], task.data(False)[1]),
                                         tokenizer.pad_token_id)
    return task


def read_sets(files: TaskFiles, tokenizer, augmented: bool, unlabeled: bool) -> tuple[Any, Any, dict[str, int]]:
    """(train, dev, the training rows of each kind: gold, augmented, unlabelled), encoded."""
    from datasets import DatasetDict, concatenate_datasets

    from distillery import glue
    from distillery.unlabeled import SPLIT

    kind = files.kind
    data = load_prepared(files.prepared, unlabeled=unlabeled)
    splits = {"train": data["train"], "dev": data["dev"]}
    if augmented:
        splits["train"] = glue.load_split_file(files.task, files.augmented)
        covered = files.covered or len(data["train"])
        if covered < len(data["train"]):
            splits["rest"] = data["train"].select(range(covered, len(data["train"])))
    if unlabeled and SPLIT in data:
        splits[SPLIT] = data[SPLIT]
    encoded = kind.encode(DatasetDict(splits), tokenizer, files.max_length)
    if SPLIT in encoded and "labels" not in encoded[SPLIT].column_names:  # the encoder drops a split's no-labels
        from distillery.glue.loaders import unlabeled_value

        feature = encoded["train"].features["labels"]
        marker = [unlabeled_value(kind.spec)] * len(encoded[SPLIT])
        encoded[SPLIT] = encoded[SPLIT].add_column("labels", marker).cast_column("labels", feature)
    parts = [encoded[s] for s in ("train", "rest", SPLIT) if s in encoded]
    keep = [c for c in parts[0].column_names if all(c in part.column_names for part in parts)]
    train = concatenate_datasets([part.select_columns(keep) for part in parts]) if len(parts) > 1 else parts[0]
    n_unlabeled = len(encoded[SPLIT]) if SPLIT in encoded else 0
    rows = {"gold": len(data["train"]), "augmented": len(train) - len(data["train"]) - n_unlabeled,
            "unlabeled": n_unlabeled}
    return train, encoded["dev"], rows
