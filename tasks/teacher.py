"""Teacher stages: MLM pre-training (from scratch or continued) and fine-tuning per task."""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.data import resolve
from tasks.stage import SkipStage, Stage

from distillery.config import Params
from distillery.errors import UserError


def finish(output_dir: Path) -> Path:
    """Drop the resume checkpoints once a stage has exported its final model (rank 0, under a launcher)."""
    from distillery.training.distributed import is_main

    if is_main():
        shutil.rmtree(output_dir / "checkpoints", ignore_errors=True)
    return output_dir / "model"


def teacher_source(p: Params) -> str:
    """The pre-trained teacher general distillation reads (an MLM-headed checkpoint when pre-trained)."""
    if p.pretrain.enabled:
        return str(paths.teacher_mlm() / "model")
    return teacher_name(p)


def finetune_source(p: Params) -> str:
    """Where teacher fine-tuning starts: the pretrained checkpoint as given, not the continued-MLM copy the
    pre-training stage makes for augmentation (unless `teacher_finetune.from_continued_mlm`); a scratch teacher
    starts from the pre-training stage, its only pre-training."""
    if p.teacher.init == "scratch" or (p.pretrain.enabled and p.teacher_finetune.from_continued_mlm):
        return teacher_source(p)
    return teacher_name(p)


def run_pretrain(p: Params, _: str | None) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from distillery import corpus
    from distillery.models import build_student
    from distillery.shape import resolve_shape
    from distillery.training.mlm import train_mlm
    from distillery.training.spec import TrainRun

    out = paths.teacher_mlm()
    if p.teacher.init == "scratch":
        if p.teacher.tokenizer in (None, "demo"):
            with tempfile.TemporaryDirectory() as tmp:  # saved with the model by train_mlm
                tokenizer = AutoTokenizer.from_pretrained(str(corpus.train_wordpiece(
                    paths.corpus(), Path(tmp) / "tokenizer", vocab_size=p.teacher.vocab_size)))
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(resolve(p.teacher.tokenizer)))
        model = build_student(resolve_shape(p.teacher.shape.as_spec()), len(tokenizer), head="mlm")
    else:
        source = teacher_name(p)
        tokenizer = AutoTokenizer.from_pretrained(p.teacher.tokenizer and str(resolve(p.teacher.tokenizer)) or source)
        model = source  # AutoModelForMaskedLM: a checkpoint without an MLM head gets a fresh one
    texts = corpus.pack_sequences(corpus.read_sentences(paths.corpus()), tokenizer, p.pretrain.max_length)
    train_mlm(model, TrainRun(out, texts, tokenizer=tokenizer, args=p.pretrain.train_args(p.seed)),
              max_length=p.pretrain.max_length, mlm_probability=p.pretrain.mlm_probability)
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics": {"sequences": len(texts)}}


def teacher_name(p: Params) -> str:
    return model_ref(p.teacher.name_or_path)


def model_ref(ref: str) -> str:
    """A params model reference as transformers loads it: the resolved local directory; for a Hub id, the local files of
    its current revision (`hub_snapshot`: their content hash is then in the keys of the stages that read it), or the
    Hub id itself when it is neither cached nor reachable (the load says why)."""
    path = resolve(ref)
    if path.exists():
        return str(path)
    snapshot = hub_snapshot(ref)
    return str(snapshot) if snapshot is not None else ref


#: What a model's revision is read for: its config, tokenizer and safetensors weights (not its other formats).
HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors"]


@functools.lru_cache(maxsize=None)
def hub_snapshot(name: str) -> Path | None:
    """The Hub model `name` at its current revision, as local files (once per process: one run, one revision): online
    (HF_HUB_OFFLINE=0), the Hub's latest revision, downloaded into the Hugging Face cache; offline, the revision the
    cache holds. None offline when it is not cached, or for a name that is no Hub id."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from distillery.io import hub_offline

    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    if not hub_offline():
        return Path(snapshot_download(name, allow_patterns=HUB_FILES))
    cached = try_to_load_from_cache(name, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None


def encoding(p: Params, task: str) -> dict[str, Any]:
    """The params that shape a task's encoded inputs and their batches (a stage's cache key): the length, a span
    task's windows, and the length grouping of its training when on."""
    from distillery.task_kinds import task_kind

    out: dict[str, Any] = {"max_length": p.data.max_length, **task_kind(task, p.data).encoding_params()}
    if p.data.group_by_length:
        out["group_by_length"] = True
    return out


