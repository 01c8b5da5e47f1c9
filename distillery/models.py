"""Teachers and students: configs, construction, loading, and layer-subset initialisation.

Shapes, presets and `resolve_shape`: `distillery.shape`.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig

from distillery.errors import UserError
from distillery.shape import ARCHS, Dims, ModelConfigError, resolve_shape

if TYPE_CHECKING:  # importing it loads transformers' modeling code (~4 s): a stage that finds itself fresh needs none
    from transformers import PreTrainedModel

__all__ = [
    "Dims",
    "ModelConfigError",
    "resolve_shape",
    "student_config",
    "build_student",
    "load_teacher",
    "init_from_teacher_layers",
    "inter_block_attention_inputs",
    "load_model",
    "check_weights",
    "ModelFilesError",
    "num_layers",
    "num_heads",
    "hidden_size",
    "num_parameters",
]

HEADS = ("base", "sequence-classification", "question-answering", "mlm", "pretraining")


def _inherit(base: PretrainedConfig | None) -> dict[str, Any]:
    """Fields a student takes from its teacher's config: vocab, positions, token types, pad id."""
    if base is None:
        return {}
    out: dict[str, Any] = {}
    for key in ("vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id"):
        value = getattr(base, key, None)
        if value is not None:
            out[key] = value
    return out


def student_config(
    shape: Dims | str | Mapping[str, Any],
    vocab_size: int | None,
    *,
    base: PretrainedConfig | None = None,
    num_labels: int | None = None,
) -> PretrainedConfig:
    """HF config for ``shape``. ``base`` (a teacher config) supplies max positions, token-type vocab,
    pad id and, when ``vocab_size`` is None, the vocab size; with a teacher of another BERT-family type (RoBERTa,
    XLM-R, ELECTRA, DeBERTa-v2, ModernBERT), a ``bert`` shape is a student of the teacher's own type."""
    shape = resolve_shape(shape).check_buildable()
    inherited = _inherit(base)
    if vocab_size is None:
        if "vocab_size" not in inherited:
            raise ModelConfigError("student_config: vocab_size is None and no base config to inherit it from")
        vocab_size = inherited["vocab_size"]
    inherited["vocab_size"] = int(vocab_size)
    if shape.arch == "distilbert":
        inherited.pop("type_vocab_size", None)  # DistilBERT has no token-type embeddings
        cfg: PretrainedConfig = transformers.DistilBertConfig(
            dim=shape.hidden, n_layers=shape.layers, n_heads=shape.heads, hidden_dim=shape.intermediate,
            **inherited, **dict(shape.extra),
        )
    elif shape.arch == "mobilebert":
        cfg = transformers.MobileBertConfig(
            hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
            intermediate_size=shape.intermediate, **inherited, **dict(shape.extra),
        )
    elif base is not None and base.model_type not in ARCHS:
        cfg = _teacher_type(base, shape, inherited)
    else:
        cfg = transformers.BertConfig(
            hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
            intermediate_size=shape.intermediate, **inherited, **dict(shape.extra),
        )
    if num_labels is not None:
        cfg.num_labels = int(num_labels)
    return cfg


#: A teacher's config fields that describe that model and not its type (the student gets its own).
_OWN_FIELDS = ("architectures", "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "_name_or_path",
               "transformers_version", "dtype", "torch_dtype", "layer_types")


def _teacher_type(base: PretrainedConfig, shape: Dims, inherited: dict[str, Any]) -> PretrainedConfig:
    """A ``bert``-arch student of a teacher of another BERT-family type (RoBERTa, XLM-R, ELECTRA, DeBERTa-v2,
    ModernBERT, ...): the teacher's own model type and settings (positions, attention kind, activation, norms) with
    the student's depth and widths; sizes tied to the teacher's width (ELECTRA's unfactorised embedding, DeBERTa's
    pooler) follow the student's."""
    d = {k: v for k, v in base.to_dict().items() if k not in _OWN_FIELDS}
    for tied in ("embedding_size", "pooler_hidden_size"):
        if d.get(tied) == base.hidden_size:
            d[tied] = shape.hidden
    d.update(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
             intermediate_size=shape.intermediate, **inherited, **dict(shape.extra))
    return transformers.AutoConfig.for_model(d.pop("model_type"), **d)


