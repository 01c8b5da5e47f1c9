"""The GLUE task registry (Wang et al., 2019, "GLUE: A Multi-Task Benchmark ...", Table 1).

One `TaskSpec` per task says everything the rest of the project needs to know about it: where its
files live in the official GLUE download layout, which columns hold the text and the label, the label
list *and its order*, regression or classification, the metrics, the main metric used for model
selection and the file name the GLUE server expects for test predictions.

Label order follows the official BERT/TinyBERT processors, so label ids agree with checkpoints
fine-tuned by that code: MNLI/AX = ("contradiction", "entailment", "neutral"). The Hugging Face Hub
GLUE dataset (nyu-mll/glue) orders MNLI as entailment/neutral/contradiction and names CoLA/SST-2/
MRPC/QQP/WNLI labels with words; `hub_label_names` lists the Hub's names aligned with `labels`, and
`load_hub` maps Hub label ids into this registry's order *by name*, so both loaders agree.

Main scores (model selection on dev): CoLA MCC; STS-B (Pearson + Spearman) / 2; MRPC and QQP
(F1 + accuracy) / 2 (the official TinyBERT code selects on accuracy: `main_score(..., selection=
"accuracy")`); all others accuracy. MNLI selects on *matched* dev (`selection_task`): the official
TinyBERT code has a bug that selects on mismatched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Callable, Mapping

from distillery.errors import UserError

NLI3 = ("contradiction", "entailment", "neutral")
NLI2 = ("entailment", "not_entailment")
BINARY = ("0", "1")


class UnknownTaskError(UserError, ValueError):
    """A task name that is not in the registry."""


@dataclass(frozen=True)
class TaskSpec:
    """Static description of one GLUE (or demo) task.

    name: registry key, lower-case ("sst2", "mnli-mm").  glue_name: the official spelling ("SST-2").
    dirname: directory under a GLUE data dir.  files: split -> file name inside `dirname`.
    text_columns: header names of the text fields in the local files (1 or 2).
    label_column: header name of the label field (None: the task has no labeled split, e.g. AX).
    labels: label strings in registry order (label id = position); () for regression.
    metrics: metric keys `compute_metrics` returns.  main_metric: "mcc" | "accuracy" |
    "pearson_spearman" (mean of both) | "f1_accuracy" (mean of both).
    noheader_columns: column names of header-less files (CoLA train/dev).
    index_columns: header names that hold the example index (first present wins; else row number).
    submission_file: GLUE server file name (None: demo tasks, not on the server).
    selection_task: the task whose dev score selects checkpoints (MNLI-mm and AX -> "mnli").
    hub_config / hub_splits / hub_text_columns / hub_label_names: the nyu-mll/glue Hub dataset.
    """

    name: str
    glue_name: str
    dirname: str
    files: Mapping[str, str]
    text_columns: tuple[str, ...]
    label_column: str | None
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    main_metric: str
    noheader_columns: tuple[str, ...] | None = None
    index_columns: tuple[str, ...] = ("index", "id")
    submission_file: str | None = None
    selection_task: str = ""
    hub_config: str | None = None
    hub_splits: Mapping[str, str] = field(default_factory=dict)
    hub_text_columns: tuple[str, ...] = ()
    hub_label_names: tuple[str, ...] = ()
    #: the range a regression score is clipped to in prediction files (STS-B: [0, 5]); None: not clipped
    score_range: tuple[float, float] | None = None

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def num_labels(self) -> int:
        """Output size of the classifier head: 1 for regression."""
        return 1 if self.is_regression else len(self.labels)

    @cached_property
    def _label_ids(self) -> dict[str, int]:
        return {label: i for i, label in enumerate(self.labels)}

    @property
    def label2id(self) -> dict[str, int]:
        """{label: id} (a fresh dict: safe to hand to a model config)."""
        return dict(self._label_ids)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels))


def _spec(**kw) -> TaskSpec:
    kw["files"] = MappingProxyType(dict(kw["files"]))
    kw["hub_splits"] = MappingProxyType(dict(kw.get("hub_splits", {})))
    kw.setdefault("selection_task", kw["name"])
    return TaskSpec(**kw)


_STD_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_STD_HUB = {"train": "train", "dev": "validation", "test": "test"}
_PAIR = ("sentence1", "sentence2")

_SPECS = [
    _spec(name="cola", glue_name="CoLA", dirname="CoLA", files=_STD_FILES,
          text_columns=("sentence",), label_column="label", labels=BINARY,
          metrics=("mcc",), main_metric="mcc",
          noheader_columns=("source", "label", "orig_label", "sentence"),
          submission_file="CoLA.tsv", hub_config="cola", hub_splits=_STD_HUB,
          hub_text_columns=("sentence",), hub_label_names=("unacceptable", "acceptable")),
    _spec(name="sst2", glue_name="SST-2", dirname="SST-2",
          files={**_STD_FILES, "test_labeled": "test-labeled.tsv"},
          text_columns=("sentence",), label_column="label", labels=BINARY,
          metrics=("accuracy",), main_metric="accuracy", submission_file="SST-2.tsv",
          hub_config="sst2", hub_splits=_STD_HUB, hub_text_columns=("sentence",),
          hub_label_names=("negative", "positive")),
    _spec(name="mrpc", glue_name="MRPC", dirname="MRPC", files=_STD_FILES,
          text_columns=("#1 String", "#2 String"), label_column="Quality", labels=BINARY,
          metrics=("accuracy", "f1"), main_metric="f1_accuracy", submission_file="MRPC.tsv",
          hub_config="mrpc", hub_splits=_STD_HUB, hub_text_columns=_PAIR,
          hub_label_names=("not_equivalent", "equivalent")),
    _spec(name="stsb", glue_name="STS-B", dirname="STS-B", files=_STD_FILES,
          text_columns=_PAIR, label_column="score", labels=(),
          metrics=("pearson", "spearman"), main_metric="pearson_spearman",
          submission_file="STS-B.tsv", hub_config="stsb", hub_splits=_STD_HUB,
          hub_text_columns=_PAIR, score_range=(0.0, 5.0)),
    _spec(name="qqp", glue_name="QQP", dirname="QQP", files=_STD_FILES,
          text_columns=("question1", "question2"), label_column="is_duplicate", labels=BINARY,
          metrics=("accuracy", "f1"), main_metric="f1_accuracy", submission_file="QQP.tsv",
          hub_config="qqp", hub_splits=_STD_HUB, hub_text_columns=("question1", "question2"),
          hub_label_names=("not_duplicate", "duplicate")),
    _spec(name="mnli", glue_name="MNLI-m", dirname="MNLI",
          files={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"},
          text_columns=_PAIR, label_column="gold_label", labels=NLI3,
          metrics=("accuracy",), main_metric="accuracy", submission_file="MNLI-m.tsv",
          hub_config="mnli",
          hub_splits={"train": "train", "dev": "validation_matched", "test": "test_matched"},
          hub_text_columns=("premise", "hypothesis"), hub_label_names=NLI3),
    _spec(name="mnli-mm", glue_name="MNLI-mm", dirname="MNLI",
          files={"dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
          text_columns=_PAIR, label_column="gold_label", labels=NLI3,
          metrics=("accuracy",), main_metric="accuracy", submission_file="MNLI-mm.tsv",
          selection_task="mnli", hub_config="mnli_mismatched",
          hub_splits={"dev": "validation", "test": "test"},
          hub_text_columns=("premise", "hypothesis"), hub_label_names=NLI3),
    _spec(name="qnli", glue_name="QNLI", dirname="QNLI", files=_STD_FILES,
          text_columns=("question", "sentence"), label_column="label", labels=NLI2,
          metrics=("accuracy",), main_metric="accuracy", submission_file="QNLI.tsv",
          hub_config="qnli", hub_splits=_STD_HUB, hub_text_columns=("question", "sentence"),
          hub_label_names=NLI2),
    _spec(name="rte", glue_name="RTE", dirname="RTE", files=_STD_FILES,
          text_columns=_PAIR, label_column="label", labels=NLI2,
          metrics=("accuracy",), main_metric="accuracy", submission_file="RTE.tsv",
          hub_config="rte", hub_splits=_STD_HUB, hub_text_columns=_PAIR, hub_label_names=NLI2),
    _spec(name="wnli", glue_name="WNLI", dirname="WNLI", files=_STD_FILES,
          text_columns=_PAIR, label_column="label", labels=BINARY,
          metrics=("accuracy",), main_metric="accuracy", submission_file="WNLI.tsv",
          hub_config="wnli", hub_splits=_STD_HUB, hub_text_columns=_PAIR,
          hub_label_names=("not_entailment", "entailment")),
    _spec(name="ax", glue_name="AX", dirname="diagnostic", files={"test": "diagnostic.tsv"},
          text_columns=_PAIR, label_column=None, labels=NLI3,
          metrics=("accuracy",), main_metric="accuracy", submission_file="AX.tsv",
          selection_task="mnli", hub_config="ax", hub_splits={"test": "test"},
          hub_text_columns=("premise", "hypothesis"), hub_label_names=NLI3),
    # The project's generated tasks (distillery.demo), written in the SST-2 / RTE-like layouts.
    _spec(name="demo", glue_name="demo", dirname="demo", files=_STD_FILES,
          text_columns=("sentence",), label_column="label", labels=BINARY,
          metrics=("accuracy",), main_metric="accuracy"),
    _spec(name="demo-pair", glue_name="demo-pair", dirname="demo-pair", files=_STD_FILES,
          text_columns=_PAIR, label_column="label", labels=BINARY,
          metrics=("accuracy", "f1"), main_metric="f1_accuracy"),
]

TASKS: Mapping[str, TaskSpec] = MappingProxyType({s.name: s for s in _SPECS})

# The tasks of the GLUE benchmark proper, in the order of the GLUE paper's tables.
GLUE_TASKS: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte",
                               "wnli", "ax")

_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli_matched": "mnli",
            "mnli_mismatched": "mnli-mm", "mnli-mismatched": "mnli-mm", "diagnostic": "ax",
            "demo_pair": "demo-pair"}


#: tasks of the user's own (``data.custom`` in params, `distillery.custom_tasks`): name -> its spec, or a function
#: that makes it on first use (its labels may have to be read from the training split)
_CUSTOM: dict[str, TaskSpec | Callable[[], TaskSpec]] = {}


def register_task(name: str, spec: TaskSpec | Callable[[], TaskSpec]) -> None:
    """Make `name` a task of the registry: a `TaskSpec`, or a function returning it (called once, when the task is
    first asked for). A registry task's name cannot be taken."""
    if name in TASKS or name in _ALIASES:
        raise ValueError(f"task {name!r} is a registry task; give your own task another name")
    _CUSTOM[name] = spec


def get_task(name: str | TaskSpec) -> TaskSpec:
    """The spec of task `name` (case-insensitive; official spellings like "SST-2" accepted), or of a task registered
    with `register_task`."""
    if isinstance(name, TaskSpec):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key in TASKS:
        return TASKS[key]
    if key in _CUSTOM:
        if not isinstance(spec := _CUSTOM[key], TaskSpec):
            spec = _CUSTOM[key] = spec()
        return spec
    known = [*TASKS, *_CUSTOM]
    raise UnknownTaskError(f"unknown task {name!r}; known tasks: {', '.join(known)}") from None


def tasks_evaluated_with(task: str | TaskSpec) -> tuple[str, ...]:
    """Tasks predicted by the model trained and selected for `task`: ("mnli", "mnli-mm", "ax") for MNLI.

    MNLI-mm and AX have no training data of their own; their dev/test predictions come from the MNLI
    model (selected on matched dev), as the GLUE server expects.
    """
    spec = get_task(task)
    if spec.name not in TASKS:
        return (spec.name,)
    return tuple(name for name, other in TASKS.items() if other.selection_task == spec.selection_task)
