"""Export a student to ONNX (dynamic batch and sequence axes), check it, and quantise it to int8.

Deployment is the point of distillation (TinyBERT, Jiao et al. 2020, Sec. 1: "deployed on edge
devices"); MobileBERT (Sun et al. 2020, Table 6) shows 8-bit post-training quantisation of the
student costs almost nothing on GLUE. Here:
- `export_onnx` traces the Hugging Face model (head included, distillation projections never: they
  are not part of a `save_pretrained` model) with eager attention, so that ONNX Runtime's
  transformer optimiser recognises the attention pattern, and checks the ONNX logits against PyTorch
  on a batch whose shape differs from the traced one (proves the dynamic axes);
- `quantize_onnx` applies ONNX Runtime dynamic int8 quantisation (int8 weights, activations
  quantised on the fly), `quantize_torch` the PyTorch equivalent for nn.Linear; `int8_export` makes the
  int8 form the pipeline serves: the graph fused by ONNX Runtime's transformer optimiser first (where
  it recognises the model's attention; checked against PyTorch), then quantised;
- `OnnxModel` wraps an ONNX Runtime session with padding-aware batched prediction, so the pipeline
  can score the exported and the int8 student on the dev set next to their speed.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from distillery.errors import InputNotFoundError, UserError
from distillery.io import atomic_path

INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
log = logging.getLogger(__name__)


class ExportError(UserError, ValueError):
    """The model cannot be exported, or the exported graph disagrees with PyTorch."""


@dataclass(frozen=True)
class ExportResult:
    path: str
    input_names: tuple[str, ...]
    output_name: str
    opset: int
    exporter: str
    max_abs_diff: float | None  # ONNX Runtime vs PyTorch on a check batch; None when not checked
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_saved_model(model_dir: str | os.PathLike) -> Path:
    """A `save_pretrained` directory that can be loaded: config.json and whole weights
    (`distillery.models.check_weights`), checked before anything is loaded or written; returns config.json."""
    from distillery.models import check_weights

    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise InputNotFoundError(f"{model_dir}: not a saved model directory (no config.json)")
    try:
        json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportError(f"{cfg_path}: invalid JSON ({exc})") from exc
    check_weights(model_dir)
    return cfg_path


def load_model_for_export(model_dir: str | os.PathLike) -> nn.Module:
    """Load a `save_pretrained` directory with the class its config.json names (no remote code).

    Falls back to AutoModel when the config names no architecture. Extra tensors saved beside the
    model (e.g. distillation projections) are not part of that class and are therefore dropped.
    """
    import transformers

    from distillery.models import quiet_loading

    model_dir = Path(model_dir)
    cfg_path = check_saved_model(model_dir)
    try:
        archs = json.loads(cfg_path.read_text(encoding="utf-8")).get("architectures") or []
    except json.JSONDecodeError as exc:
        raise ExportError(f"{cfg_path}: invalid JSON ({exc})") from exc
    cls = getattr(transformers, archs[0], None) if archs else None
    if cls is None or not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        cls = transformers.AutoModel
    with quiet_loading():
        return cls.from_pretrained(str(model_dir)).eval()


def check_tokenizer_fits(model_dir: str | os.PathLike) -> int | None:
    """The size of the tokenizer saved beside a model (None when there is none), refusing one with more tokens
    than the model's vocabulary (config.json ``vocab_size``): its ids past it would index beyond the embeddings.
    Reads only the config and the tokenizer, so it runs before the model is loaded."""
    model_dir = Path(model_dir)
    if not any((model_dir / n).is_file() for n in ("tokenizer.json", "vocab.txt", "tokenizer_config.json")):
        return None
    try:
        vocab = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        n_tokens = len(AutoTokenizer.from_pretrained(str(model_dir)))
    except (OSError, ValueError, TypeError):
        return None  # no usable tokenizer: nothing to compare
    finally:
        hf_logging.set_verbosity(level)
    if isinstance(vocab, int) and n_tokens > vocab:
        raise ExportError(
            f"{model_dir}: the tokenizer has {n_tokens} tokens, the model's vocabulary (config.json vocab_size) "
            f"{vocab}: ids >= {vocab} would index past the embeddings; save the model with the tokenizer it was "
            "trained with (or call resize_token_embeddings(len(tokenizer)) and train it)")
    return n_tokens


def model_input_names(model: nn.Module) -> tuple[str, ...]:
    """The subset of (input_ids, attention_mask, token_type_ids) the model's forward accepts."""
    params = inspect.signature(model.forward).parameters
    names = tuple(n for n in INPUT_ORDER if n in params)
    if names != INPUT_ORDER[: len(names)] or not names:  # the wrapper passes them positionally in this order
        raise ExportError(f"{type(model).__name__}.forward takes {names}; expected input_ids[, attention_mask"
                          "[, token_type_ids]]")
    return names


