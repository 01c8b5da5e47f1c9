"""What the pipeline does differently for a sentence(-pair) classification task (GLUE) and a span task (SQuAD).

A `TaskKind` answers every task-dependent question of the stages in one place: the model head the teacher and
students carry, the keyword arguments a model of the task is built with, how the prepared splits are encoded,
the dev metrics and the main score (in [0, 1]: GLUE's own scores, a span task's F1 / 100, so that the teacher
gate's `min_gain_over_trivial` and retention read the same on both), the trivial baseline, and evaluation.

- `ClassificationKind`: the GLUE registry (`distillery.glue`); trivial baseline: majority class / mean score.
- `SpanKind`: SQuAD v1.1 (`squad`) and v2.0 (`squad_v2`) (`distillery.squad`): a question-answering head, features
  of at most `max_length` tokens (doc stride 128, query 64), the official EM/F1 (0-100), trivial baseline: the
  question-overlap sentence (`sentence_baseline`), a floor of this project's own, not a baseline of the SQuAD paper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

SPAN_TASKS = {"squad": "1.1", "squad_v2": "2.0"}


def extra_split(task: str, split: str) -> str:
    """The name, inside a task's prepared data, of a split of a task its model also predicts (e.g. mnli_mm__dev)."""
    return f"{task.replace('-', '_')}__{split}"


def grouping(group_by_length: bool) -> dict[str, Any]:
    """TrainingArguments of task training: batches of similar length (less padding) or the Trainer's random ones."""
    return {"train_sampling_strategy": "group_by_length"} if group_by_length else {}


