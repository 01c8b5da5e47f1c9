"""Typed pipeline configuration: the schema `params.yaml` is validated against before any work (its checks against
files, the Hub and the teacher: `distillery.preflight`).

One section per pipeline stage. Unknown keys, wrong types and impossible values stop the run with a
message naming the file and the dotted key (e.g. ``params.yaml: task_distillation.prediction.learning_rates: ...``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, ValidationInfo, field_validator, model_validator

from distillery.errors import UserError
from distillery.recipes import (
    INIT_KINDS,
    RECIPE_NAMES,
    Section,
    Shape,
    StudentRecipe,
    recipe_from_yaml,
)
#: data.tasks accepted per data.source: the demo generator writes only `demo`; the GLUE tasks with a training
#: split (MNLI-mm and AX are predicted by the MNLI model); a local directory may also hold generated tasks.
TRAINABLE_GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
TASKS_BY_SOURCE = {"demo": ("demo",), "hub": TRAINABLE_GLUE_TASKS + ("squad", "squad_v2"),
                   "local": TRAINABLE_GLUE_TASKS + ("demo", "demo-pair", "squad")}


class ConfigError(UserError, ValueError):
    """A params file that cannot be used; the message names the file and the key."""


class TrainSection(Section):
    epochs: float = Field(1.0, gt=0)  # passes over the stage's training data (fractional: part of the last pass)
    learning_rate: float = Field(5e-5, gt=0, lt=1)  # peak learning rate (after warm-up; linear decay to 0)
    batch_size: int = Field(32, ge=1)  # global batch: split evenly across `distributed.nproc_per_node` processes
    warmup_ratio: float = Field(0.0, ge=0, lt=1)  # share of the optimizer steps spent warming the learning rate up
    weight_decay: float = Field(0.01, ge=0)  # AdamW weight decay
    max_steps: int = Field(-1, ge=-1)  # optimizer steps at most, overriding `epochs`; -1: `epochs` decide
    # A resume checkpoint every N optimizer steps (a killed run continues from the last one). None: every epoch
    # where the stage evaluates on dev (fine-tuning, the grids), else every 500 steps. A stage that evaluates on dev
    # then evaluates at every checkpoint, and keeps the best of those.
    checkpoint_steps: int | None = Field(None, ge=1)

    def train_args(self, seed: int, **extra: Any) -> dict[str, Any]:
        """The TrainingArguments options of this schedule (its batch size is the global batch of all processes);
        ``extra`` on top."""
        from distillery.training.distributed import per_device_batch

        return {"num_train_epochs": self.epochs, "learning_rate": self.learning_rate,
                "per_device_train_batch_size": per_device_batch(self.batch_size),
                "per_device_eval_batch_size": max(self.batch_size, 64),
                "warmup_steps": self.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of total steps
                "weight_decay": self.weight_decay, "max_steps": self.max_steps, "seed": seed, "save_total_limit": 1,
                "logging_steps": 5, **checkpoint_options(self.checkpoint_steps), **extra}


def checkpoint_options(steps: int | None) -> dict[str, Any]:
    """TrainingArguments options for a resume checkpoint every `steps` optimizer steps (None: the loop's default)."""
    return {} if steps is None else {"save_strategy": "steps", "save_steps": steps}


#: main scores of a task of your own: classification (f1: binary, of the second label) and regression
CLASSIFICATION_METRICS = ("accuracy", "macro_f1", "f1", "mcc")
REGRESSION_METRICS = ("pearson", "spearman", "pearson_spearman")
CUSTOM_SPLITS = ("train", "validation", "test")


class CustomTaskSection(Section):
    """A labelled dataset of your own (`distillery.custom_tasks`): files (`train`, `validation`, optional `test`) or a
    Hub dataset (`hub`, `config`, `splits`: our split -> the Hub's), the columns of the text (and `text_pair`) and
    of the label, the task `type`, the label order and the main score."""

    train: str | None = None  # training split file: .csv .tsv .jsonl/.json (JSON Lines) .parquet, by its extension
    validation: str | None = None  # dev split file (dev scores, model selection, the teacher gate)
    test: str | None = None  # optional test split file: its predictions go to data/predictions/<task>/
    hub: str | None = None  # a datasets Hub name or a local dataset directory, instead of the files
    config: str | None = None  # the Hub dataset's config name
    # Hub dataset: our split (train, validation, optional test) -> the Hub dataset's split name
    splits: dict[str, str] = Field(default_factory=lambda: {"train": "train", "validation": "validation"})
    text: str = Field(min_length=1)  # the text column
    text_pair: str | None = None  # a second text column (a sentence-pair task)
    label: str = Field(min_length=1)  # the label column (strings or integers; a number for regression)
    type: Literal["classification", "regression"] = "classification"  # classification (labels) | regression (scores)
    labels: list[str] | None = None  # label order; None: a Hub ClassLabel's names, else the training labels sorted
    # main score: accuracy | macro_f1 | f1 (binary, of the second label) | mcc (classification), pearson | spearman |
    # pearson_spearman (regression); None: accuracy, or pearson_spearman for regression
    metric: Literal[CLASSIFICATION_METRICS + REGRESSION_METRICS] | None = None

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, v: Any) -> Any:
        return [str(x) if isinstance(x, (int, bool)) else x for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _consistent(self) -> "CustomTaskSection":
        files = {k: getattr(self, k) for k in CUSTOM_SPLITS if getattr(self, k) is not None}
        if self.hub and files:
            raise ValueError(f"give files ({', '.join(files)}) or `hub`, not both")
        if not self.hub:
            if self.train is None or self.validation is None:
                raise ValueError("needs `train` and `validation` files (or a Hub dataset: `hub`)")
            for key, path in files.items():
                from distillery.custom_tasks import FORMATS

                if Path(path).suffix.lower() not in FORMATS:
                    raise ValueError(f"{key}: {path!r}: unknown extension; use one of {', '.join(FORMATS)}")
        else:
            bad = [k for k in self.splits if k not in CUSTOM_SPLITS]
            if bad or "train" not in self.splits or "validation" not in self.splits:
                raise ValueError(f"splits: {self.splits}: map train and validation (and optionally test) to the Hub "
                                 f"dataset's split names; unknown: {bad}" if bad else
                                 f"splits: {self.splits}: map both train and validation to the Hub dataset's splits")
        if self.text_pair is not None and self.text_pair == self.text:
            raise ValueError("text_pair names the same column as text")
        allowed = CLASSIFICATION_METRICS if self.type == "classification" else REGRESSION_METRICS
        if self.metric is not None and self.metric not in allowed:
            raise ValueError(f"metric: {self.metric!r} is not a {self.type} score; use one of {', '.join(allowed)}")
        if self.labels is not None:
            if self.type == "regression":
                raise ValueError("labels: a regression task has no label list")
            if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
                raise ValueError(f"labels: {self.labels}: give at least two distinct labels")
            if self.metric == "f1" and len(self.labels) != 2:
                raise ValueError(f"metric: f1 is the binary F1; this task has {len(self.labels)} labels (use macro_f1)")
        return self

    @property
    def main_metric(self) -> str:
        return self.metric or ("accuracy" if self.type == "classification" else "pearson_spearman")


class DataSection(Section):
    source: Literal["demo", "local", "hub"] = "demo"  # demo (generated) | local (files) | hub (nyu-mll/glue)
    # tasks of your own, by name (listed in `tasks` like a GLUE task); before `tasks`, which reads it
    custom: dict[str, CustomTaskSection] = Field(default_factory=dict)
    # the run's tasks: GLUE names (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli), squad, squad_v2, demo,
    # demo-pair, or names under `custom`; `source` decides which are accepted (TASKS_BY_SOURCE)
    tasks: list[str] = Field(default_factory=lambda: ["demo"], min_length=1)
    glue_dir: str | None = None  # source local: a GLUE directory in the official layout (<glue_dir>/SST-2/...)
    # source local, task squad: one official SQuAD JSON file split by article (distillery.squad.split_by_article),
    # its last `squad_eval_articles` articles (in a permutation by `squad_split_seed`, when set) for evaluation
    squad_file: str | None = None
    squad_eval_articles: int = Field(8, ge=1)  # articles of `squad_file` held out for evaluation; the rest train
    squad_split_seed: int | None = None  # seed of the article permutation before the split; None: the file's order
    # span tasks: windows of `max_length` tokens over the context, `doc_stride` apart, questions cut to
    # `max_query_length` tokens (BERT's SQuAD settings: 384 / 128 / 64)
    doc_stride: int = Field(128, ge=1)
    max_query_length: int = Field(64, ge=1)  # span tasks: questions cut to this many tokens
    # task training (teacher fine-tuning, task distillation, direct baselines) in batches of similar length: less
    # padding, which matters at SQuAD's 384 tokens (transformers' LengthGroupedSampler; evaluation keeps its scores)
    group_by_length: bool = False
    max_train_examples: int | None = Field(None, ge=1)  # a seeded random subset of each training split; None: all
    max_eval_examples: int | None = Field(None, ge=1)  # the same for dev (evaluation) splits; test splits stay whole
    # text without labels that the teacher labels for the distillation steps that read soft targets (fine-tuning and
    # the direct baseline see the gold rows only): rest (the training rows `max_train_examples` left out) | a file
    # (CSV, TSV, JSON Lines, Parquet; its text columns only: a task of your own's, else `text` [and `text_pair`]);
    # None: gold rows only
    unlabeled: str | None = None
    max_unlabeled_examples: int | None = Field(None, ge=1)  # at most this many unlabelled rows (rest: seeded order)
    max_length: int = Field(64, ge=8, le=512)  # tokens per encoded example, truncated to it (span tasks: per window)
    demo_train: int = Field(2000, ge=10)  # source demo: examples in the demo task's training split
    demo_dev: int = Field(400, ge=10)  # source demo: examples in its dev split
    demo_test: int = Field(400, ge=10)  # source demo: examples in its test split
    # the demo's training labels flipped at this rate (dev and test stay clean): few, noisy labels, as in real tasks
    demo_label_noise: float = Field(0.0, ge=0.0, lt=0.5)
    # the share of demo sentences of two opposite clauses whose main clause decides ("the plot was dull, but the cast
    # was superb"): a task that needs word order
    demo_contrast: float = Field(0.0, ge=0.0, le=1.0)

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, v: list[str], info: ValidationInfo) -> list[str]:
        """Task names become path components (data/tasks/<task>, ...): only the registry's trainable tasks, by
        their exact names, are accepted, before any path is joined."""
        from distillery.glue.tasks import TASKS, get_task

        source = info.data.get("source", "demo")
        known = TASKS_BY_SOURCE.get(source, TRAINABLE_GLUE_TASKS)
        if "custom" not in info.data:  # data.custom failed its own validation: its error is the one to read
            return v
        custom = info.data.get("custom") or {}
        for name in v:
            if name in known or name in custom:
                continue
            hint = ""
            try:
                canonical = get_task(name).name
            except ValueError:
                canonical = None
            if canonical in known:
                hint = f" (did you mean {canonical!r}?)"
            elif name in TASKS:
                hint = (" (the demo source generates only 'demo'; set data.source to local or hub for GLUE tasks)"
                        if source == "demo" else " (MNLI-mm and AX are evaluated with the mnli model: list 'mnli')"
                        if name in ("mnli-mm", "ax") else " (a generated task: data.source demo or local)")
            raise ValueError(f"unknown task {name!r} for source {source!r}{hint}; known: {', '.join(known)}"
                             + (f"; your own (data.custom): {', '.join(custom)}" if custom else
                                "; a task of your own is described under data.custom"))
        if len(set(v)) != len(v):
            raise ValueError(f"a task is listed twice: {v}")
        return v

    @field_validator("custom")
    @classmethod
    def _custom_names(cls, v: dict[str, CustomTaskSection]) -> dict[str, CustomTaskSection]:
        """A task of your own becomes a path component (data/tasks/<name>) and a registry name: lower-case letters,
        digits, - and _, and not a registry task's name."""
        import re

        from distillery.glue.tasks import _ALIASES, TASKS
        from distillery.task_kinds import SPAN_TASKS

        for name in v:
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,63}", name):
                raise ValueError(f"{name!r}: a task name is lower-case letters, digits, - and _ (starting with a "
                                 "letter; not a path)")
            if name in TASKS or name in _ALIASES or name in SPAN_TASKS:
                raise ValueError(f"{name!r} is the name of a registry task; give your own task another name")
        return v

    @field_validator("unlabeled")
    @classmethod
    def _unlabeled_source(cls, v: str | None) -> str | None:
        from distillery.custom_tasks import FORMATS

        if v is not None and v != "rest" and Path(v).suffix.lower() not in FORMATS:
            raise ValueError(f"{v!r}: give rest (the training rows max_train_examples leaves out) or a file of text "
                             f"({', '.join(FORMATS)})")
        return v

    @model_validator(mode="after")
    def _dir_for_local(self) -> "DataSection":
        if self.source == "local" and not self.glue_dir and any(t != "squad" and t not in self.custom
                                                                for t in self.tasks):
            raise ValueError("source 'local' needs `glue_dir`")
        if self.source == "local" and "squad" in self.tasks and not self.squad_file:
            raise ValueError("source 'local' with task 'squad' needs `squad_file` (e.g. dev-v1.1.json)")
        return self