def load_task(task: str, *, unlabeled: bool = False):
    """The prepared task; its unlabelled rows (`distillery.unlabeled`) only when asked (the distillation steps that
    read soft targets)."""
    from distillery.training.task_data import load_prepared

    return load_prepared(paths.task_data(task), unlabeled=unlabeled)


def run_finetune_teacher(p: Params, task: str) -> dict[str, Any]:
    from distillery.task_kinds import task_kind
    from distillery.training.finetune import finetune
    from distillery.training.spec import TrainRun

    kind = task_kind(task, p.data)
    if task in p.teacher.finetuned:
        return _given_teacher(p, task)
    if p.teacher.predicted(task):
        return _predicted_teacher(p, task)
    source = finetune_source(p)
    tokenizer = teacher_tokenizer(p)
    raw = load_task(task)
    data = kind.encode(raw, tokenizer, p.data.max_length)
    compute, main = kind.metrics(raw["dev"], data["dev"], tokenizer.pad_token_id)
    out = paths.teacher(task)
    finetune(kind.load_teacher(source), TrainRun(out, data["train"], data["dev"], tokenizer=tokenizer,
                                                 compute_metrics=compute, main_score=main,
                                                 args=p.teacher_finetune.train_args(p.seed, **kind.train_args)))
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics_file": final / "metrics.json"}


def teacher_tokenizer(p: Params):
    """The tokenizer of the task teachers: `teacher.tokenizer`, else that of where fine-tuning starts (a pre-training
    output holds its own)."""
    from transformers import AutoTokenizer

    source = finetune_source(p)
    own = p.teacher.init == "pretrained" and source == teacher_name(p)
    return AutoTokenizer.from_pretrained(str(resolve(p.teacher.tokenizer)) if own and p.teacher.tokenizer else source)