class ClassificationKind:
    head = "sequence-classification"
    #: what the report says the trivial row is
    trivial_description = "the majority class (a constant score for regression) of the training labels"
    #: TinyBERT's data augmentation applies (word-level replacement of a sentence or pair)
    augmentable = True
    #: the teacher's logits of the training set are a fixed-width column (computed once per grid)
    caches_teacher_logits = True
    #: test-split predictions go to files (the GLUE server's format); a span task writes its dev answers instead
    submits_test_predictions = True
    #: the registered model's pyfunc (`tasks/pyfunc_<name>.py`), and the deployed forms it can run in
    pyfunc = "classifier"
    served_forms = ("fp32", "bf16", "int8")

    def __init__(self, task: str, group_by_length: bool = False) -> None:
        from distillery import glue

        self.task, self.spec = task, glue.get_task(task)
        self.metric_names: tuple[str, ...] = tuple(self.spec.metrics)
        self.train_args: Mapping[str, Any] = grouping(group_by_length)

    def model_kwargs(self, config=None) -> dict[str, Any]:
        """The label settings every model of the task is built with (a teacher's config gives the names)."""
        spec = self.spec
        kwargs: dict[str, Any] = {"num_labels": spec.num_labels,
                                  "id2label": config.id2label if config is not None else spec.id2label,
                                  "label2id": config.label2id if config is not None else spec.label2id}
        if spec.is_regression:
            kwargs["problem_type"] = "regression"
        return kwargs

    def load_teacher(self, source: str, *, complete: bool = False):
        from distillery.models import load_teacher

        spec = self.spec
        model = load_teacher(source, head=self.head, num_labels=spec.num_labels, regression=spec.is_regression,
                             complete=complete)
        if not spec.is_regression:  # the task's label names travel with the teacher and its students
            model.config.id2label, model.config.label2id = spec.id2label, spec.label2id
        return model

    def encode(self, data, tokenizer, max_length: int):
        from distillery import glue

        return glue.encode(data, tokenizer, self.task, max_length)

    def metrics(self, dev_examples=None, dev_features=None, pad_id: int = 0) -> tuple[Callable, Callable]:
        """(compute_metrics, main score) of the GLUE task (the arguments are the span kind's; unused here)."""
        from distillery.training.metrics import glue_metrics

        return glue_metrics(self.task)

    def training_metrics(self, dev: Callable[[], tuple[Any, Any]], pad_id: int = 0) -> tuple[Callable, Callable]:
        """(compute_metrics, main score) of a training run's dev evaluation; `dev` gives (dev examples, encoded dev
        features) when the metric reads them (a span task's answers), and is not called here."""
        return self.metrics()

    def main_score(self, metrics: Mapping[str, float]) -> float:
        from distillery import glue

        return glue.main_score(self.task, metrics)

    def trivial(self, data) -> dict[str, float]:
        from distillery import glue

        metrics = glue.trivial_baseline(self.task, data["train"]["label"][:], data["dev"]["label"][:])
        return {**metrics, "main": self.main_score(metrics)}

    def evaluate(self, model_dir: Path, data, max_length: int, predictions_file: Path | None = None, session=None):
        """(dev metrics, test logits or None) of the model saved in `model_dir`, or of `session` (its exported copy,
        `distillery.efficiency.OnnxModel`: dev metrics only). `predictions_file`: the span kind's; unused here."""
        from distillery import glue
        from distillery.evaluation import evaluate_model

        if session is None:
            return evaluate_model(model_dir, self.task, data, max_length=max_length)
        from datasets import DatasetDict
        from transformers import AutoTokenizer

        dev = glue.encode(DatasetDict(dev=data["dev"]), AutoTokenizer.from_pretrained(str(model_dir)), self.task,
                          max_length)["dev"]
        features = {c: dev[c][:] for c in ("input_ids", "attention_mask", "token_type_ids") if c in dev.column_names}
        return glue.compute_metrics(self.task, session.predict(features), dev["labels"][:]), None

    def hub_dataset_id(self, data) -> str | None:
        """The Hub dataset the task is prepared from (None: files or the demo generator)."""
        from distillery import glue

        if self.task in data.custom:
            return data.custom[self.task].hub
        return glue.HUB_ID if data.source == "hub" and self.spec.hub_config else None

    def load(self, data, root: Path, raw: Path, seed: int):
        """The task's splits ({"train", "dev"[, "test"]} and the extra tasks' splits, `extra_split`) from where
        params say: a task of your own (`data.custom`), the demo generator (writing its files under `raw`), a GLUE
        directory or the Hub. Relative paths start at `root`."""
        from distillery import custom_tasks, demo, glue
        from distillery.io import resolve_path

        if self.task in data.custom:
            return custom_tasks.load(self.task, data.custom[self.task], root)
        if data.source == "demo":
            demo.make_demo_task(raw / self.task, n_train=data.demo_train, n_dev=data.demo_dev, n_test=data.demo_test,
                                seed=seed, label_noise=data.demo_label_noise, contrast=data.demo_contrast)
            return glue.load_local(self.task, raw)

        def one(task: str):
            return glue.load_local(task, resolve_path(data.glue_dir, root)) if data.source == "local" \
                else glue.load_hub(task)

        dsd = one(self.task)
        for extra in self.extra_tasks():  # MNLI's model also predicts MNLI-mm and AX: keep their splits
            for split, ds in one(extra).items():
                dsd[extra_split(extra, split)] = ds
        return dsd

    def extra_tasks(self) -> tuple[str, ...]:
        """Tasks predicted by this task's model without training data of their own (MNLI: MNLI-mm and AX)."""
        from distillery import glue

        return glue.tasks_evaluated_with(self.task)[1:]

    def encoding_params(self) -> dict[str, Any]:
        """The data settings beyond `max_length` that shape the encoded inputs (a stage's cache key): none."""
        return {}

    def card(self, data) -> dict[str, Any]:
        """What a model card says about the task: Hub pipeline tag, model-index task and dataset, a description, a
        use example (`data`: the params' data section)."""
        from distillery import glue

        spec = self.spec
        own = spec.name not in glue.TASKS  # a task of your own (data.custom)
        return {"pipeline_tag": "text-classification", "tag": "glue" if self.task in glue.GLUE_TASKS else self.task,
                "type": "text-regression" if spec.is_regression else "text-classification",
                "dataset": {"name": f"GLUE {spec.glue_name}" if spec.submission_file else spec.glue_name,
                            "type": glue.HUB_ID if spec.hub_config else "own data" if own else "generated",
                            **({"config": spec.hub_config} if spec.hub_config else {}), "split": "dev"},
                "hub": glue.HUB_ID if spec.hub_config else None,
                "what": f"{spec.glue_name} ({'regression' if spec.is_regression else 'labels ' + ', '.join(spec.labels)})",
                "use": ('model.predict(pd.DataFrame({"text": ["first sentence"], "text_pair": ["second sentence"]}))'
                        if spec.is_pair else 'model.predict(["a sentence"])')}

    def serving(self, data, dev, null_threshold: float = 0.0) -> dict[str, Any]:
        """What the registered model takes and answers: input and output columns ((name or None, type)), its
        configuration, an input example from the `dev` rows; None as an input name: a plain list of texts works."""
        spec = self.spec
        pair = spec.is_pair
        return {"inputs": [("text", "string"), ("text_pair", "string")] if pair else [(None, "string")],
                "outputs": [("score", "double")] if spec.is_regression else [("label", "string"), ("score", "double")],
                "config": {"task": self.task, "labels": list(spec.labels), "regression": spec.is_regression,
                           "pair": pair, "max_length": data.max_length},
                "example": {"text": dev["text_a"][:], **({"text_pair": dev["text_b"][:]} if pair else {})},
                "ships_library": False}

    def check_head(self, config, source: str) -> None:
        """A fine-tuned model's head fits the task: a sequence-classification head with the task's number of labels
        and, when it names its labels, the task's label names in the task's order."""
        from distillery.errors import UserError

        archs = getattr(config, "architectures", None) or []
        if not any(a.endswith("ForSequenceClassification") for a in archs):
            raise UserError(f"{source}: not a fine-tuned classifier ({', '.join(archs) or 'no architectures'} in its "
                            f"config.json); {self.task} needs a ...ForSequenceClassification model")
        if config.num_labels != self.spec.num_labels:
            raise UserError(f"{source}: its head has {config.num_labels} outputs, {self.task} has "
                            f"{self.spec.num_labels} ({', '.join(self.spec.labels) or 'a regression score'})")
        names = [str(config.id2label[i]) for i in range(config.num_labels)]
        if self.spec.labels and not all(n == f"LABEL_{i}" for i, n in enumerate(names)) and \
                tuple(names) != self.spec.labels:
            raise UserError(f"{source}: its labels are {names}, {self.task}'s are {list(self.spec.labels)}; give the "
                            "task the model's label order (data.custom.<task>.labels)")