class CorpusSection(Section):
    source: Literal["demo", "files"] = "demo"  # demo (generated in the demo task's language) | files (`paths`)
    paths: list[str] = Field(default_factory=list)  # source files: text files, or directories of *.txt files
    max_sentences: int | None = Field(None, ge=1)  # the prepared corpus stops after this many sentences; None: all
    demo_documents: int = Field(400, ge=1)  # source demo: documents generated

    @model_validator(mode="after")
    def _paths_for_files(self) -> "CorpusSection":
        if self.source == "files" and not self.paths:
            raise ValueError("source 'files' needs at least one entry in `paths`")
        return self


class PredictionsSection(Section):
    """A teacher known by its predictions: a file of them (CSV, TSV, JSON Lines or Parquet: a key, text [+ text_pair]
    or split + idx, and a value per label), or a fine-tuned classifier whose own tokenizer and model type need not be
    the students' (the teacher stage computes its predictions)."""

    file: str | None = None  # a predictions file: a key (text [+ text_pair], or split + idx) and a value per label
    model: str | None = None  # or a fine-tuned classifier's directory (its own tokenizer and model type)
    values: Literal["probabilities", "logits"] = "probabilities"  # what a file's label columns hold (regression: score)

    @model_validator(mode="after")
    def _one_source(self) -> "PredictionsSection":
        if (self.file is None) == (self.model is None):
            raise ValueError("give either `file` (a predictions file) or `model` (a fine-tuned classifier)")
        return self

    @property
    def source(self) -> str:
        return self.file if self.file is not None else self.model