def _predicted_teacher(p: Params, task: str) -> dict[str, Any]:
    """A teacher known by predictions (`teacher.predictions.<task>`, or the mean of `teacher.ensemble.<task>`'s
    members): checked whole against the task (every training, unlabelled and dev row covered), its dev score computed
    from them (what the gate reads; an ensemble's members' too), and the training rows' soft targets saved as the
    task's teacher with the students' tokenizer; no model, nothing trained."""
    import numpy as np

    from distillery import glue, teacher_predictions
    from distillery.io import atomic_dir, write_json
    from distillery.task_kinds import task_kind

    kind = task_kind(task, p.data)
    data = load_task(task, unlabeled=True)
    splits = [s for s in teacher_predictions.SPLITS if s in data]
    labels = data["dev"]["label"][:]

    def predicted(given, key: str) -> dict[str, Any]:
        """split -> (N, C) logits of one teacher: its file's, or its model's (its own tokenizer, checked first)."""
        if given.model is not None:
            source = _checked_classifier(kind, given.model, key)
            return {s: x.numpy() for s, x in teacher_predictions.model_logits(source, task, data,
                                                                               p.data.max_length).items()}
        predictions = teacher_predictions.read(resolve(given.file), kind.spec, given.values, key)
        return {s: teacher_predictions.logits_for(predictions, data[s], s) for s in splits}

    members: dict[str, dict[str, Any]] = {}
    if task in p.teacher.predictions:
        given = p.teacher.predictions[task]
        logits, meta = predicted(given, f"teacher.predictions.{task}"), {"source": given.source}
    else:
        parts = []
        for i, member in enumerate(p.teacher.ensemble[task]):
            one = predicted(member, f"teacher.ensemble.{task}[{i}]")
            parts.append((one, member.weight))
            members[f"teacher-{member.name or i + 1}"] = {
                **glue.compute_metrics(task, one["dev"], labels), "weight": member.weight, "source": member.source}
        logits, meta = teacher_predictions.mean(parts, kind.spec), {"ensemble": str(len(parts))}
    metrics = glue.compute_metrics(task, logits["dev"], labels)
    train = [s for s in splits if s != "dev"]
    with atomic_dir(paths.teacher(task) / "model") as tmp:
        teacher_tokenizer(p).save_pretrained(tmp)
        teacher_predictions.save_soft_targets(tmp, np.concatenate([np.asarray(data[s]["idx"][:]) for s in train]),
                                              np.concatenate([logits[s] for s in train]),
                                              meta)
        write_json(tmp / "metrics.json", {f"eval_{k}": v for k, v in metrics.items()})
        if members:
            write_json(tmp / teacher_predictions.MEMBERS, members)
    return {"metrics": {f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
            "metrics_file": paths.teacher_metrics(task)}


def _checked_classifier(kind, ref: str, key: str) -> str:
    """A fine-tuned classifier given by the user, checked whole (its files, its head against the task) before it
    runs; where it loads from."""
    from transformers import AutoConfig

    from distillery.models import check_model_files

    source = model_ref(ref)
    if Path(source).is_dir():  # checked whole, before anything loads it (a Hub model: by the Hub's own files)
        check_model_files(source, key)
    kind.check_head(AutoConfig.from_pretrained(source, trust_remote_code=False), f"{key}: {ref}")
    return source


def _given_teacher(p: Params, task: str) -> dict[str, Any]:
    """A teacher the user already fine-tuned (`teacher.finetuned.<task>`): its head checked against the task, saved
    as the task's teacher with its dev metrics (what the gate and the students read), nothing trained."""
    from transformers import AutoTokenizer

    from distillery.io import atomic_dir, write_json
    from distillery.task_kinds import task_kind

    kind = task_kind(task, p.data)
    source = _checked_classifier(kind, p.teacher.finetuned[task], f"teacher.finetuned.{task}")
    # the task's label names; every tensor of its config, its head's too
    model, tokenizer = kind.load_teacher(source, complete=True), AutoTokenizer.from_pretrained(source)
    with atomic_dir(paths.teacher(task) / "model") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        metrics, _ = kind.evaluate(tmp, load_task(task), p.data.max_length)
        write_json(tmp / "metrics.json", {f"eval_{k}": v for k, v in metrics.items()})
    return {"metrics": {f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
            "metrics_file": paths.teacher_metrics(task)}


class TeacherGateError(SkipStage, UserError, RuntimeError):
    """The fine-tuned teacher did not beat its task's trivial baseline: nothing is worth distilling from it. A stage
    body that raises it (through `teacher_gate`) is skipped for that task (tasks.stage.SkipStage); the run goes on
    with the other tasks."""


def trivial_baseline(task: str) -> dict[str, float]:
    """The task's trivial baseline on its dev split, as `prepare_task` wrote it (`paths.trivial`): majority class /
    mean score of the training labels; for a span task the question-overlap sentence baseline
    (`distillery.task_kinds`)."""
    import json

    return json.loads(paths.trivial(task).read_text(encoding="utf-8"))


def beats_trivial(p: Params, score: float, trivial: float) -> bool:
    """The gate's rule: a teacher's main dev score beats the trivial baseline's by
    `teacher_finetune.min_gain_over_trivial`."""
    return score >= trivial + p.teacher_finetune.min_gain_over_trivial


def teacher_main(task: str) -> float:
    """The fine-tuned teacher's main dev score (its metrics.json)."""
    import json

    from distillery.task_kinds import task_kind

    metrics = json.loads(paths.teacher_metrics(task).read_text(encoding="utf-8"))
    return task_kind(task).main_score({k.removeprefix("eval_"): v for k, v in metrics.items()})


def gate_failure(p: Params, task: str) -> TeacherGateError | None:
    """None when the fine-tuned teacher's main dev score beats the trivial baseline by
    `teacher_finetune.min_gain_over_trivial`, else the TeacherGateError saying so (one line: scores, baseline, what to
    change; its `reason` the short form a skipped stage prints)."""
    p = p.for_task(task)
    score = teacher_main(task)
    trivial = trivial_baseline(task)["main"]
    if beats_trivial(p, score, trivial):
        return None
    gain = p.teacher_finetune.min_gain_over_trivial
    return TeacherGateError(
        f"{task}: the fine-tuned teacher scores {score:.4f} on dev, the trivial baseline {trivial:.4f} "
        f"(needed: +{gain}); it has not learned the task, so nothing is distilled for it. "
        f"Train it longer or on more data (teacher_finetune.epochs / learning_rate, data.max_train_examples), or lower "
        f"teacher_finetune.min_gain_over_trivial ({paths.teacher_metrics(task)})",
        f"the {task} teacher failed the gate (dev {score:.4f}, trivial baseline {trivial:.4f}, needed +{gain})")


def teacher_gate(p: Params, task: str) -> None:
    """Raise TeacherGateError unless the fine-tuned teacher of `task` passes the gate (`gate_failure`)."""
    if (failure := gate_failure(p, task)) is not None:
        raise failure


def failed_gates(p: Params) -> list[str]:
    """One line per task whose teacher failed the gate (the tasks that were not distilled)."""
    return [str(f) for task in p.data.tasks if (f := gate_failure(p, task)) is not None]


def _pretrain_deps(p: Params) -> list[Path]:
    deps = [paths.corpus()]
    if p.teacher.init == "pretrained" and (teacher := Path(teacher_name(p))).exists():
        deps.append(teacher)  # a local directory, or the Hub revision's files
    return deps


def _finetune_source_deps(p: Params) -> list[Path]:
    if finetune_source(p) == teacher_source(p) and p.pretrain.enabled:
        return [paths.teacher_mlm() / "model"]
    return _pretrain_deps(p)[1:]


def _given_teacher_deps(p: Params, task: str) -> list[Path]:
    local = Path(model_ref(p.teacher.finetuned[task]))
    return [local] if local.exists() else []


def _teacher_deps(p: Params, task: str) -> list[Path]:
    """What the task's teacher is made from: the model given fine-tuned, or the predictions file and the tokenizer's
    source, or where fine-tuning starts."""
    if task in p.teacher.finetuned:
        return _given_teacher_deps(p, task)
    if p.teacher.predicted(task):
        given = [p.teacher.predictions[task]] if task in p.teacher.predictions else p.teacher.ensemble[task]
        sources = [Path(model_ref(g.model)) if g.model else resolve(g.file) for g in given]
        return [s for s in sources if s.exists()] + _finetune_source_deps(p)
    return _finetune_source_deps(p)


PRETRAIN = Stage(
    "pretrain", run_pretrain, device="shared", distributed=True, curve=True,
    deps=lambda p, _: _pretrain_deps(p),
    outs=lambda p, _: [paths.teacher_mlm() / "model"],
    params=lambda p, _: {"seed": p.seed, "teacher": p.teacher.model_dump(mode="json"),
                         "pretrain": p.pretrain.model_dump(mode="json")},
    code=("distillery/training", "distillery/models.py", "distillery/corpus.py", "tasks/teacher.py"),
)
FINETUNE_TEACHER = Stage(
    "finetune_teacher", run_finetune_teacher, device="shared", distributed=True, curve=True,
    deps=lambda p, t: [paths.task_data(t)] + _teacher_deps(p, t),
    outs=lambda p, t: [paths.teacher(t) / "model"],
    params=lambda p, t: {"seed": p.seed, **encoding(p, t),
                         "teacher_finetune": p.teacher_finetune.model_dump(
                             mode="json", exclude={"min_gain_over_trivial", "stop_on_failed_gate"}),
                         "teacher": p.teacher.model_dump(mode="json")},
    code=("distillery/training", "distillery/models.py", "distillery/glue", "distillery/squad",
          "distillery/task_kinds.py", "distillery/teacher_predictions.py", "tasks/teacher.py"),
)