class SpanKind:
    head = "question-answering"
    trivial_description = ("each question answered with the whole context sentence that shares the most words with "
                           "it (an adaptation of this project, not a baseline of the SQuAD paper)")
    metric_names = ("em", "f1")  # the official exact match and F1, 0-100
    augmentable = False  # TinyBERT appendix B: SQuAD's prediction layer is distilled on the original data
    caches_teacher_logits = False  # each feature's logits have its own length: the teacher runs beside the student
    submits_test_predictions = False  # its dev answers in the official format instead
    pyfunc = "reader"
    served_forms = ("fp32",)  # the reader's windows and answer extraction run on the PyTorch model

    def hub_dataset_id(self, data) -> str | None:
        """The Hub dataset the task is prepared from (None: a local SQuAD file)."""
        from distillery import squad

        return squad.HUB_PATHS[self.version] if data.source == "hub" else None

    def load(self, data, root: Path, raw: Path, seed: int):
        """{"train", "dev"}: the Hub's official splits, or one local SQuAD file split by article (never a paragraph
        on both sides; not the official split). `raw`, `seed`: the classification kind's; unused here."""
        from datasets import DatasetDict

        from distillery import squad
        from distillery.io import resolve_path

        if data.source == "hub":
            dsd = squad.load_hub(self.version)
        else:
            dsd = squad.load_squad_split(resolve_path(data.squad_file, root), data.squad_eval_articles,
                                         data.squad_split_seed, version=self.version)
        return DatasetDict({"train": dsd["train"], "dev": dsd["validation"]})

    def extra_tasks(self) -> tuple[str, ...]:
        return ()

    def encoding_params(self) -> dict[str, Any]:
        """The windows over the context (a stage's cache key)."""
        return {"doc_stride": self.doc_stride, "max_query_length": self.max_query_length}

    def card(self, data) -> dict[str, Any]:
        hub = self.hub_dataset_id(data)
        split = "validation" if hub else f"the last {data.squad_eval_articles} articles of {data.squad_file}"
        return {"pipeline_tag": "question-answering", "type": "question-answering", "tag": self.task,
                "dataset": {"name": f"SQuAD v{self.version}", "type": hub or "local", "split": split},
                "hub": hub, "what": f"SQuAD v{self.version} (extractive question answering: an answer span of the context)",
                "use": 'model.predict(pd.DataFrame({"question": ["who wrote it?"], '
                       '"context": ["It was written by Ann in 1990."]}))  # answer, score, start, end'}

    def serving(self, data, dev, null_threshold: float = 0.0) -> dict[str, Any]:
        """The reader: {question, context} -> {answer, score, start, end}, shipped with the library's SQuAD windows
        and answer extraction; `null_threshold`: SQuAD v2.0's null-odds threshold (the student's best on dev)."""
        return {"inputs": [("question", "string"), ("context", "string")],
                "outputs": [("answer", "string"), ("score", "double"), ("start", "long"), ("end", "long")],
                "config": {"task": self.task, "version": self.version, "max_length": data.max_length,
                           "doc_stride": data.doc_stride, "max_query_length": data.max_query_length,
                           "null_threshold": null_threshold},
                "example": {"question": dev["question"][:], "context": dev["context"][:]},
                "ships_library": True}

    def __init__(self, task: str, doc_stride: int = 128, max_query_length: int = 64, group_by_length: bool = False
                 ) -> None:
        self.task, self.version = task, SPAN_TASKS[task]
        self.doc_stride, self.max_query_length = doc_stride, max_query_length
        self.train_args: Mapping[str, Any] = {"label_names": ["start_positions", "end_positions"],
                                              **grouping(group_by_length)}

    def model_kwargs(self, config=None) -> dict[str, Any]:
        return {}

    def load_teacher(self, source: str, *, complete: bool = False):
        from distillery.models import load_teacher

        return load_teacher(source, head=self.head, complete=complete)

    def feature_config(self, max_length: int):
        from distillery.squad.features import FeatureConfig

        return FeatureConfig(max_length=max_length, doc_stride=self.doc_stride, max_query_length=self.max_query_length)

    def encode(self, data, tokenizer, max_length: int):
        """{"train": training features (start/end positions), "dev": evaluation features (offsets, example ids)}."""
        from datasets import DatasetDict

        from distillery.squad.features import prepare_eval_features, prepare_train_features

        config = self.feature_config(max_length)
        out = {}
        if "train" in data:
            out["train"] = prepare_train_features(data["train"], tokenizer, config)
        if "dev" in data:
            out["dev"] = prepare_eval_features(data["dev"], tokenizer, config)
        return DatasetDict(out)

    def metrics(self, dev_examples, dev_features, pad_id: int = 0) -> tuple[Callable, Callable]:
        """(compute_metrics, main score); `pad_id`: the tokenizer's, which pads the evaluated batches."""
        from distillery.squad.evaluate import SpanMetrics

        return SpanMetrics(dev_examples, dev_features, self.version, pad_id), self.main_score

    def training_metrics(self, dev: Callable[[], tuple[Any, Any]], pad_id: int = 0) -> tuple[Callable, Callable]:
        """(compute_metrics, main score) of a training run's dev evaluation: the answers to the dev questions
        (`dev()` gives the questions and the encoded dev features the run evaluates on)."""
        examples, features = dev()
        return self.metrics(examples, features, pad_id)

    def main_score(self, metrics: Mapping[str, float]) -> float:
        return float(metrics["f1"]) / 100.0

    def trivial(self, data) -> dict[str, float]:
        from distillery.squad.data import gold_answers
        from distillery.squad.metrics import evaluate, sentence_baseline

        dev = data["dev"]
        scores = evaluate(gold_answers(dev), sentence_baseline(dev), "1.1")  # it always answers: v1.1 scoring
        metrics = {"em": scores["exact_match"], "f1": scores["f1"]}
        return {**metrics, "main": self.main_score(metrics)}

    def check_head(self, config, source: str) -> None:
        """A fine-tuned model's head fits the task: a question-answering head."""
        from distillery.errors import UserError

        archs = getattr(config, "architectures", None) or []
        if not any(a.endswith("ForQuestionAnswering") for a in archs):
            raise UserError(f"{source}: not a fine-tuned reader ({', '.join(archs) or 'no architectures'} in its "
                            f"config.json); {self.task} needs a ...ForQuestionAnswering model")

    def evaluate(self, model_dir: Path, data, max_length: int, predictions_file: Path | None = None,
                 session=None):
        """(dev EM/F1, None): the model's answers to the dev questions, written in the official format to
        `predictions_file` (v2.0: with the null odds beside it) when given. `session`: an exported copy of the model
        (`distillery.efficiency.OnnxModel`, its output the (batch, 2, tokens) span logits) answers instead."""
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        from distillery.squad.evaluate import predict_span_logits
        from distillery.squad.metrics import write_predictions
        from distillery.squad.postprocess import null_odds, prediction_texts

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        dev = data["dev"]
        features = self.encode({"dev": dev}, tokenizer, max_length)["dev"]
        model = None if session is not None else AutoModelForQuestionAnswering.from_pretrained(str(model_dir)).eval()
        logits = predict_span_logits(model, tokenizer, features, session=session)
        compute, _ = self.metrics(dev, features)
        metrics = compute(logits)
        if predictions_file is not None:
            odds = null_odds(compute.answers) if self.version == "2.0" else None
            write_predictions(predictions_file, prediction_texts(compute.answers), odds)
        return metrics, None


def task_kind(task: str, data=None) -> ClassificationKind | SpanKind:
    """The kind of `task`; `data` (the params' data section) gives the length grouping of task training and a span
    task's doc stride and query length."""
    grouped = bool(data is not None and data.group_by_length)
    if task not in SPAN_TASKS:
        return ClassificationKind(task, grouped)
    if data is None:
        return SpanKind(task)
    return SpanKind(task, data.doc_stride, data.max_query_length, grouped)


def is_span(task: str) -> bool:
    return task in SPAN_TASKS