def _predictions_file(v: Any) -> Any:
    return {"file": v} if isinstance(v, str) else v


class EnsembleMember(PredictionsSection):
    """One teacher of an ensemble; ``weight``: its share of the mean of the members' probabilities (regression: of
    their scores)."""

    weight: float = Field(1.0, gt=0)  # its share of the weighted mean of the members' probabilities (or scores)
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # its report row: teacher-<name>


class TeacherSection(Section):
    # "scratch": a fresh model of `shape` (demo); otherwise a local directory or Hub name.
    init: Literal["scratch", "pretrained"] = "scratch"
    name_or_path: str | None = None  # init pretrained: a model directory, Hub id or registry model (models:/NAME@ALIAS)
    shape: Shape | None = None  # init scratch: the teacher's shape
    tokenizer: str | None = None  # defaults to the teacher's own; "demo" trains a WordPiece vocab on the corpus
    vocab_size: int = Field(4000, ge=100)  # init scratch: size of the WordPiece vocabulary trained on the corpus
    # a teacher you already fine-tuned, per task (a model directory or Hub id with the task's head): evaluated on dev
    # (gate included) instead of fine-tuned again; the task-agnostic stages still read `name_or_path`
    finetuned: dict[str, str] = Field(default_factory=dict)
    # a teacher known only by its predictions, per task (`distillery.teacher_predictions`): a file, {file, values}, or
    # {model}: a classifier of another tokenizer; students distil from them at prediction level, the dev score theirs
    predictions: dict[str, Annotated[PredictionsSection, BeforeValidator(_predictions_file)]] = \
        Field(default_factory=dict)
    # several teachers per task: the soft targets are the weighted mean of their probabilities (or scores); students
    # distil from it at prediction level, as from `predictions`
    ensemble: dict[str, list[Annotated[EnsembleMember, BeforeValidator(_predictions_file)]]] = \
        Field(default_factory=dict)

    def predicted(self, task: str) -> bool:
        """Whether the task's teacher is known by predictions only (a file, or an ensemble's mean): no model."""
        return task in self.predictions or task in self.ensemble

    @model_validator(mode="after")
    def _consistent(self) -> "TeacherSection":
        if self.init == "scratch" and self.shape is None:
            raise ValueError("init 'scratch' needs `shape`")
        if self.init == "pretrained" and not self.name_or_path:
            raise ValueError("init 'pretrained' needs `name_or_path`")
        return self