class _FirstOutput(nn.Module):
    """Positional-argument wrapper returning logits (heads), span logits (question answering: start and end stacked
    as (batch, 2, sequence)) or last_hidden_state (base models)."""

    def __init__(self, model: nn.Module, names: Sequence[str]):
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        out = self.model(**{n: given[n] for n in self.names}, return_dict=True)
        if "start_logits" in out:
            return torch.stack((out["start_logits"], out["end_logits"]), dim=1)
        return out["logits"] if "logits" in out else out["last_hidden_state"]


#: the ONNX output of each kind of model and its dynamic axes
OUTPUT_AXES = {"logits": {0: "batch"}, "span_logits": {0: "batch", 2: "sequence"},
               "last_hidden_state": {0: "batch", 1: "sequence"}}


def _output_name(model: nn.Module, names: Sequence[str]) -> str:
    ids = torch.ones(1, 2, dtype=torch.long)
    with torch.inference_mode():
        out = model(**{n: ids if n != "token_type_ids" else torch.zeros_like(ids) for n in names}, return_dict=True)
    return "span_logits" if "start_logits" in out else "logits" if "logits" in out else "last_hidden_state"


def random_batch(names: Sequence[str], batch: int, seq_len: int, vocab_size: int, *, seed: int = 0,
                 pad_last: bool = True) -> dict[str, torch.Tensor]:
    """int64 inputs; the last row is right-padded to half length when `pad_last` (exercises the mask)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, max(2, vocab_size), (batch, seq_len), generator=g)
    mask = torch.ones_like(ids)
    if pad_last and seq_len > 1:
        mask[-1, (seq_len + 1) // 2:] = 0
        ids[-1, (seq_len + 1) // 2:] = 0
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return {n: out[n] for n in names}


def export_onnx(model: nn.Module | str | os.PathLike, out_path: str | os.PathLike, *, opset: int = 17,
                exporter: Literal["torchscript", "dynamo"] = "torchscript", check: bool = True,
                atol: float = 1e-4) -> ExportResult:
    """Export `model` (or a saved model directory) to `out_path` with dynamic batch and sequence axes.

    exporter "torchscript" (torch.onnx legacy tracer: fast and reliable for transformers-5 BERT
    models here) or "dynamo" (torch.export based). With `check`, runs ONNX Runtime and PyTorch on a
    padded batch of a shape different from the traced one and raises ExportError when the largest
    absolute output difference exceeds `atol`.
    """
    if exporter not in ("torchscript", "dynamo"):
        raise ExportError(f"exporter must be 'torchscript' or 'dynamo', got {exporter!r}")
    if not isinstance(model, nn.Module):
        model = load_model_for_export(model)
    model = model.eval()
    names = model_input_names(model)
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 100))
    out_name = _output_name(model, names)
    # eager attention traces to MatMul/Softmax, which ONNX Runtime fuses into its Attention kernel
    traced = copy.deepcopy(model).to("cpu")
    if hasattr(traced, "set_attn_implementation"):
        try:
            traced.set_attn_implementation("eager")
        except (ValueError, AttributeError) as exc:  # keep the model's own attention
            log.warning("could not switch %s to eager attention for export: %s", type(model).__name__, exc)
    wrapper = _FirstOutput(traced, names).eval()
    example = random_batch(names, 2, 8, vocab, pad_last=False)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes[out_name] = OUTPUT_AXES[out_name]
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = tuple(example[n] for n in names)
        if exporter == "torchscript":
            torch.onnx.export(wrapper, args, str(tmp), input_names=list(names), output_names=[out_name],
                              dynamic_axes=axes, opset_version=opset, dynamo=False, do_constant_folding=True)
        else:
            b, t = torch.export.Dim("batch"), torch.export.Dim("sequence")
            program = torch.onnx.export(wrapper, args, input_names=list(names), output_names=[out_name],
                                        dynamic_shapes={n: {0: b, 1: t} for n in names}, opset_version=opset,
                                        dynamo=True, external_data=False, verbose=False)
            program.save(str(tmp))
    diff = None
    if check:
        diff = check_onnx(model, out_path, names=names, vocab_size=vocab)
        if not diff <= atol:
            raise ExportError(f"{out_path}: ONNX Runtime output differs from PyTorch by {diff:.3g} > atol {atol:g}")
    return ExportResult(path=str(out_path), input_names=names, output_name=out_name, opset=opset,
                        exporter=exporter, max_abs_diff=diff, bytes=out_path.stat().st_size)


def check_onnx(model: nn.Module, onnx_path: str | os.PathLike, *, names: Sequence[str] | None = None,
               vocab_size: int | None = None, batch: int = 3, seq_len: int = 11) -> float:
    """Largest |ONNX Runtime - PyTorch| output difference on a random padded (batch, seq_len) batch."""
    names = tuple(names or model_input_names(model))
    vocab = vocab_size or int(getattr(getattr(model, "config", None), "vocab_size", 100))
    inputs = random_batch(names, batch, seq_len, vocab, seed=1)
    with torch.inference_mode():
        ref = _FirstOutput(model.eval(), names)(*(inputs[n] for n in names)).float().numpy()
    got = OnnxModel(onnx_path)(**{n: v.numpy() for n, v in inputs.items()})
    if got.shape != ref.shape:
        raise ExportError(f"{onnx_path}: ONNX output shape {got.shape} != PyTorch {ref.shape}")
    if ref.ndim == 3:  # hidden states and span logits: padded positions are not meaningful
        keep = inputs["attention_mask"].numpy().astype(bool)
        if _output_name(model, names) == "span_logits":
            return float(np.abs(got.transpose(0, 2, 1)[keep] - ref.transpose(0, 2, 1)[keep]).max())
        return float(np.abs(got[keep] - ref[keep]).max())
    return float(np.abs(got - ref).max())


def optimize_onnx(in_path: str | os.PathLike, out_path: str | os.PathLike, *, num_heads: int,
                  hidden_size: int, model_type: str = "bert") -> dict[str, int]:
    """ONNX Runtime transformer optimiser (fused Attention, SkipLayerNorm, BiasGelu, EmbedLayerNorm).

    Returns the fused-operator counts; writes `out_path` atomically.
    """
    import onnxruntime.transformers as ort_transformers
    from onnxruntime.transformers.optimizer import optimize_model

    # its modules log what they could not fuse, under their bare module names (ONNX Runtime puts that folder on
    # sys.path): quiet them for the call
    modules = {p.stem for p in Path(ort_transformers.__file__).parent.glob("*.py")}
    quiet = {logging.getLogger(name): None for m in modules for name in (m, f"onnxruntime.transformers.{m}")}
    for logger in quiet:
        quiet[logger] = logger.level
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = optimize_model(str(in_path), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size)
    finally:
        for logger, level in quiet.items():
            logger.setLevel(level)
    with atomic_path(out_path) as tmp:
        opt.save_model_to_file(str(tmp))
    return {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}


def int8_export(model: nn.Module, fp32_path: str | os.PathLike, out_path: str | os.PathLike, *,
                atol: float = 1e-4) -> dict[str, int]:
    """The int8 form the pipeline serves (evaluation, the budget search, the registry): the exported fp32 graph of
    `model` passed through ONNX Runtime's transformer optimiser (`optimize_onnx`: one Attention kernel per layer,
    LayerNorms fused with their residual add, the embedding sum with its LayerNorm), then quantised (`quantize_onnx`).

    The fused graph is used only when the optimiser fused something and its outputs match `model`'s within `atol`
    (the check `export_onnx` makes); otherwise the plain graph is quantised (a MobileBERT graph fuses nothing). On 2
    AVX2 cores fused int8 ran 4-13% faster than unfused, its CoLA score within 0.3 MCC (docs/benchmarks.md, "int8").
    Returns the fused-operator counts ({} when not fused)."""
    import tempfile

    from distillery.models import hidden_size, num_heads

    source, fused = Path(fp32_path), {}
    with tempfile.TemporaryDirectory(prefix="fused-") as tmp:
        path = Path(tmp) / "model.opt.onnx"
        counts = optimize_onnx(source, path, num_heads=num_heads(model), hidden_size=hidden_size(model))
        if counts:
            diff = check_onnx(model, path)
            if diff <= atol:
                source, fused = path, counts
            else:
                log.warning("%s: the fused graph differs from PyTorch by %.3g > %g; quantising the unfused graph",
                            fp32_path, diff, atol)
        quantize_onnx(source, out_path)
    return fused


def quantize_onnx(in_path: str | os.PathLike, out_path: str | os.PathLike, *, per_channel: bool = True) -> Path:
    """Dynamic int8 quantisation with ONNX Runtime: int8 MatMul/Gemm weights, activations per batch. Weights get one
    scale per output channel (``per_channel``; a SQuAD BERT-PKD student kept 67.5 dev F1 of its fp32 68.4, 62.6
    with one scale per tensor: docs/benchmarks.md, "int8")."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    in_path, out_path = Path(in_path), Path(out_path)
    if not in_path.is_file():
        raise FileNotFoundError(f"no ONNX model at {in_path}")
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the quantizer warns "run pre-processing" via the root logger
    try:
        with atomic_path(out_path) as tmp:
            quantize_dynamic(str(in_path), str(tmp), weight_type=QuantType.QInt8, per_channel=per_channel,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)
    return out_path


