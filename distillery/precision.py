"""One precision switch for every training loop and every inference path: bf16 autocast where the hardware is fast
at it, fp32 elsewhere.

``precision`` in params is ``auto`` (the default), ``fp32`` or ``bf16``:

* ``auto``: bf16 on a CUDA device that supports it, and on a CPU with AMX or AVX512-BF16 (read at run time from
  what torch and ``/proc/cpuinfo`` report, never from a CPU's name); fp32 elsewhere.
* ``bf16``: bf16, or a `PrecisionError` before any work where the device has no fast bf16.
* ``fp32``: fp32 everywhere.

bf16 here is autocast (`torch.autocast`), never a cast of the model: weights, optimiser states and checkpoints stay
fp32, matmuls and linear layers run in bf16, and the objectives' reductions run in fp32 (the distillation loop
computes its loss terms outside autocast, on fp32 copies of what it captured; see `fp32`). The training loops get
it through the Trainer's own ``bf16`` argument (`trainer_options`); inference paths open `forwards()` (`autocast()`
for a model). On a CPU, bf16 models train with the eager attention and infer with PyTorch's fused SDPA, or with
the eager attention on a CPU without AMX, where it is the faster (`fast_attention`).

The pipeline sets the switch once per stage (`use`); library code reads it with `current()`. A library caller who
never sets it gets what the loops did before the switch existed: bf16 on a bf16 GPU, fp32 on a CPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from pathlib import Path
from typing import Any, Iterator, Literal

import torch

from distillery.errors import UserError

Setting = Literal["auto", "fp32", "bf16"]
Precision = Literal["fp32", "bf16"]
SETTINGS: tuple[str, ...] = ("auto", "fp32", "bf16")
#: the CPU flags (``/proc/cpuinfo``) of instructions that make bf16 matmuls fast
CPU_FLAGS = ("amx_bf16", "avx512_bf16")

_SETTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("distillery_precision", default=None)


class PrecisionError(UserError, ValueError):
    """``bf16`` asked for on a device without fast bf16, or an unknown setting."""


def device_type(device: str | torch.device | None = None) -> str:
    """"cuda" or "cpu": the given device's type, else CUDA when present."""
    if device is not None:
        return torch.device(device).type
    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=1)
def cpu_bf16_flags() -> tuple[str, ...]:
    """The fast-bf16 instruction sets this CPU has (`CPU_FLAGS`), from torch's own check and /proc/cpuinfo."""
    found = set()
    cpu = getattr(torch, "cpu", None)
    for flag, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_bf16", "_is_amx_tile_supported")):
        fn = getattr(cpu, check, None)
        try:
            if fn is not None and fn():
                found.add(flag)
        except RuntimeError:  # pragma: no cover - torch built without the check
            pass
    try:
        words = set(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").split())
    except OSError:
        words = set()
    found.update(f for f in CPU_FLAGS if f in words)
    return tuple(f for f in CPU_FLAGS if f in found)


def bf16_supported(device: str | torch.device | None = None) -> bool:
    """Whether bf16 is fast on the device: a CUDA device with bf16, or a CPU with AMX or AVX512-BF16."""
    if device_type(device) == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(cpu_bf16_flags())


def why_not(device: str | torch.device | None = None) -> str:
    """Why `bf16_supported` says no, in a few words."""
    if device_type(device) == "cuda":
        return "this GPU does not support bf16"
    return f"this CPU has none of {', '.join(CPU_FLAGS)}"


def resolve(setting: str | None, device: str | torch.device | None = None) -> Precision:
    """The precision a setting gives on the device (see the module); `PrecisionError` for ``bf16`` where it is not
    fast, or an unknown setting."""
    if setting not in SETTINGS:
        raise PrecisionError(f"precision: {setting!r} is not one of {', '.join(SETTINGS)}")
    if setting == "fp32":
        return "fp32"
    if bf16_supported(device):
        return "bf16"
    if setting == "bf16":
        raise PrecisionError(f"precision: bf16 needs fast bf16 and {why_not(device)}; use auto or fp32")
    return "fp32"


def current(device: str | torch.device | None = None) -> Precision:
    """The precision in force: the setting of the innermost `use`, resolved on the device; without one, bf16 on a
    bf16 GPU and fp32 on a CPU (the library's behaviour before the switch)."""
    setting = _SETTING.get()
    if setting is None:
        return resolve("auto", device) if device_type(device) == "cuda" else "fp32"
    return resolve(setting, device)


@contextlib.contextmanager
def use(setting: str) -> Iterator[Precision]:
    """Make `setting` the precision of everything inside (this thread / task context); yields what it resolves to
    on the default device."""
    resolved = resolve(setting)
    token = _SETTING.set(setting)
    try:
        yield resolved
    finally:
        _SETTING.reset(token)


def _on(device: str | torch.device | None, precision: str | None) -> tuple[str, Precision]:
    """(device type, precision): the given precision resolved on the device, else `current()` there."""
    dev = device_type(device)
    return dev, resolve(precision, dev) if precision is not None else current(dev)


def autocast(device: str | torch.device | None = None, precision: str | None = None):
    """`torch.autocast` to bf16 when the precision (given, else `current()`) is bf16 on the device; a no-op
    context otherwise."""
    dev, chosen = _on(device, precision)
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=chosen == "bf16")