class PretrainSection(TrainSection):
    enabled: bool = True  # MLM pre-training of the teacher on the corpus (continued when init is pretrained)
    max_length: int = Field(64, ge=8, le=512)  # tokens per MLM sequence (corpus sentences packed up to it)
    mlm_probability: float = Field(0.15, gt=0, lt=1)  # share of tokens masked


class FinetuneSection(TrainSection):
    # A pretrained teacher is fine-tuned from its own checkpoint; the pre-training stage's continued-MLM copy
    # (made for augmentation) becomes the teacher only when this says so. A scratch teacher has no other.
    from_continued_mlm: bool = False
    # The teacher gate: a task whose fine-tuned teacher's main dev score does not beat the task's trivial baseline
    # (majority class / constant prediction) by this much is not distilled (its augmentation, task distillation and
    # registration are skipped; its submission files hold the trivial baseline's predictions); the other tasks are.
    min_gain_over_trivial: float = Field(0.05, ge=0)
    # A failed gate ends the run (after every other task is done) with exit code 2 and one `error:` line per task.
    stop_on_failed_gate: bool = False


class WordVectorsSection(Section):
    # "corpus": learn vectors from the prepared corpus (offline demo); "file": a GloVe/word2vec text file.
    source: Literal["corpus", "file"] = "corpus"
    path: str | None = None  # source file: the GloVe / word2vec text file
    dim: int = Field(50, ge=2)  # source corpus: size of the learned vectors
    max_words: int = Field(100_000, ge=1)  # vectors kept: the first N of the file (GloVe's most frequent words)

    @model_validator(mode="after")
    def _path_for_file(self) -> "WordVectorsSection":
        if self.source == "file" and not self.path:
            raise ValueError("source 'file' needs `path`")
        return self


