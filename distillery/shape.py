"""Model shapes: `Dims`, the numbers of a model (a student to build or any model's config), the papers' presets and
`resolve_shape`, which reads a preset name or explicit numbers. Imports neither torch nor transformers, so the params
schema and the recipe checks load without them.

Student presets (parameter counts with vocab 30522, base model incl. pooler; see tests):

* ``tinybert4`` -- TinyBERT_4 (Jiao et al., 2020, Sec. 4.2): M=4, d'=312, d'_i=1200, h=12 (paper: 14.5M).
* ``tinybert6`` -- TinyBERT_6: M=6, d'=768, d'_i=3072, h=12 (paper: 67M).
* ``minilm-l6-h384`` / ``minilm-l4-h384`` / ``minilm-l3-h384`` -- MiniLM shapes (Wang et al., 2020,
  Table 3): 12 heads, intermediate 4 x hidden.
* ``mobilebert`` -- MobileBERT (Sun et al., 2020, Table 1): 24 layers, inter-block 512, intra-block
  bottleneck 128, 128-d embedding with trigram (3-convolution) input, 4 heads, 4 stacked FFNs
  (128-512-128), NoNorm, relu (paper: 25.3M).
* ``mobilebert-tiny`` -- MobileBERT_TINY (Table 1 + Appendix E): as above with 2 stacked FFNs and
  the "lighter MHA" that reads query, key *and* value from the 128-d intra-block maps
  (``use_bottleneck_attention``) (paper: 15.1M; the paper leaves the rest open, we match within 5%).
* ``mobilebert-no-opt`` / ``mobilebert-tiny-no-opt`` -- the same without the operational optimisations
  (Sec. 3.3, Table 4 "MobileBERT w/o OPT"): LayerNorm and gelu, like the IB-BERT teacher.
* ``distilbert6`` -- DistilBERT (Sanh et al., 2019, Sec. 3): 6 layers of a BERT-base teacher,
  initialised from teacher layers [0, 2, 4, 7, 9, 11] (``init_layers``).

IB-BERT teacher presets (MobileBERT Sec. 3.1, Tables 1-2; built like the official config
``uncased_L-24_H-1024_B-512_A-4.json``: LayerNorm, gelu, one FFN, 128-d trigram embedding):

* ``ib-bert-large`` -- IB-BERT_LARGE, Table 2 (f): 24 layers, inter-block 512, intra-block 1024, 4 heads,
  FFN 4096 (paper: 293M). Query, key and value read the 512-d inter-block maps (see
  `distillery.models.inter_block_attention_inputs`).
* ``ib-bert-large-intra512`` -- the scaled-down teacher of Table 2 (g): intra-block 512, FFN 2048 (paper: 92M).
  Smaller teachers come from the recipe (``ib_teacher``: a converted pipeline teacher, or the student's depth,
  width and heads with an intra-block width of twice the inter-block one, see ``distillery.ib_teacher``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Mapping

ARCHS = ("bert", "mobilebert", "distilbert")


class ModelConfigError(ValueError):
    """An impossible model shape, an unknown preset or key, or an unsupported model."""


@dataclass(frozen=True)
class Dims:
    """A model's numbers: depth, width, heads, FFN size, vocabulary and architecture -- a student to build (a preset or
    the params' ``shape``, resolved by `resolve_shape`) or any model read from its config (`Dims.of_config`).

    layers / hidden / heads / intermediate: transformer depth, hidden size (MobileBERT: the inter-block
    feature-map size), attention heads, FFN inner size. ``arch`` is the model type (a student is built as bert |
    distilbert | mobilebert; a teacher's may be any, e.g. deberta-v2); ``extra`` is passed to the student's config
    verbatim (e.g. MobileBERT bottleneck settings); ``init_layers`` lists the teacher layers a DistilBERT-style student
    is initialised from (None = random init); ``vocab`` the vocabulary size where it is known.
    """

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int | None = None
    arch: str = "bert"
    extra: Mapping[str, Any] = field(default_factory=dict)
    init_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "intermediate"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelConfigError(f"student shape: '{name}' must be a positive int, got {v!r}")
        attn_width = self.hidden
        if self.arch == "mobilebert" and self.extra.get("use_bottleneck", True):
            attn_width = int(self.extra.get("intra_bottleneck_size", 128))
        if attn_width % self.heads:
            raise ModelConfigError(
                f"student shape: attention width {attn_width} is not divisible by {self.heads} heads"
            )
        if self.init_layers is not None:
            object.__setattr__(self, "init_layers", tuple(int(i) for i in self.init_layers))
            if len(self.init_layers) != self.layers:
                raise ModelConfigError(
                    f"student shape: init_layers has {len(self.init_layers)} entries for {self.layers} layers"
                )

    @classmethod
    def of_config(cls, cfg: Any) -> "Dims":
        """The numbers of a transformers config (any model type; DistilBERT's names are mapped by the config)."""
        inter = getattr(cfg, "intermediate_size", None) or getattr(cfg, "hidden_dim", 0)
        return cls(int(cfg.num_hidden_layers), int(cfg.hidden_size), int(cfg.num_attention_heads), int(inter),
                   getattr(cfg, "vocab_size", None), cfg.model_type)

    def check_buildable(self) -> "Dims":
        """Self, if a student can be built of it (``arch`` bert | distilbert | mobilebert), else ModelConfigError."""
        if self.arch not in ARCHS:
            raise ModelConfigError(f"student shape: unknown arch {self.arch!r}; expected one of {', '.join(ARCHS)}")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The shape as `resolve_shape` reads it back (the vocabulary is not part of a shape)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "vocab"}
        d["extra"] = dict(self.extra)
        d["init_layers"] = list(self.init_layers) if self.init_layers is not None else None
        return d


_MOBILEBERT_COMMON: dict[str, Any] = {
    "embedding_size": 128,
    "trigram_input": True,
    "use_bottleneck": True,
    "intra_bottleneck_size": 128,
    "normalization_type": "no_norm",
    "hidden_act": "relu",
}

PRESETS: dict[str, Dims | Callable[[], Dims]] = {
    "tinybert4": Dims(4, 312, 12, 1200),
    "tinybert6": Dims(6, 768, 12, 3072),
    "minilm-l6-h384": Dims(6, 384, 12, 1536),
    "minilm-l4-h384": Dims(4, 384, 12, 1536),
    "minilm-l3-h384": Dims(3, 384, 12, 1536),
    "mobilebert": Dims(
        24, 512, 4, 512, arch="mobilebert",
        extra={**_MOBILEBERT_COMMON, "num_feedforward_networks": 4, "key_query_shared_bottleneck": True,
               "use_bottleneck_attention": False},
    ),
    "mobilebert-tiny": Dims(
        24, 512, 4, 512, arch="mobilebert",
        extra={**_MOBILEBERT_COMMON, "num_feedforward_networks": 2, "key_query_shared_bottleneck": False,
               "use_bottleneck_attention": True},
    ),
    "distilbert6": Dims(6, 768, 12, 3072, arch="distilbert", init_layers=(0, 2, 4, 7, 9, 11)),
}

#: The official IB-BERT settings (``uncased_L-24_H-1024_B-512_A-4.json`` + modeling.py defaults).
IB_BERT: dict[str, Any] = {
    "embedding_size": 128,
    "trigram_input": True,
    "use_bottleneck": True,
    "use_bottleneck_attention": False,
    "key_query_shared_bottleneck": False,
    "num_feedforward_networks": 1,
    "normalization_type": "layer_norm",
    "hidden_act": "gelu",
}
_NO_OPT = {"normalization_type": "layer_norm", "hidden_act": "gelu"}  # Sec. 3.3's operational optimisations undone
PRESETS.update({
    "mobilebert-no-opt": replace(PRESETS["mobilebert"], extra={**PRESETS["mobilebert"].extra, **_NO_OPT}),
    "mobilebert-tiny-no-opt": replace(PRESETS["mobilebert-tiny"], extra={**PRESETS["mobilebert-tiny"].extra, **_NO_OPT}),
    "ib-bert-large": Dims(24, 512, 4, 4096, arch="mobilebert", extra={**IB_BERT, "intra_bottleneck_size": 1024}),
    "ib-bert-large-intra512": Dims(24, 512, 4, 2048, arch="mobilebert",
                                           extra={**IB_BERT, "intra_bottleneck_size": 512}),
})

# Parameter counts the papers report (millions), used by the tests.
PAPER_PARAMS_M: dict[str, float] = {
    "tinybert4": 14.5, "tinybert6": 67.0, "mobilebert": 25.3, "mobilebert-tiny": 15.1, "mobilebert-no-opt": 25.3,
    "ib-bert-large": 293.0, "ib-bert-large-intra512": 92.0,
}

_SHAPE_KEYS = {f.name for f in fields(Dims)} - {"vocab"}


def resolve_shape(name_or_dict: str | Mapping[str, Any] | Dims) -> Dims:
    """A preset name, a ``Dims``, or a dict of explicit numbers
    ``{layers, hidden, heads, intermediate[, arch, extra, init_layers]}``; a dict may also name a
    ``preset`` and override some of its fields."""
    if isinstance(name_or_dict, Dims):
        return name_or_dict
    if isinstance(name_or_dict, str):
        key = name_or_dict.strip().lower()
        if key not in PRESETS:
            # shared by student and teacher shapes: the params key in front of the message says whose
            raise ModelConfigError(f"unknown shape preset {name_or_dict!r}; known: {', '.join(sorted(PRESETS))}")
        preset = PRESETS[key]
        return preset() if callable(preset) else preset
    if isinstance(name_or_dict, Mapping):
        d = dict(name_or_dict)
        unknown = set(d) - _SHAPE_KEYS - {"preset"}
        if unknown:
            raise ModelConfigError(
                f"student shape: unknown key(s) {sorted(unknown)}; allowed: preset, {', '.join(sorted(_SHAPE_KEYS))}"
            )
        if "preset" in d:
            base = resolve_shape(d.pop("preset"))
            if "extra" in d:  # overrides on top of the preset's own settings
                d["extra"] = {**base.extra, **d["extra"]}
            return replace(base, **d).check_buildable()
        missing = {"layers", "hidden", "heads", "intermediate"} - set(d)
        if missing:
            raise ModelConfigError(f"student shape: missing key(s) {sorted(missing)}")
        return Dims(**d).check_buildable()
    raise ModelConfigError(f"student shape must be a preset name or a dict, got {type(name_or_dict).__name__}")
