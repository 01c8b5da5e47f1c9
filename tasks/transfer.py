"""MobileBERT stages (Sun et al., 2020), per MobileBERT student that is not initialised from a checkpoint:

* `ib_teacher`: the IB-BERT teacher, whose inter-block width is the student's: the pipeline's MLM teacher with
  bottlenecks inserted and continued MLM training (`ib_teacher.init: convert`), or MLM from scratch (`scratch`);
  logs the MLM loss of the original teacher, of the converted one before training and of the IB teacher;
* `knowledge_transfer`: progressive or joint layer-wise transfer (feature maps + attention) from it;
* pre-training distillation (eq. 4) runs as the student's `general_distillation` stage
  (`run_pretraining_distillation`), after the transfer (or, for `transfer: auxiliary`, with the layer-wise terms
  in the same loss).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks import paths
from tasks.distill import TRAINING_CODE, _corpus_dataset, _student_params, _teacher_source_deps
from tasks.launch import distributed, distributed_params
from tasks.stage import Stage
from tasks.teacher import finish, teacher_source, train_options

from distillery.config import Params

#: Corpus sequences on which the teachers' MLM losses are compared (same masks for every model).
MLM_EVAL_SEQUENCES = 256


def mobilebert_students(p: Params, *, transfer_stage: bool = False) -> list[str]:
    """MobileBERT students that go through the IB teacher (and, with `transfer_stage`, a separate transfer stage)."""
    from distillery.recipes import MobileBertRecipe

    return [s for s, r in p.students.items() if isinstance(r, MobileBertRecipe) and r.runs_general
            and (r.runs_transfer or not transfer_stage)]


def run_ib_teacher(p: Params, student: str) -> dict[str, Any]:
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    from distillery import corpus
    from distillery.ib_teacher import convert_bert, scratch_shape
    from distillery.models import build_student
    from distillery.training.mlm import masked_lm_loss, train_mlm

    recipe = p.students[student]
    spec, pt = recipe.ib_teacher, p.pretrain
    source = teacher_source(p)
    tokenizer = AutoTokenizer.from_pretrained(source)
    texts = corpus.pack_sequences(corpus.read_sentences(paths.corpus()), tokenizer, pt.max_length)

    def mlm_loss(model) -> float:
        return masked_lm_loss(model, tokenizer, texts[:MLM_EVAL_SEQUENCES], max_length=pt.max_length,
                              mlm_probability=pt.mlm_probability, seed=p.seed)

    metrics: dict[str, Any] = {}
    shape = recipe.shape.resolve()
    if spec.init == "convert":
        original = AutoModelForMaskedLM.from_pretrained(source)
        metrics["mlm_loss_original"] = mlm_loss(original)
        model = convert_bert(original, shape)
        metrics["mlm_loss_converted"] = mlm_loss(model)
    else:
        ib_shape = scratch_shape(shape, spec.shape.resolve() if spec.shape is not None else None)
        model = build_student(ib_shape, len(tokenizer), head="mlm", base=AutoConfig.from_pretrained(source))
    out = paths.ib_teacher(student)
    train_mlm(model, tokenizer, texts, out, max_length=pt.max_length, mlm_probability=pt.mlm_probability,
              args=train_options(pt, p.seed, num_train_epochs=spec.epochs or pt.epochs))
    final = finish(out)
    metrics["mlm_loss_ib_teacher"] = mlm_loss(model)
    cfg = model.config
    metrics.update({"inter_block": cfg.hidden_size, "intra_block": cfg.intra_bottleneck_size,
                    "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads, "sequences": len(texts)})
    return {"curve": final / "train_log.csv", "metrics": metrics}


def _ib_teacher(student: str):
    from transformers import AutoTokenizer

    from distillery.models import load_model

    source = paths.ib_teacher(student) / "model"
    return load_model(source, head="mlm"), AutoTokenizer.from_pretrained(str(source))


def _student_head(recipe) -> str:
    return "pretraining" if recipe.next_sentence_prediction else "mlm"


def run_knowledge_transfer(p: Params, student: str) -> dict[str, Any]:
    from distillery.training.progressive_transfer import joint_transfer, progressive_transfer, student_from_teacher

    recipe = p.students[student]
    teacher, tokenizer = _ib_teacher(student)
    model = student_from_teacher(recipe.shape.resolve(), teacher, head=_student_head(recipe))
    train, n = _corpus_dataset(p, tokenizer)
    common = dict(objectives=recipe.weights, epochs=recipe.transfer_epochs, tokenizer=tokenizer,
                  args=train_options(p.general_distillation, p.seed), **recipe.options())
    out = paths.knowledge_transfer(student)
    if recipe.transfer == "progressive":
        progressive_transfer(teacher, model, train, out, lower_layer_lr_scale=recipe.lower_layer_lr_scale, **common)
    else:
        joint_transfer(teacher, model, train, out, **common)
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics": {"sequences": n, "layers": teacher.config.num_hidden_layers}}


def run_pretraining_distillation(p: Params, student: str) -> dict[str, Any]:
    """The MobileBERT student's `general_distillation` stage: eq. 4 (+ the layer-wise terms for `auxiliary`)."""
    from distillery import corpus
    from distillery.models import load_model
    from distillery.training.pretraining_distillation import nsp_dataset, pretraining_distillation
    from distillery.training.progressive_transfer import student_from_teacher

    recipe = p.students[student]
    gd = p.general_distillation
    teacher, tokenizer = _ib_teacher(student)
    if recipe.runs_transfer:
        model = load_model(paths.knowledge_transfer(student) / "model", head=_student_head(recipe))
    else:
        model = student_from_teacher(recipe.shape.resolve(), teacher, head=_student_head(recipe))
    if recipe.next_sentence_prediction:
        pairs = corpus.sentence_pairs(corpus.read_sentences(paths.corpus()), tokenizer, gd.max_length, seed=p.seed)
        train, n = nsp_dataset(pairs, tokenizer, gd.max_length), len(pairs)
    else:
        train, n = _corpus_dataset(p, tokenizer)
    out = paths.general_student(student)
    pretraining_distillation(teacher, model, train, out, tokenizer=tokenizer, alpha=recipe.alpha,
                             mlm_probability=recipe.mlm_probability, max_length=gd.max_length,
                             layer_wise=None if recipe.runs_transfer else dict(recipe.weights.weights),
                             args=train_options(gd, p.seed), **recipe.options())
    final = finish(out)
    return {"curve": final / "train_log.csv", "metrics": {"sequences": n}}