class AugmentSection(Section):
    enabled: bool = True  # TinyBERT data augmentation (Algorithm 1) of each task's training set
    mlm: str = "teacher"  # "teacher" = the pre-training stage's MLM, or any MLM directory / Hub name
    n_aug: int | None = Field(None, ge=1)  # None: the official per-task default
    k: int = Field(15, ge=1)  # candidate words per word (K)
    p_t: float = Field(0.4, ge=0, le=1)  # probability of replacing each word (p_t)
    fast: bool = False  # one MLM forward per sentence instead of one per word: faster, an approximation
    # augment only the first N training examples (the rest join the training set as they are); None: all
    max_examples: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1)  # masked copies per MLM forward
    shard_size: int = Field(256, ge=1)  # examples per shard, written as it completes: a killed run resumes there


class GeneralDistillationSection(TrainSection):
    """Schedule of every student's general (pre-training) distillation and of MiniLM's teacher assistant;
    the losses are the student's recipe's."""

    max_length: int = Field(64, ge=8, le=512)  # tokens per corpus sequence (sentences packed up to it)


class IntermediateSection(TrainSection):
    """TinyBERT task distillation step 1 (the student recipe's intermediate losses on the augmented set)."""


class GridSection(Section):
    """An lr x batch-size grid of task runs, best on dev (the papers' model selection)."""

    # the grid's peak learning rates
    learning_rates: list[float] = Field(default_factory=lambda: [1e-5, 2e-5, 3e-5], min_length=1)
    batch_sizes: list[int] = Field(default_factory=lambda: [16, 32], min_length=1)  # the grid's global batch sizes
    epochs: float = Field(3.0, gt=0)  # passes over the training set of every run of the grid
    # share of each run's optimizer steps spent warming the learning rate up
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    checkpoint_steps: int | None = Field(None, ge=1)  # as in TrainSection

    @field_validator("learning_rates")
    @classmethod
    def _positive_lrs(cls, v: list[float]) -> list[float]:
        if any(lr <= 0 or lr >= 1 for lr in v):
            raise ValueError("every learning rate must be in (0, 1)")
        return v

    @field_validator("batch_sizes")
    @classmethod
    def _positive_batches(cls, v: list[int]) -> list[int]:
        if any(b < 1 for b in v):
            raise ValueError("every batch size must be >= 1")
        return v

    def grid(self, cache: bool = True):
        """The training layer's `Grid` (``cache``: its runs may share the teacher's logits)."""
        from distillery.training.spec import Grid

        return Grid(learning_rates=tuple(self.learning_rates), batch_sizes=tuple(self.batch_sizes), epochs=self.epochs,
                    cache_teacher_logits=cache)

    def run_args(self, seed: int, **extra: Any) -> dict[str, Any]:
        """The TrainingArguments options every run of the grid shares (``extra`` first: the task kind's); each run
        adds its learning rate, batch size and epochs (`distillery.training.grid`)."""
        return {**extra, "warmup_steps": self.warmup_ratio, "seed": seed, "per_device_eval_batch_size": 64,
                "save_total_limit": 1, "logging_steps": 5, **checkpoint_options(self.checkpoint_steps)}


class PredictionSection(GridSection):
    """TinyBERT step 2: prediction-layer distillation over the grid."""

    temperature: float = Field(1.0, gt=0)  # softmax temperature of the prediction-layer loss (eq. 10)
    cache_teacher_logits: bool = True  # teacher logits computed once, shared by the grid's runs; false: every batch
    # a regression task (STS-B): MSE to the teacher's prediction, or to the gold score (official)
    regression_target: Literal["teacher", "gold"] = "teacher"

    def grid(self, cache: bool = True):
        return super().grid(cache and self.cache_teacher_logits)