def _auto_class(head: str) -> Any:
    if head == "base":
        return transformers.AutoModel
    if head == "sequence-classification":
        return transformers.AutoModelForSequenceClassification
    if head == "question-answering":
        return transformers.AutoModelForQuestionAnswering
    if head == "mlm":
        return transformers.AutoModelForMaskedLM
    if head == "pretraining":
        return transformers.AutoModelForPreTraining
    raise ModelConfigError(f"unknown head {head!r}; expected one of {', '.join(HEADS)}")


def build_student(
    shape: Dims | str | Mapping[str, Any],
    vocab_size: int | None,
    *,
    head: str = "base",
    num_labels: int = 2,
    base: PretrainedConfig | None = None,
) -> PreTrainedModel:
    """A randomly initialised student (HF model class, SDPA attention) with the requested head."""
    cls = _auto_class(head)
    cfg = student_config(shape, vocab_size, base=base, num_labels=num_labels if head == "sequence-classification" else None)
    return inter_block_attention_inputs(cls.from_config(cfg))


_DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",  # BERT, MobileBERT
                 "dropout", "attention_dropout", "seq_classif_dropout")                    # DistilBERT


def set_dropout(model: PreTrainedModel, p: float) -> PreTrainedModel:
    """Every dropout of ``model`` (embeddings, attention, feed-forward, classifier) set to ``p``, in its modules and
    in its config, so that a ``save_pretrained`` copy loads back with the same rate."""
    for key in _DROPOUT_KEYS:
        if hasattr(model.config, key):
            setattr(model.config, key, p)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = p
    return model


def reads_inter_block_maps(cfg: PretrainedConfig) -> bool:
    """A MobileBERT config whose query, key and value read the inter-block feature maps, as in the official
    IB-BERT (``use_bottleneck`` without ``use_bottleneck_attention`` / ``key_query_shared_bottleneck``) with an
    intra-block width that differs from the inter-block one."""
    return (getattr(cfg, "model_type", None) == "mobilebert" and cfg.use_bottleneck
            and not cfg.use_bottleneck_attention and not cfg.key_query_shared_bottleneck
            and cfg.intra_bottleneck_size != cfg.hidden_size)


def inter_block_attention_inputs(model: PreTrainedModel) -> PreTrainedModel:
    """The official IB-BERT attention (``modeling.py`` of the MobileBERT release: ``query_tensor = key_tensor =
    value_tensor = prev_output``): transformers' ``MobileBertSelfAttention`` builds query and key for
    ``true_hidden_size`` (intra-block) inputs although, with both bottleneck-attention switches off, it feeds them
    the ``hidden_size`` (inter-block) maps; replace them by ``hidden_size -> intra`` projections. A no-op for every
    other config. Such a model is saved with ``save_pretrained`` and loaded back with :func:`load_model`."""
    if not reads_inter_block_maps(model.config):
        return model
    cfg = model.config
    for layer in model.base_model.encoder.layer:
        attn = layer.attention.self
        attn.query = nn.Linear(cfg.hidden_size, attn.all_head_size)
        attn.key = nn.Linear(cfg.hidden_size, attn.all_head_size)
        for lin in (attn.query, attn.key):
            nn.init.normal_(lin.weight, std=cfg.initializer_range)
            nn.init.zeros_(lin.bias)
    return model


