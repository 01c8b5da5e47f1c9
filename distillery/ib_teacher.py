"""IB-BERT, MobileBERT's teacher (Sun et al., 2020, Sec. 3.1, Figure 1 (b), Tables 1-2).

BERT with inverted bottlenecks: each layer reads the ``hidden_size``-wide *inter-block* feature map, projects it up
to its own *intra-block* width (``intra_bottleneck_size``; BERT_LARGE's 1024), runs attention and the FFN there,
and projects back down, with a residual connection at the inter-block width. The inter-block width equals the
student's (512 for MobileBERT), so feature-map transfer (eq. 2) and attention transfer (eq. 3) compare teacher
and student directly, with no projection. Built with transformers' ``MobileBertConfig`` (``use_bottleneck``, one
FFN, LayerNorm, gelu; the presets ``ib-bert-large`` and ``ib-bert-large-intra512`` live in ``distillery.models``).

Two ways to get one:

* :func:`scratch_shape` + MLM pre-training (the paper): the student's depth, inter-block width, heads and
  embedding, an intra-block width of twice the inter-block one and FFN 4 x intra (for the ``mobilebert``
  student this is exactly IB-BERT_LARGE, 293M); query, key and value read the inter-block maps, as in the
  official code.
* :func:`convert_bert`: an existing BERT teacher with bottleneck projections inserted around each of its layers:
  the BERT layer becomes the intra-block (its attention, with query/key/value reading the bottleneck output,
  i.e. ``use_bottleneck_attention``, and its FFN, weights copied), the input/output bottleneck linears are new,
  embeddings and MLM head are copied where the widths allow. When the inter-block width is the BERT width the
  result computes what the BERT teacher computes (see :func:`convert_bert`); otherwise MLM training continues until
  it is back near the original's MLM loss (measure both with ``distillery.training.mlm.masked_lm_loss``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from distillery.models import build_student
from distillery.shape import IB_BERT, Dims

if TYPE_CHECKING:  # the shape functions serve params validation, which should not load transformers' model code
    from transformers import PreTrainedModel

__all__ = ["IBShapeError", "ib_teacher_shape", "scratch_shape", "converted_shape", "convert_bert", "embedding_of"]

#: MobileBertConfig's own defaults for the embedding (used when a shape does not set them).
_EMBEDDING_DEFAULTS = {"embedding_size": 128, "trigram_input": True}


class IBShapeError(ValueError):
    """An IB teacher that cannot teach this student (depth, width, heads or embedding differ)."""


def embedding_of(shape: Dims) -> tuple[int, bool]:
    """(embedding_size, trigram_input) of a MobileBERT shape (MobileBertConfig defaults when unset)."""
    extra = {**_EMBEDDING_DEFAULTS, **dict(shape.extra)}
    return int(extra["embedding_size"]), bool(extra["trigram_input"])


def _student_embedding(student: Dims) -> dict[str, Any]:
    size, trigram = embedding_of(student)
    return {"embedding_size": size, "trigram_input": trigram}


def scratch_shape(student: Dims, shape: Dims | None = None) -> Dims:
    """The IB teacher trained from scratch: ``shape`` as given (checked against the student), or the student's
    depth, inter-block width, heads and embedding with intra-block width 2 x inter and FFN 4 x intra."""
    if shape is None:
        intra = 2 * student.hidden
        return Dims(student.layers, student.hidden, student.heads, 4 * intra, arch="mobilebert",
                    extra={**IB_BERT, **_student_embedding(student), "intra_bottleneck_size": intra})
    if shape.arch != "mobilebert":
        raise IBShapeError(f"an IB teacher shape has arch mobilebert (bottlenecks), got {shape.arch}")
    if embedding_of(shape) != embedding_of(student):
        raise IBShapeError(f"the student copies the teacher's embedding: embedding size / trigram "
                           f"{embedding_of(shape)} != the student's {embedding_of(student)}")
    return shape


def converted_shape(student: Dims, teacher) -> Dims:
    """The IB teacher made from a BERT teacher (``teacher``: its ``distillery.shape.Dims``): the teacher's depth,
    heads and FFN, intra-block width = the teacher's hidden size, inter-block width and embedding = the student's;
    query, key and value read the intra-block input (the BERT attention, unchanged)."""
    if teacher.arch != "bert":
        raise IBShapeError(f"init 'convert' inserts bottlenecks into a BERT teacher; the teacher is {teacher.arch}")
    return Dims(
        teacher.layers, student.hidden, teacher.heads, teacher.intermediate, arch="mobilebert",
        extra={**IB_BERT, **_student_embedding(student), "intra_bottleneck_size": teacher.hidden,
               "use_bottleneck_attention": True},
    )


def ib_teacher_shape(student: Dims, init: str, shape: Dims | None, teacher) -> Dims:
    """The IB teacher's shape for a recipe's ``ib_teacher.init`` (``convert`` | ``scratch``)."""
    return converted_shape(student, teacher) if init == "convert" else scratch_shape(student, shape)


#: Gain of an exact converted teacher's output bottleneck over the inter-block residual it adds (see `convert_bert`):
#: that residual moves the layer's output by about 1 / GAIN of its norm.
GAIN = 1000.0


def _identity_(linear: nn.Linear, gain: float = 1.0) -> None:
    nn.init.eye_(linear.weight)
    linear.weight.mul_(gain)
    nn.init.zeros_(linear.bias)


def _unit_(norm: nn.Module) -> None:
    """A LayerNorm without its affine (weight 1, bias 0): it only normalises."""
    nn.init.ones_(norm.weight)
    nn.init.zeros_(norm.bias)


def _copy_(dst: nn.Module, src: nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


def convert_bert(bert: PreTrainedModel, student: Dims, *, exact: bool = True) -> PreTrainedModel:
    """A ``MobileBertForMaskedLM`` IB teacher from a ``BertForMaskedLM`` (see the module docstring; from a BERT with
    another head or none, the MLM head is not copied).

    Copied: every layer's attention (query, key, value, output, LayerNorm) and FFN (intermediate, output,
    LayerNorm) into the intra-block; the input bottleneck's LayerNorm takes the parameters of the LayerNorm that
    produced the BERT layer's input. Word embeddings when the embedding width is the BERT width; position and
    token-type embeddings and the MLM transform when the inter-block width is; with trigram input of that width,
    the embedding transformation starts as the identity on the middle token. The MLM output bias is always copied.

    When the inter-block width is the BERT width, the converted teacher computes what the BERT teacher computes (up
    to about 1 / `GAIN` and the LayerNorm epsilons; tests/test_mobilebert.py): its inter-block maps are the BERT
    layers' outputs normalised without their affine (the embedding LayerNorm, each intra-block's output LayerNorm
    and each output bottleneck's LayerNorm only normalise), each input bottleneck (the identity, then the affine of
    the BERT LayerNorm below) gives the BERT layer its input back exactly, the output bottleneck is `GAIN` times the
    identity so that the residual MobileBERT adds around each block (BERT has none) is drowned, and the last
    LayerNorm's affine is folded into the MLM transform. Otherwise the bottleneck linears start at random and the
    LayerNorms keep their defaults.

    ``exact=False``: the bottleneck linears start as the identity (gain 1) and every LayerNorm keeps BERT's affine, so
    MobileBERT's residual around each block is kept, not drowned: each inter-block map mixes the BERT layer's output
    with the map below, as a MobileBERT block does, and the continued MLM training adapts the teacher to it. Its maps
    are ones a student learning them from random layers (eq. 2) can make; the exact teacher's suit a student cut from
    it, which inherits its function.
    """
    from distillery.shape import Dims

    bc = bert.config
    shape = converted_shape(student, Dims.of_config(bc))
    shape = replace(shape, extra={**shape.extra, "hidden_act": bc.hidden_act, "layer_norm_eps": bc.layer_norm_eps,
                                  "hidden_dropout_prob": bc.hidden_dropout_prob,
                                  "attention_probs_dropout_prob": bc.attention_probs_dropout_prob,
                                  "initializer_range": bc.initializer_range})
    ib = build_student(shape, bc.vocab_size, head="mlm", base=bc)
    cfg, d = ib.config, bc.hidden_size
    b_emb, i_emb = bert.base_model.embeddings, ib.mobilebert.embeddings
    with torch.no_grad():
        if cfg.embedding_size == d:
            i_emb.word_embeddings.weight.copy_(b_emb.word_embeddings.weight)
        square = cfg.hidden_size == d
        if square:
            for name in ("position_embeddings", "token_type_embeddings"):
                _copy_(getattr(i_emb, name), getattr(b_emb, name))
            if exact:
                _unit_(i_emb.LayerNorm)
            else:
                _copy_(i_emb.LayerNorm, b_emb.LayerNorm)
            if cfg.trigram_input and cfg.embedding_size == d:  # [next, current, previous] -> current
                w = i_emb.embedding_transformation.weight
                w.zero_()
                w[:, d:2 * d] = torch.eye(d)
                i_emb.embedding_transformation.bias.zero_()
        below = b_emb.LayerNorm
        for b_layer, i_layer in zip(bert.base_model.encoder.layer, ib.mobilebert.encoder.layer):
            for name in ("query", "key", "value"):
                _copy_(getattr(i_layer.attention.self, name), getattr(b_layer.attention.self, name))
            _copy_(i_layer.attention.output.dense, b_layer.attention.output.dense)
            _copy_(i_layer.attention.output.LayerNorm, b_layer.attention.output.LayerNorm)
            _copy_(i_layer.intermediate.dense, b_layer.intermediate.dense)
            _copy_(i_layer.output.dense, b_layer.output.dense)
            _copy_(i_layer.output.LayerNorm, b_layer.output.LayerNorm)
            _copy_(i_layer.bottleneck.input.LayerNorm, below)
            if square:
                _identity_(i_layer.bottleneck.input.dense)
                _identity_(i_layer.output.bottleneck.dense, GAIN if exact else 1.0)
                if exact:
                    _unit_(i_layer.output.LayerNorm)
                    _unit_(i_layer.output.bottleneck.LayerNorm)
            below = b_layer.output.LayerNorm
        i_head = ib.cls.predictions
        b_head = bert.cls.predictions if hasattr(bert, "cls") else None  # a task model: the MLM head stays as built
        if square and b_head is not None and not exact:
            _copy_(i_head.transform.dense, b_head.transform.dense)
            _copy_(i_head.transform.LayerNorm, b_head.transform.LayerNorm)
        elif square and b_head is not None:  # the transform reads gamma * z + beta in BERT, z here
            dense = b_head.transform.dense
            i_head.transform.dense.weight.copy_(dense.weight * below.weight)
            i_head.transform.dense.bias.copy_(dense.bias + dense.weight @ below.bias)
            _copy_(i_head.transform.LayerNorm, b_head.transform.LayerNorm)
        if b_head is not None:
            i_head.bias.copy_(b_head.bias)
    ib.tie_weights()
    return ib.train(bert.training)