class TaskDistillationSection(Section):
    intermediate: IntermediateSection = IntermediateSection()  # TinyBERT's step 1 and MiniLM's `intermediate_step`
    # TinyBERT's step 2 and the other recipes' extra step (`task_distillation`)
    prediction: PredictionSection = PredictionSection()
    finetune: GridSection = GridSection()  # the task stage of MiniLM / DistilBERT / MobileBERT students (gold labels)
    # Every student's dropout rate (all its dropout layers and config keys) in the task stage, distilled and direct
    # baseline alike; None: the student's own config's (BERT's 0.1, as in the official code).
    student_dropout: float | None = Field(None, ge=0, lt=1)


class EvaluationSection(Section):
    baselines: bool = True  # each student's architecture trained on gold labels alone, beside it in the report
    latency: bool = True  # time every model against the teacher in the evaluate stage (speedups in the report)
    # batch sizes timed; the report's speed column uses the smallest
    latency_batch_sizes: list[int] = Field(default_factory=lambda: [1, 32])
    latency_seq_len: int = Field(128, ge=8, le=512)  # tokens per sequence timed (and a budget's default `seq_len`)
    # paired rounds of every model and the teacher: 9 first, more up to this many for a speedup not yet pinned down
    # within 3%, up to 3x for an unresolved one (distillery.efficiency.latency.time_sessions); speedups are their median
    latency_rounds: int = Field(20, ge=3)
    export_onnx: bool = True  # ONNX + int8 (ONNX Runtime dynamic quantisation) of every student

    @field_validator("latency_batch_sizes")
    @classmethod
    def _positive_batches(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("give at least one batch size (the report's speed column uses the smallest)")
        if any(b < 1 for b in v):
            raise ValueError(f"every batch size must be >= 1, got {v}")
        return v


class RegistrySection(Section):
    enabled: bool = True  # register every student in the MLflow model registry (the register stage)
    # A new version gets the alias `candidate`; `champion` moves to it only when its main dev score beats the
    # current champion's by more than this (0: any improvement; a tie keeps the champion).
    promote_margin: float = Field(0.0, ge=0)


class DistributedSection(Section):
    """Data-parallel training: each training stage (pre-training, teacher fine-tuning, teacher assistant, general
    and task distillation, baselines) runs on `nproc_per_node` processes of this machine under `torchrun
    --standalone` (DistributedDataParallel); 1 is one process, no launcher. Every batch size in params is the
    global batch, split evenly across the processes. backend: "auto" (NCCL on GPUs, gloo on CPUs), gloo or nccl."""

    nproc_per_node: int = Field(1, ge=1)  # processes per training stage: 1 = this process, no launcher; N = one per GPU
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto (NCCL on GPUs, gloo on CPUs) | gloo | nccl


class OrchestrationSection(Section):
    """How the Prefect flow schedules the stages (no stage's cache key reads it). Stages run as a DAG: each waits only
    for the stages whose outputs it reads, and independent ones run at once, at most `max_workers`, on `runner`:
    "threads" (a thread pool in the flow's process) or "dask" (prefect-dask; `dask_address` of a running Dask
    scheduler, or a local cluster when empty). Stages that compute on the device (training, the MLM of augmentation)
    hold one of `device_slots` while they run, and evaluation (it measures latency) holds them all. With 1 slot (the
    default, right for one CPU or one GPU shared by models this small) device stages run one at a time and the
    outputs are bit-identical to a sequential run; more slots overlap training on a large device (random streams
    then depend on timing)."""

    runner: Literal["threads", "dask"] = "threads"  # threads (a pool in the flow's process) | dask (prefect-dask)
    max_workers: int = Field(4, ge=1)  # stages at once
    # device stages (training, augmentation's MLM) at once; evaluation holds them all
    device_slots: int = Field(1, ge=1)
    dask_address: str = ""  # runner dask: a running scheduler (tcp://HOST:8786); empty: a local cluster


#: the `data` and `evaluation` keys a task may set for itself: how its examples are encoded and timed (a SQuAD task's
#: 384-token windows beside GLUE's 128 tokens in one run); the rest of those sections is the run's
TASK_DATA_KEYS = ("max_length", "doc_stride", "max_query_length", "group_by_length", "max_train_examples",
                  "max_eval_examples", "unlabeled", "max_unlabeled_examples")
TASK_EVALUATION_KEYS = ("latency_seq_len",)


class TaskOverrides(Section):
    """One task's own settings (`per_task.<task>`): partial `teacher_finetune`, `augment` and `task_distillation`
    sections and the task's encoding and timing keys of `data` and `evaluation` (`TASK_DATA_KEYS`,
    `TASK_EVALUATION_KEYS`),
    merged key by key over the run's for that task's stages (`Params.for_task`). Only settings that no other task's
    stage reads can differ per task."""

    teacher_finetune: dict[str, Any] = Field(default_factory=dict)  # this task's `teacher_finetune` keys
    augment: dict[str, Any] = Field(default_factory=dict)  # this task's `augment` keys
    task_distillation: dict[str, Any] = Field(default_factory=dict)  # this task's `task_distillation` keys
    data: dict[str, Any] = Field(default_factory=dict)  # this task's encoding keys of `data` (TASK_DATA_KEYS)
    evaluation: dict[str, Any] = Field(default_factory=dict)  # this task's `evaluation.latency_seq_len`

    @field_validator("data", "evaluation")
    @classmethod
    def _task_keys(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        allowed = TASK_DATA_KEYS if info.field_name == "data" else TASK_EVALUATION_KEYS
        if wrong := [k for k in v if k not in allowed]:
            raise ValueError(f"{wrong} cannot differ per task; a task may set {list(allowed)}")
        return v


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def _merged(section: Section, part: dict[str, Any]) -> Section:
    return type(section).model_validate(_deep_merge(section.model_dump(), part))


class Params(Section):
    seed: int = 42  # seed of every stage: data subsets and splits, generated data, initialisation, training
    # every training loop and inference path (distillery.precision): auto = bf16 autocast where the device is fast at
    # it (a bf16 GPU; a CPU with AMX or AVX512-BF16), fp32 elsewhere; weights and checkpoints stay fp32
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # torch.compile of the teacher's and student's forwards in distillation (distillery.training.compiled): auto = on a
    # GPU, where the compiled step measured faster; off on a CPU
    compile: Literal["auto", "on", "off"] = "auto"
    data: DataSection = DataSection()  # the tasks: where they come from and how they are encoded
    corpus: CorpusSection = CorpusSection()  # raw text: the teacher's MLM, general distillation, word vectors
    teacher: TeacherSection  # the teacher: a fresh model of a shape, or a pretrained checkpoint
    pretrain: PretrainSection = PretrainSection()  # the teacher's MLM pre-training stage and its schedule
    teacher_finetune: FinetuneSection = FinetuneSection()  # the teacher's fine-tuning per task, and the gate
    word_vectors: WordVectorsSection = WordVectorsSection()  # the word vectors of TinyBERT's data augmentation
    augment: AugmentSection = AugmentSection()  # TinyBERT's data augmentation of the task training sets
    # the students by name (letters, digits, - and _): each a recipe (`recipe`, default tinybert) with a shape or budget
    students: dict[str, StudentRecipe] = Field(min_length=1)
    # the schedule of every student's general (pre-training) distillation and of MiniLM's teacher assistant
    general_distillation: GeneralDistillationSection = GeneralDistillationSection()
    task_distillation: TaskDistillationSection = TaskDistillationSection()  # the task stage's schedules and grids
    evaluation: EvaluationSection = EvaluationSection()  # direct baselines, latency, ONNX / int8 export
    registry: RegistrySection = RegistrySection()  # the MLflow model registry: registration and promotion
    distributed: DistributedSection = DistributedSection()  # data-parallel training on this machine
    orchestration: OrchestrationSection = OrchestrationSection()  # how the Prefect flow schedules the stages
    per_task: dict[str, TaskOverrides] = Field(default_factory=dict)  # a task's own settings over the run's

    def for_task(self, task: str | None) -> "Params":
        """The params a task's stages run with: `per_task.<task>` merged over the run's (self when it has none)."""
        over = self.per_task.get(task) if task else None
        if over is None:
            return self
        update = {name: _merged(getattr(self, name), part) for name, part in over if part}
        return self.model_copy(update={**update, "per_task": {}})

    @field_validator("teacher")
    @classmethod
    def _finetuned_tasks(cls, v: TeacherSection, info: ValidationInfo) -> TeacherSection:
        data = info.data.get("data")
        keys = ("finetuned", "predictions", "ensemble")
        for i, key in enumerate(keys):
            for task in getattr(v, key):
                if data is not None and task not in data.tasks:
                    raise ValueError(f"{key}: {task!r} is not in data.tasks ({', '.join(data.tasks)})")
                if other := [k for k in keys[:i] if task in getattr(v, k)]:
                    raise ValueError(f"{key}: {task!r} has a teacher in teacher.{other[0]} too; give one teacher per "
                                     "task (several: teacher.ensemble)")
        for task, members in v.ensemble.items():
            names = [m.name for m in members if m.name is not None]
            if len(members) < 2:
                raise ValueError(f"ensemble.{task}: an ensemble has two teachers or more, got {len(members)}")
            if len(set(names)) != len(names):
                raise ValueError(f"ensemble.{task}: member names must differ, got {names}")
        return v

    @field_validator("per_task")
    @classmethod
    def _tasks_of_the_run(cls, v: dict[str, TaskOverrides], info: ValidationInfo) -> dict[str, TaskOverrides]:
        data = info.data.get("data")
        for task in v:
            if data is not None and task not in data.tasks:
                raise ValueError(f"{task!r} is not in data.tasks ({', '.join(data.tasks)})")
        return v

    @field_validator("students", mode="before")
    @classmethod
    def _default_recipe(cls, v: Any) -> Any:
        return {k: recipe_from_yaml(s) for k, s in v.items()} if isinstance(v, dict) else v

    @field_validator("students")
    @classmethod
    def _student_names(cls, v: dict[str, StudentRecipe]) -> dict[str, StudentRecipe]:
        for name in v:
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"student name {name!r} must be letters, digits, '-' or '_'")
        return v

    @field_validator("distributed")
    @classmethod
    def _batches_split_evenly(cls, v: DistributedSection, info: ValidationInfo) -> DistributedSection:
        """Every batch size is the global batch: it must split evenly across the processes (sections that failed
        their own validation are not in `info.data` and are skipped)."""
        problem = _uneven_batches(v.nproc_per_node, info.data)
        if problem:
            raise ValueError(problem)
        return v


def _uneven_batches(n: int, d: dict[str, Any]) -> str | None:
    """What is wrong when a batch size of the sections `d` does not split evenly across `n` processes."""
    td = d.get("task_distillation")
    batches = {f"{k}.batch_size": [d[k].batch_size]
               for k in ("pretrain", "teacher_finetune", "general_distillation") if k in d}
    if td is not None:
        batches.update({"task_distillation.intermediate.batch_size": [td.intermediate.batch_size],
                        "task_distillation.prediction.batch_sizes": td.prediction.batch_sizes,
                        "task_distillation.finetune.batch_sizes": td.finetune.batch_sizes})
    for key, values in batches.items():
        if any(b % n for b in values):
            return (f"nproc_per_node={n} does not divide {key} ({', '.join(map(str, values))}): every batch size in "
                    "params is the global batch, split evenly across the processes")
    return None


#: keys renamed so that a name has one meaning and a hyper-parameter keeps its name from params to the library; an
#: old params file gets "unknown key (now `...`)"
RENAMED_KEYS = {"finetune": "teacher_finetune", "lr": "learning_rate", "lrs": "learning_rates"}


def _renamed(loc: list) -> str:
    """The hint for an unknown key that an older params file used (`finetune` only where a section stood)."""
    key = loc[-1] if loc else None
    if key not in RENAMED_KEYS or (key == "finetune" and not (len(loc) == 1 or loc[0] == "per_task")):
        return ""
    return f" (now `{RENAMED_KEYS[key]}`)"


def _format_error(path: str, exc: ValidationError, prefix: str = "") -> str:
    lines = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        if len(loc) > 2 and loc[0] == "students" and loc[2] in RECIPE_NAMES:
            loc.pop(2)  # the recipe tag pydantic puts in the location of a tagged union
        if len(loc) > 3 and loc[0] == "students" and loc[2] == "init" and loc[3] in INIT_KINDS:
            loc.pop(3)
        key = ".".join([prefix] * bool(prefix) + [str(p) for p in loc])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _renamed(loc)
        lines.append(f"{path}: {key or '<top>'}: {msg}")
    return "\n".join(lines)


def parse_params(data: dict[str, Any], path: str = "params.yaml") -> Params:
    """Validate the schema (types, ranges, names); no file is read and nothing is registered (the checks against
    files and the Hub, and the tasks of your own joining the task registry: `distillery.preflight`)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    try:
        p = Params.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(path, exc)) from None
    for task, over in p.per_task.items():
        for name, part in over:
            try:
                _merged(getattr(p, name), part)
            except ValidationError as exc:
                raise ConfigError(_format_error(path, exc, f"per_task.{task}.{name}")) from None
        q = p.for_task(task)
        problem = _uneven_batches(q.distributed.nproc_per_node, dict(q))
        if problem:
            raise ConfigError(f"{path}: per_task.{task}: {problem}")
    return p


def augment_sections(p: Params) -> list[AugmentSection]:
    """The `augment` settings each task runs with (its own under `per_task`, else the run's)."""
    return [p.for_task(t).augment for t in p.data.tasks]