def quantize_torch(model: nn.Module) -> nn.Module:
    """A copy of `model` with every nn.Linear dynamically quantised to int8 (PyTorch CPU kernels)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval().cpu(), {nn.Linear},
                                                      dtype=torch.qint8)


def _onnx_vocab_size(path: Path) -> int | None:
    """Rows of the embedding table that input_ids index (config.json beside the file, else the graph)."""
    cfg = path.parent / "config.json"
    if cfg.is_file():
        try:
            v = json.loads(cfg.read_text(encoding="utf-8")).get("vocab_size")
            if isinstance(v, int):
                return v
        except json.JSONDecodeError:
            pass
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == "input_ids":
            dims = shapes.get(node.input[0])
            if dims:
                return int(dims[0])
        if node.op_type == "EmbedLayerNormalization":  # fused: (ids, segment ids, word table, ...)
            dims = shapes.get(node.input[2]) if len(node.input) > 2 else None
            if dims:
                return int(dims[0])
    return None


class OnnxModel:
    """An ONNX Runtime CPU session: `model(**arrays)` -> first output; `predict(features)` batched.

    The session keeps ONNX Runtime's own thread behaviour: its workers busy-wait between operators and for a
    while after a call returns, as a served model runs. Stopping them at the end of each call
    (``session.force_spinning_stop``) makes the next call wake them, which costs more than a small model's call
    (docs/benchmarks.md, "Two runtimes in one process"). Whatever runs right after a call shares the cores with the
    spinning workers for a few milliseconds: `measure_latency` pauses before each sample for that.
    """

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None, optimize: bool = True,
                 vocab_size: int | None = None):
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX model at {self.path}")
        self._options = {"threads": threads, "optimize": optimize}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        opts.inter_op_num_threads = 1
        # x86 CPUs without VNNI (AVX2, AVX-512F) compute u8s8 products in 16 bits, which saturate for weights outside
        # [-64, 63] (per-channel scales put many there): ONNX Runtime then switches those MatMuls to u8u8 (on an AVX2
        # machine a tiny model's error was 18x per-tensor's without it). A no-op where VNNI is present.
        opts.add_session_config_entry("session.x64quantprecision", "1")
        opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                         else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.vocab_size = vocab_size or _onnx_vocab_size(self.path)

    def fresh(self) -> "OnnxModel":
        """A new session of the same file with the same options (sessions of one file time differently:
        `distillery.efficiency.latency.time_sessions`)."""
        return OnnxModel(self.path, vocab_size=self.vocab_size, **self._options)

    def __call__(self, **inputs: Any) -> np.ndarray:
        missing = [n for n in self.input_names if n not in inputs and n != "token_type_ids"]
        if missing:
            raise ValueError(f"{self.path.name}: missing inputs {missing}")
        feeds = {}
        for n in self.input_names:
            v = inputs.get(n)
            if v is None:  # token_type_ids default to segment 0
                v = np.zeros_like(np.asarray(inputs["input_ids"]))
            feeds[n] = np.asarray(v.numpy() if isinstance(v, torch.Tensor) else v, dtype=np.int64)
        return self.session.run(None, feeds)[0]

    def predict(self, features: Mapping[str, Sequence[Sequence[int]] | np.ndarray], *,
                batch_size: int = 32, pad_id: int = 0) -> np.ndarray:
        """Outputs for every row of `features` (lists of token-id lists, any lengths), in order.

        Rows are right-padded per batch (attention_mask 0 on padding), as a data collator would.
        """
        return _batched_predict(lambda b: self(**b), features, batch_size=batch_size, pad_id=pad_id,
                                names=self.input_names)


def _pad(rows: Sequence[Sequence[int]], pad: int) -> np.ndarray:
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), pad, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = np.asarray(r, dtype=np.int64)
    return out


def _batched_predict(fn, features: Mapping[str, Any], *, batch_size: int, pad_id: int,
                     names: Sequence[str]) -> np.ndarray:
    if "input_ids" not in features:
        raise KeyError("features need an 'input_ids' column")
    ids = features["input_ids"]
    n = len(ids)
    outs = []
    for start in range(0, n, batch_size):
        rows = ids[start : start + batch_size]
        batch = {"input_ids": _pad(rows, pad_id)}
        if "attention_mask" in features:
            batch["attention_mask"] = _pad(features["attention_mask"][start : start + batch_size], 0)
        else:
            batch["attention_mask"] = _pad([[1] * len(r) for r in rows], 0)
        if "token_type_ids" in names:
            tt = features.get("token_type_ids")
            batch["token_type_ids"] = _pad(tt[start : start + batch_size], 0) if tt is not None else \
                np.zeros_like(batch["input_ids"])
        outs.append(np.asarray(fn({k: v for k, v in batch.items() if k in names})))
    if not outs:
        return np.zeros((0,), dtype=np.float32)
    return np.concatenate(outs)


@torch.inference_mode()
def predict_torch(model: nn.Module, features: Mapping[str, Any], *, batch_size: int = 32,
                  pad_id: int = 0) -> np.ndarray:
    """PyTorch counterpart of OnnxModel.predict (same padding), e.g. for a `quantize_torch` model."""
    model = model.eval()
    names = model_input_names(model)
    wrapper = _FirstOutput(model, names)
    return _batched_predict(lambda b: wrapper(*(torch.from_numpy(b[n]) for n in names)).float().numpy(),
                            features, batch_size=batch_size, pad_id=pad_id, names=names)