def pretraining_distillation_deps(p: Params, student: str) -> list[Path]:
    """Inputs of a MobileBERT student's pre-training distillation besides the corpus."""
    deps = [paths.ib_teacher(student) / "model"]
    return deps + ([paths.knowledge_transfer(student) / "model"] if p.students[student].runs_transfer else [])


IB_TEACHER = Stage(
    "ib_teacher", distributed(run_ib_teacher), device="shared",
    deps=lambda p, s: [paths.corpus()] + _teacher_source_deps(p),
    outs=lambda p, s: [paths.ib_teacher(s) / "model"],
    params=lambda p, s: {"seed": p.seed, "student": p.students[s].model_dump(mode="json"),
                         "pretrain": p.pretrain.model_dump(mode="json"), **distributed_params(p)},
    code=TRAINING_CODE + ("distillery/ib_teacher.py", "distillery/corpus.py", "tasks/transfer.py"),
)
KNOWLEDGE_TRANSFER = Stage(
    "knowledge_transfer", distributed(run_knowledge_transfer), device="shared",
    deps=lambda p, s: [paths.corpus(), paths.ib_teacher(s) / "model"],
    outs=lambda p, s: [paths.knowledge_transfer(s) / "model"],
    params=_student_params,
    code=TRAINING_CODE + ("distillery/corpus.py", "tasks/distill.py", "tasks/transfer.py"),
)