@contextlib.contextmanager
def forwards(model: Any, device: str | torch.device | None = None) -> Iterator[None]:
    """The context of `model`'s inference forwards at the precision in force: `model` set to the attention fast at
    that precision (`fast_attention`), then `autocast()` on its device (`device`, else its parameters'; a CPU for
    `model=None`, an exported model's inputs), with fp32 matmuls in IEEE fp32 (`ieee_fp32`). The pipeline's inference
    paths open `distillery.training.cpu_kernels.used` beside it: on a CPU the kernels its training runs (in fp32 the
    same outputs bit for bit; in bf16 the residual stream bf16, the bias after the matmul and, without AMX, the eager
    attention)."""
    if model is not None:
        device = device if device is not None else next(model.parameters()).device
        fast_attention(model, device)
    with ieee_fp32(), autocast(device if device is not None else "cpu"):
        yield


@contextlib.contextmanager
def ieee_fp32() -> Iterator[None]:
    """fp32 matmuls and convolutions in IEEE fp32 inside, TF32 where it was on before. A Trainer on an Ampere or newer
    GPU turns TF32 on for the whole process (`trainer_options`), so without this an inference forward (augmentation's
    top-K, an evaluation) would round differently when a training stage ran before it in the same process, and
    augmentation's candidates would then differ from the per-position reference's at near-ties (`benchmarks.gpu`'s
    and `benchmarks.augment`'s H200 rows in docs/results.md)."""
    backends = [torch.backends, torch.backends.cuda.matmul, torch.backends.cudnn.conv]
    before = [b.fp32_precision for b in backends]
    for b in backends:  # each one: a sub-backend set on its own (a Trainer's cudnn) does not follow the global one
        b.fp32_precision = "ieee"
    try:
        yield
    finally:
        for b, value in zip(backends, before):
            b.fp32_precision = value


def fast_attention(model: Any, device: str | torch.device | None = None, precision: str | None = None,
                   training: bool = False) -> Any:
    """`model` set to the attention that is fast at the precision in force (given, else `current()`) for what it is
    about to do. Under bf16 on a CPU, a model that trains (`training`) runs the eager attention (matmul + softmax),
    whose backward runs bf16 on the same kernels as the rest of the model, instead of PyTorch's SDPA, whose CPU bf16
    backward is slow; a model that only infers runs SDPA, its default, but inside `distillery.training.cpu_kernels`
    (`used`, as every inference path of the pipeline runs a model), where a BERT-layout model's attention
    is `cpu_kernels.attention`: SDPA again, but in bf16 on a CPU without AMX, where its flash kernel at BERT's head
    sizes was slower than the eager computation with bf16 scores (`python -m benchmarks.precision` times both, (a)
    and (c)). They compute the same attention; nothing is saved with the model (its config.json is unchanged).
    Other models, precisions and devices: unchanged."""
    dev, chosen = _on(device, precision)
    if dev != "cpu" or chosen != "bf16" or not hasattr(model, "set_attn_implementation"):
        return model
    now = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if training and now == "sdpa":
        model.set_attn_implementation("eager")
    elif not training and now == "eager" and getattr(model, "_supports_sdpa", False):
        model.set_attn_implementation("sdpa")
    return model


def fp32_region(device: str | torch.device | None = None):
    """A region where autocast is off (the objectives' reductions)."""
    return torch.autocast(device_type(device), enabled=False)


def fp32(value: Any) -> Any:
    """`value` with every half-precision tensor in it (bf16, fp16; in dicts, lists, tuples) as float32; other values
    unchanged (float64 stays float64). Under autocast the captured features and logits are bf16: the losses read
    these copies."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, dict):
        return {k: fp32(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(fp32(v) for v in value)
    return value


def trainer_options(device: str | torch.device | None = None) -> dict[str, Any]:
    """`TrainingArguments` options for the precision in force: ``bf16`` (the Trainer's autocast; on a CPU with
    ``use_cpu``, which the Trainer needs for CPU bf16), and TF32 matmuls on an Ampere or newer GPU. ``bf16: False``
    is explicit, so an fp32 run stays fp32 on a GPU too."""
    dev = device_type(device)
    bf16 = current(dev) == "bf16"
    options: dict[str, Any] = {"bf16": bf16}
    if dev == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8:
        options["tf32"] = True
    if bf16 and dev == "cpu":
        options["use_cpu"] = True
    return options


def describe(setting: str, device: str | torch.device | None = None) -> str:
    """One line for the console: what the setting gives here, and why when auto falls back to fp32."""
    resolved = resolve(setting, device)
    where = device_type(device)
    if where == "cpu" and resolved == "bf16":
        where += f" ({', '.join(cpu_bf16_flags())})"
    if setting == "auto" and resolved == "fp32":
        return f"precision: fp32 (auto: {why_not(device)})"
    return f"precision: {resolved} on {where}" + (" (autocast; weights stay fp32)" if resolved == "bf16" else "")


__all__ = ["CPU_FLAGS", "PrecisionError", "SETTINGS", "autocast", "bf16_supported", "cpu_bf16_flags", "current",
           "describe", "fast_attention", "forwards", "fp32", "fp32_region", "resolve", "trainer_options", "use", "why_not"]