@contextlib.contextmanager
def quiet_loading():
    """transformers' load report and "Loading weights" bar off while a command loads a model whose only console
    output should be its own lines (or one error line)."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


class ModelFilesError(UserError, ValueError):
    """A saved model directory whose weights are missing or cannot be read (truncated, not safetensors)."""


def check_weights(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of a `save_pretrained` directory, each checked before anything loads it: one of the
    weight files transformers looks for must be there (model.safetensors, its sharded index, pytorch_model.bin or its
    index), and every safetensors file must be whole (safetensors' own reader opens it: header and data extent,
    nothing loaded). Raises ModelFilesError naming the directory or file otherwise."""
    import json

    from safetensors import SafetensorError, safe_open
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    path = Path(path)
    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    found = next((path / n for n in names if (path / n).is_file()), None)
    if found is None:
        raise ModelFilesError(f"{path}: no model weights (none of {', '.join(names)}); give a directory written by "
                              "save_pretrained, with its weights")
    files = [found] if found.name == SAFE_WEIGHTS_NAME else []
    if found.name == SAFE_WEIGHTS_INDEX_NAME:
        try:
            files = [path / f for f in sorted(set(json.loads(found.read_text(encoding="utf-8"))["weight_map"].values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelFilesError(f"{found}: not a readable shard index ({exc})") from None
    for f in files:
        if not f.is_file():
            raise ModelFilesError(f"{f}: not found, but {found.name} lists it; copy or save the model again")
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise ModelFilesError(f"{f}: cannot be read ({exc}); the file is truncated or damaged: copy or save the "
                                  "model again") from None
    return files


def load_model(path: str | os.PathLike, *, head: str = "base", **config: Any) -> PreTrainedModel:
    """A saved model by its head (``AutoModel*.from_pretrained``, ``config`` overriding its config: label settings),
    including an IB-BERT whose attention reads the inter-block maps (:func:`inter_block_attention_inputs`; built
    from its config, then its weights loaded)."""
    from safetensors.torch import load_file

    cls = _auto_class(head)
    cfg = transformers.AutoConfig.from_pretrained(str(path), **config)
    if not reads_inter_block_maps(cfg):
        return cls.from_pretrained(str(path), **config)
    model = inter_block_attention_inputs(cls.from_config(cfg))
    state = load_file(str(Path(path) / "model.safetensors"))
    result = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ModelConfigError(f"load_model {path}: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    model.tie_weights()
    return model.eval()


def _looks_local(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~"))
        or name.endswith(("/", os.sep))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    )


#: the files a tokenizer is read from (any one)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer.model", "spiece.model", "vocab.json", "sentencepiece.bpe.model")


def check_model_files(path: str | os.PathLike, key: str) -> None:
    """A model directory checked whole before any work, without loading it: its config.json is a JSON object and asks
    for no code of its own (``auto_map``: nothing runs remote code here), its weights are safetensors (a pickle-only
    checkpoint can run code when loaded: refused, with the way to convert it) and whole (`check_weights`), a
    tokenizer is there and its vocabulary fits the embeddings. Raises ModelFilesError naming ``key`` and the file."""
    import json

    path = Path(path)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFilesError(f"{key}: {path / 'config.json'} is not a JSON model config ({exc})") from None
    if not isinstance(config, dict):
        raise ModelFilesError(f"{key}: {path / 'config.json'} is not a JSON object")
    if config.get("auto_map"):
        raise ModelFilesError(f"{key}: {path / 'config.json'} asks for its own model code (auto_map: "
                              f"{', '.join(config['auto_map'])}); code shipped with a model never runs here: give a "
                              "model of a type transformers knows")
    if not any(path.glob("*.safetensors")) and any((path / n).is_file() for n in ("pytorch_model.bin",
                                                                                  "pytorch_model.bin.index.json")):
        raise ModelFilesError(f"{key}: {path} holds only pickled weights (pytorch_model.bin), which can run code when "
                              "loaded; convert them once where you trust the file (AutoModel...from_pretrained(d)"
                              ".save_pretrained(d, safe_serialization=True)) and give the safetensors")
    try:
        check_weights(path)
    except ModelFilesError as exc:
        raise ModelFilesError(f"{key}: {exc}") from None
    if not any((path / n).is_file() for n in TOKENIZER_FILES):
        raise ModelFilesError(f"{key}: {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the "
                              "tokenizer with the model (tokenizer.save_pretrained)")
    vocab = config.get("vocab_size")
    if isinstance(vocab, int):
        from transformers import AutoTokenizer

        with quiet_loading():
            size = len(AutoTokenizer.from_pretrained(str(path), trust_remote_code=False))
        if size > vocab:
            raise ModelFilesError(f"{key}: {path}: the tokenizer has {size} tokens but the embeddings hold {vocab} "
                                  "(config.json vocab_size): ids past it have no embedding; save the tokenizer the "
                                  "model was trained with")


def load_teacher(
    name_or_path: str | os.PathLike,
    *,
    head: str = "sequence-classification",
    num_labels: int | None = None,
    regression: bool = False,
    complete: bool = False,
) -> PreTrainedModel:
    """Load a teacher with ``AutoModel*`` from a local directory or a Hub name (never remote code).

    ``complete``: every tensor of the config's model is in the weights and nothing else (a fine-tuned teacher:
    its head too), else ModelFilesError naming what is missing or left over.

    ``regression`` makes a 1-output regression head (STS-B). A missing local directory raises
    ``FileNotFoundError`` naming it. The model is returned in eval mode.
    """
    cls = _auto_class(head)
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(f"teacher {name!r} is a file, expected a model directory")
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"teacher directory {name!r} has no config.json")
        name = str(path)
    elif isinstance(name_or_path, os.PathLike) or _looks_local(name):
        raise FileNotFoundError(f"teacher directory {name!r} does not exist")
    kwargs: dict[str, Any] = {}
    if head == "sequence-classification":
        if regression:
            if num_labels not in (None, 1):
                raise ModelConfigError(f"regression teacher needs num_labels=1, got {num_labels}")
            kwargs.update(num_labels=1, problem_type="regression")
        elif num_labels is not None:
            kwargs["num_labels"] = int(num_labels)
    try:
        model, info = cls.from_pretrained(name, trust_remote_code=False, output_loading_info=True, **kwargs)
    except OSError as exc:
        raise FileNotFoundError(f"cannot load teacher {name!r}: {exc}") from exc
    if complete:
        wrong = {k: sorted(map(str, v)) for k, v in info.items()
                 if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if wrong:
            raise ModelFilesError(f"teacher {name!r}: its weights do not fit its config.json ("
                                  + "; ".join(f"{k.replace('_', ' ')}: {', '.join(map(str, v[:3]))}"
                                              + (f" and {len(v) - 3} more" if len(v) > 3 else "")
                                              for k, v in wrong.items()) + "): save the model and its config again")
    if path.exists():
        _warn_half_weights(path)
    return model.eval()


def _warn_half_weights(path: Path) -> None:
    """Warn when a model directory's safetensors hold float16/bfloat16 tensors while its config.json says float32 (or
    no dtype): weights halved on the way (e.g. a bundle's, never made float32 again) load as half precision."""
    import json
    import warnings

    from safetensors import safe_open

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if (config.get("dtype") or config.get("torch_dtype") or "float32") != "float32":
        return
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            half = sum(st.get_slice(k).get_dtype() in ("F16", "BF16") for k in st.keys())
        if half:
            warnings.warn(f"{f}: {half} tensors are half precision on disk while {path / 'config.json'} expects "
                          "float32: the teacher loads as half precision (copy its float32 weights again; from a "
                          "bundle: `python -m benchmarks.gpu_bundle unpack`)", stacklevel=2)


def num_layers(model_or_config: nn.Module | PretrainedConfig) -> int:
    """Number of transformer layers (BERT/MobileBERT ``num_hidden_layers``, DistilBERT ``n_layers``)."""
    return int(_config(model_or_config).num_hidden_layers)


def num_heads(model_or_config: nn.Module | PretrainedConfig) -> int:
    """Attention heads per layer."""
    return int(_config(model_or_config).num_attention_heads)


def hidden_size(model_or_config: nn.Module | PretrainedConfig) -> int:
    """Width of the hidden states (MobileBERT: the inter-block feature-map size, 512)."""
    return int(_config(model_or_config).hidden_size)


def num_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Parameter count, tied weights counted once."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def _config(model_or_config: nn.Module | PretrainedConfig) -> PretrainedConfig:
    cfg = model_or_config if isinstance(model_or_config, PretrainedConfig) else getattr(model_or_config, "config", None)
    if cfg is None:
        raise ModelConfigError(f"{type(model_or_config).__name__} has no HF config")
    return cfg


# ---------------------------------------------------------------- layer-subset initialisation

_LAYER_KEY = re.compile(r"^(.*?(?:(?:encoder|transformer)\.layer|layers)\.)(\d+)(\..*)$")


def _copy_(dst: nn.Module, src: nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


def _check_layers(teacher: PreTrainedModel, layers: Sequence[int]) -> list[int]:
    n = num_layers(teacher)
    out = [int(i) for i in layers]
    if not out:
        raise ModelConfigError("init_from_teacher_layers: empty layer list")
    for i in out:
        if not 0 <= i < n:
            raise ModelConfigError(f"init_from_teacher_layers: teacher layer {i} out of range 0..{n - 1}")
    if len(set(out)) != len(out):
        raise ModelConfigError(f"init_from_teacher_layers: duplicate teacher layer in {out}")
    return out


def _remap(key: str, layers: list[int]) -> str:
    m = _LAYER_KEY.match(key)
    return f"{m.group(1)}{layers[int(m.group(2))]}{m.group(3)}" if m else key


def _same_arch_subset(teacher: PreTrainedModel, layers: list[int], head: str | None) -> PreTrainedModel:
    cfg = copy.deepcopy(teacher.config)
    cfg.num_hidden_layers = len(layers)
    if isinstance(getattr(cfg, "layer_types", None), list):  # ModernBERT: each kept layer keeps its attention kind
        cfg.layer_types = [cfg.layer_types[i] for i in layers]
    student = type(teacher)(cfg) if head is None else _auto_class(head).from_config(cfg)
    if type(student) is type(teacher):  # every weight, heads included
        source = teacher.state_dict()
        student.load_state_dict({k: source[_remap(k, layers)] for k in student.state_dict()})
        return student
    source = teacher.base_model.state_dict()  # another head: copy the encoder, keep the new head
    target = student.base_model
    state = {k: source[_remap(k, layers)] for k in target.state_dict() if _remap(k, layers) in source}
    missing = target.load_state_dict(state, strict=False).missing_keys
    if any("pooler" not in k for k in missing):
        raise ModelConfigError(f"init_from_teacher_layers: teacher lacks weights {missing[:5]}")
    return student


def _bert_to_distilbert(
    teacher: PreTrainedModel, layers: list[int], fold_token_type: bool, head: str | None
) -> PreTrainedModel:
    tc = teacher.config
    cfg = transformers.DistilBertConfig(
        vocab_size=tc.vocab_size, max_position_embeddings=tc.max_position_embeddings, n_layers=len(layers),
        n_heads=tc.num_attention_heads, dim=tc.hidden_size, hidden_dim=tc.intermediate_size,
        dropout=tc.hidden_dropout_prob, attention_dropout=tc.attention_probs_dropout_prob,
        activation=tc.hidden_act, pad_token_id=tc.pad_token_id, initializer_range=tc.initializer_range,
    )
    if getattr(tc, "layer_norm_eps", 1e-12) != 1e-12:
        raise ModelConfigError(
            f"init_from_teacher_layers: DistilBERT fixes LayerNorm eps to 1e-12, teacher uses {tc.layer_norm_eps}"
        )
    has_mlm = hasattr(teacher, "cls") and hasattr(teacher.cls, "predictions")
    if head is None:
        is_cls = isinstance(teacher, transformers.BertForSequenceClassification)
        is_qa = isinstance(teacher, transformers.BertForQuestionAnswering)
        head = "mlm" if has_mlm else "sequence-classification" if is_cls else "question-answering" if is_qa else "base"
    _auto_class(head)  # validates the name
    if head == "mlm":
        student = transformers.DistilBertForMaskedLM(cfg)
    elif head == "sequence-classification":
        cfg.num_labels = tc.num_labels
        cfg.problem_type = tc.problem_type
        cfg.id2label, cfg.label2id = dict(tc.id2label), dict(tc.label2id)
        student = transformers.DistilBertForSequenceClassification(cfg)
    elif head == "question-answering":
        student = transformers.DistilBertForQuestionAnswering(cfg)
    else:
        student = transformers.DistilBertModel(cfg)
    s, t = student.base_model, teacher.base_model
    with torch.no_grad():
        _copy_(s.embeddings.word_embeddings, t.embeddings.word_embeddings)
        _copy_(s.embeddings.LayerNorm, t.embeddings.LayerNorm)
        pos = t.embeddings.position_embeddings.weight.detach().clone()
        if fold_token_type:  # exact for single-segment inputs (token type 0 everywhere)
            pos += t.embeddings.token_type_embeddings.weight[0]
        s.embeddings.position_embeddings.weight.copy_(pos)
        for j, i in enumerate(layers):
            sl, tl = s.transformer.layer[j], t.encoder.layer[i]
            _copy_(sl.attention.q_lin, tl.attention.self.query)
            _copy_(sl.attention.k_lin, tl.attention.self.key)
            _copy_(sl.attention.v_lin, tl.attention.self.value)
            _copy_(sl.attention.out_lin, tl.attention.output.dense)
            _copy_(sl.sa_layer_norm, tl.attention.output.LayerNorm)
            _copy_(sl.ffn.lin1, tl.intermediate.dense)
            _copy_(sl.ffn.lin2, tl.output.dense)
            _copy_(sl.output_layer_norm, tl.output.LayerNorm)
        if has_mlm and head == "mlm":
            pred = teacher.cls.predictions
            _copy_(student.vocab_transform, pred.transform.dense)
            _copy_(student.vocab_layer_norm, pred.transform.LayerNorm)
            student.vocab_projector.weight.copy_(pred.decoder.weight)
            student.vocab_projector.bias.copy_(pred.bias if pred.bias is not None else pred.decoder.bias)
        if head == "question-answering" and hasattr(teacher, "qa_outputs"):  # the span head, as the teacher learned it
            _copy_(student.qa_outputs, teacher.qa_outputs)
    return student


def init_from_teacher_layers(
    teacher: PreTrainedModel,
    layers: Sequence[int],
    *,
    arch: str | None = None,
    head: str | None = None,
    fold_token_type: bool = False,
) -> PreTrainedModel:
    """DistilBERT-style student: the teacher's embeddings and the listed teacher layers (0-based),
    in order, become the student's layers 0..len(layers)-1 (Sanh et al., 2019, Sec. 3, "Student
    initialization": one layer out of two, [0, 2, 4, 7, 9, 11] in the released code).

    ``arch``: ``"distilbert"`` (default for BERT and DistilBERT teachers) maps BERT weights onto
    DistilBERT modules and drops token-type embeddings and pooler, like the official code; the MLM
    head is copied from an MLM teacher, a sequence-classification teacher gets a fresh
    DistilBERT classifier. ``"same"`` (default for MobileBERT) keeps the teacher's class and copies
    every non-layer weight. ``head`` ("base" / "sequence-classification" / "mlm") overrides the
    head; None follows the teacher's; a head the teacher lacks starts random. ``fold_token_type`` adds the teacher's token-type-0 embedding into the
    position embeddings, so single-segment inputs see exactly the teacher's embedding output (the
    official code does not).
    """
    layers = _check_layers(teacher, layers)
    model_type = teacher.config.model_type
    if arch is None:
        arch = "distilbert" if model_type in ("bert", "distilbert") else "same"
    if arch not in ("distilbert", "same"):
        raise ModelConfigError(f"init_from_teacher_layers: arch must be 'distilbert' or 'same', got {arch!r}")
    if arch == "same" or model_type == "distilbert":
        student = _same_arch_subset(teacher, layers, head)
    elif model_type == "bert":
        student = _bert_to_distilbert(teacher, layers, fold_token_type, head)
    else:
        raise ModelConfigError(f"init_from_teacher_layers: cannot map a {model_type!r} teacher onto DistilBERT")
    return student.train(teacher.training)
