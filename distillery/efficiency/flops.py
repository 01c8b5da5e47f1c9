"""Analytic FLOPs per example of a BERT-family encoder, counted from its config (BERT, RoBERTa, XLM-R, CamemBERT,
ELECTRA, DistilBERT, MobileBERT, ModernBERT; DeBERTa's relative-position attention is not counted: no figure).

Convention (the one the TinyBERT paper's Table 1 "#FLOPs" column and the MobileBERT paper's Table 4
use for BERT-base = 22.5B at sequence length 128): one multiply-add is 2 FLOPs; every dense layer
applied to every token counts; the two attention products, Q K^T and softmax(.) V (Vaswani et al.
2017, Eq. 1) count (2 * T^2 * d_attention multiply-adds per layer); embedding lookups are free;
biases, LayerNorm, softmax and activations are not counted (they are < 1% of the total); the
pooler and classifier run on the [CLS] vector only; an MLM head is counted only when asked for.

With this convention BERT-base at length 128 gives 22.3B (paper: 22.5B, -0.8%) and TinyBERT4
(4 layers, d=312, d_i=1200) 1.25B (paper: 1.2B, the paper's figure rounded to 2 digits; +3.9%).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Head = Literal["none", "classifier", "mlm"]


class FlopsConfigError(ValueError):
    """The config is not of a counted type (``COUNTED``), or a value is impossible."""


@dataclass(frozen=True)
class FlopsBreakdown:
    """FLOPs of one example, split by part (all values already x2 for multiply-adds)."""

    embedding: int
    linear: int  # dense layers of all transformer layers
    attention: int  # Q K^T and A V products of all transformer layers
    head: int

    @property
    def total(self) -> int:
        return self.embedding + self.linear + self.attention + self.head

    def as_dict(self) -> dict[str, int]:
        return {"embedding": self.embedding, "linear": self.linear, "attention": self.attention,
                "head": self.head, "total": self.total}


def _get(config: Any, key: str) -> Any:
    if isinstance(config, dict):
        if key not in config:
            raise FlopsConfigError(f"config has no key {key!r} needed to count FLOPs")
        return config[key]
    if not hasattr(config, key):
        raise FlopsConfigError(f"{type(config).__name__} has no attribute {key!r} needed to count FLOPs")
    return getattr(config, key)


#: Encoders with BERT's layer (Q, K, V, O, a two-matrix FFN) under other names: counted as BERT (ELECTRA's factorised
#: embedding adds its projection).
BERT_LAYOUT = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
COUNTED = (*BERT_LAYOUT, "distilbert", "mobilebert", "modernbert")


def _model_type(config: Any) -> str:
    mt = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    if mt not in COUNTED:
        raise FlopsConfigError(f"cannot count FLOPs for model_type {mt!r}; expected one of {', '.join(COUNTED)}")
    return mt


def _num_labels(config: Any) -> int:
    if isinstance(config, dict):
        return int(config.get("num_labels", len(config.get("id2label", {})) or 2))
    return int(getattr(config, "num_labels", 2))


def flops_breakdown(config: Any, seq_len: int = 128, *, head: Head = "classifier") -> FlopsBreakdown:
    """Per-part FLOPs of one example of `seq_len` tokens for a config of a ``COUNTED`` type.

    `config` is a transformers PretrainedConfig or its dict (config.json). `head`: "classifier"
    (pooler + classifier on [CLS]), "mlm" (prediction head on every token), "none" (encoder only).
    """
    if not isinstance(seq_len, int) or seq_len < 1:
        raise FlopsConfigError(f"seq_len must be a positive int, got {seq_len!r}")
    if head not in ("none", "classifier", "mlm"):
        raise FlopsConfigError(f"head must be 'none', 'classifier' or 'mlm', got {head!r}")
    mt = _model_type(config)
    T = seq_len
    labels = _num_labels(config)
    if mt in BERT_LAYOUT or mt == "modernbert":
        L, d, di = _get(config, "num_hidden_layers"), _get(config, "hidden_size"), _get(config, "intermediate_size")
        V = _get(config, "vocab_size")
        # Q, K, V, O + FFN in/out (ModernBERT's GLU: its input matrix is twice as wide)
        per_token = 4 * d * d + (3 if mt == "modernbert" else 2) * d * di
        e = (config.get("embedding_size") if isinstance(config, dict) else getattr(config, "embedding_size", None)) or d
        emb = T * e * d if e != d else 0  # ELECTRA's embedding projection
        d_att = d
        head_macs = {"none": 0, "classifier": d * d + d * labels, "mlm": T * (d * d + d * V)}[head]
    elif mt == "distilbert":
        L, d, di = _get(config, "n_layers"), _get(config, "dim"), _get(config, "hidden_dim")
        V = _get(config, "vocab_size")
        per_token = 4 * d * d + 2 * d * di
        emb = 0
        d_att = d
        head_macs = {"none": 0, "classifier": d * d + d * labels, "mlm": T * (d * d + d * V)}[head]
    else:  # mobilebert (Sun et al. 2020, Table 1): bottlenecks, stacked FFNs, trigram embedding
        L, h = _get(config, "num_hidden_layers"), _get(config, "hidden_size")
        di, e = _get(config, "intermediate_size"), _get(config, "embedding_size")
        V = _get(config, "vocab_size")
        use_bneck = bool(_get(config, "use_bottleneck"))
        t = _get(config, "intra_bottleneck_size") if use_bneck else h  # true_hidden_size
        n_ffn = int(_get(config, "num_feedforward_networks"))
        bneck_att = bool(_get(config, "use_bottleneck_attention"))
        kq_shared = bool(_get(config, "key_query_shared_bottleneck"))
        per_token = 0
        if use_bneck:
            per_token += h * t  # bottleneck.input
            if kq_shared and not bneck_att:
                per_token += h * t  # bottleneck.attention (shared Q/K input)
            per_token += t * h  # output bottleneck back to h
        per_token += 2 * t * t + (t if bneck_att else h) * t + t * t  # Q, K, V, O
        per_token += n_ffn * 2 * t * di  # (n_ffn - 1) stacked FFNs + the final one
        in_mult = 3 if _get(config, "trigram_input") else 1
        emb = T * (in_mult * e * h) if (in_mult > 1 or e != h) else 0
        d_att = t
        act = config.get("classifier_activation", True) if isinstance(config, dict) else getattr(
            config, "classifier_activation", True)
        pool = h * h if act else 0  # MobileBertPooler has a dense layer only with classifier_activation
        head_macs = {"none": 0, "classifier": pool + h * labels,
                     "mlm": T * (h * h + h * (h - e) + h * V)}[head]
    for name, v in (("layers", L), ("hidden", d_att), ("intermediate", di)):
        if not isinstance(v, int) or v < 1:
            raise FlopsConfigError(f"config {name} must be a positive int, got {v!r}")
    linear = L * T * per_token
    attention = L * 2 * T * T * d_att
    return FlopsBreakdown(embedding=2 * emb, linear=2 * linear, attention=2 * attention, head=2 * head_macs)


def flops_per_example(config: Any, seq_len: int = 128, *, head: Head = "classifier") -> int:
    """Total FLOPs (2 x multiply-adds) for one example of `seq_len` tokens; see the module docstring."""
    return flops_breakdown(config, seq_len, head=head).total


def flops_if_counted(config: Any, seq_len: int = 128, *, head: Head = "classifier") -> int | None:
    """`flops_per_example`, or None for a config it cannot count (a model type outside ``COUNTED``, e.g. DeBERTa)."""
    try:
        return flops_per_example(config, seq_len, head=head)
    except FlopsConfigError:
        return None
