"""Latency and throughput of several models measured side by side in one process.

The headline speedups of the seeds (TinyBERT4 "9.4x faster", MobileBERT "5.5x", DistilBERT "60%
faster") are wall-clock ratios against BERT-base. Here every model is timed interleaved
(A B C A B C ...) after a warm-up, so that load from other processes and CPU frequency drift hit all
of them alike; the median of the repetitions is reported. CPU runs use torch.get_num_threads()
threads; on CUDA the device is synchronised around every call.

On a CPU, a runtime's worker threads go on spinning for a while after a call returns (ONNX Runtime's for tens of
milliseconds, PyTorch's OpenMP threads for a few): timed right after another runtime, a model shares the cores with
those threads. On 2 cores this doubled the fp32 teacher's time after an int8 ONNX session (96 ms against 41) and the
session's after the teacher (20 ms against 9). So every CPU sample waits `settle_ms` before it starts: each model is
timed as it is served, alone on the machine.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

from distillery.precision import autocast, fast_attention

#: consecutive calls per timed sample wherever a student is judged against a budget (the budget search and the
#: evaluate stage time alike): each model is timed with its weights warm, as when it serves requests back to back. A
#: single call after the pause before each sample also measures waking the runtime: on 2 Zen 4 cores an int8 student
#: took 3.3 and 8.6 ms in two rounds timed so, 2.5 and 2.8 ms over 3 calls (docs/benchmarks.md, "Two runtimes in
#: one process").
SERVED_CALLS = 3


@dataclass(frozen=True)
class LatencyResult:
    """Timing of one model: median/mean/p90 latency per batch in milliseconds and throughput."""

    name: str
    batch: int
    seq_len: int
    reps: int
    median_ms: float
    mean_ms: float
    p90_ms: float
    throughput: float  # examples per second at the median latency
    speedup: float | None  # reference median / this median; None without a reference
    device: str
    threads: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _vocab_size(model: nn.Module) -> int:
    cfg = getattr(model, "config", None)
    return int(getattr(cfg, "vocab_size", 1000)) if cfg is not None else 1000


def _accepts(model: nn.Module, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def make_inputs(batch: int, seq_len: int, vocab_size: int, *, seed: int = 0,
                token_type_ids: bool = True) -> dict[str, torch.Tensor]:
    """Random full-length int64 inputs (input_ids, attention_mask, [token_type_ids]) of shape (batch, seq_len)."""
    if batch < 1 or seq_len < 1:
        raise ValueError(f"batch and seq_len must be >= 1, got batch={batch}, seq_len={seq_len}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, max(2, vocab_size), (batch, seq_len), generator=g)
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if token_type_ids:
        out["token_type_ids"] = torch.zeros_like(ids)
    return out


def _runner(obj: Any, batch: int, seq_len: int, device: torch.device, precision: str = "fp32") -> Callable[[], Any]:
    """Turn a model (run at `precision`: fp32, or bf16 autocast), an onnxruntime session or a zero-argument callable
    into a zero-argument callable."""
    if isinstance(obj, nn.Module):
        model = obj.to(device).eval()
        if precision == "bf16":  # its own copy: the same module may be timed in fp32 beside it
            model = fast_attention(copy.deepcopy(model), device, precision)
        inputs = make_inputs(batch, seq_len, _vocab_size(model),
                             token_type_ids=_accepts(model, "token_type_ids"))
        inputs = {k: v.to(device) for k, v in inputs.items() if _accepts(model, k) or k == "input_ids"}

        def run_module() -> Any:
            with torch.inference_mode(), autocast(device, precision):
                return model(**inputs)

        return run_module
    session = getattr(obj, "session", obj)  # distillery.efficiency.export.OnnxModel or a raw session
    if hasattr(session, "run") and hasattr(session, "get_inputs"):  # onnxruntime.InferenceSession
        names = [i.name for i in session.get_inputs()]
        vocab = getattr(obj, "vocab_size", None) or 1000  # token ids do not change the timing
        feeds = {k: v.numpy() for k, v in make_inputs(batch, seq_len, vocab).items() if k in names}
        missing = [n for n in names if n not in feeds]
        if missing:
            raise ValueError(f"cannot build inputs {missing} for the ONNX session")
        return lambda: session.run(None, feeds)
    if callable(obj):
        return obj
    raise TypeError(f"cannot time an object of type {type(obj).__name__}: pass an nn.Module, "
                    "an onnxruntime.InferenceSession or a zero-argument callable")


def measure_latency(models: Mapping[str, Any], *, batch: int = 1, seq_len: int = 128, reps: int = 20,
                    warmup: int = 3, reference: str | None = None,
                    device: str | torch.device | None = None, calls: int = 1,
                    precisions: Mapping[str, str] | None = None, settle_ms: float = 50.0) -> dict[str, LatencyResult]:
    """Time every model interleaved in one process and return {name: LatencyResult}.

    `models` values: an nn.Module (fed random (batch, seq_len) inputs drawn from its vocabulary), an
    onnxruntime.InferenceSession (fed the same shapes by input name), or a zero-argument callable
    that runs one batch (its batch size is taken to be `batch`). `reference` names the model the
    speedups are relative to (default: the first). `device` "cpu"/"cuda" (default: cuda if present,
    only applied to nn.Modules). `calls`: consecutive calls per timed sample (their mean is the sample),
    so each model is timed with its weights in cache, as when it serves requests back to back; the
    models still alternate between samples. `precisions`: name -> "bf16" for the nn.Modules timed under bf16
    autocast (`distillery.precision`; the same module may appear twice, once in each precision); the others are
    timed in fp32 whatever precision is in force. `settle_ms`: on a CPU with more than one model, the pause before
    each sample, so the threads of the runtime that ran before have stopped spinning (module docstring).
    """
    if not models:
        raise ValueError("measure_latency needs at least one model")
    if reps < 1 or warmup < 0 or calls < 1 or settle_ms < 0:
        raise ValueError(f"reps and calls must be >= 1, warmup and settle_ms >= 0, got reps={reps}, calls={calls}, "
                         f"warmup={warmup}, settle_ms={settle_ms}")
    if reference is not None and reference not in models:
        raise KeyError(f"reference model {reference!r} is not among {sorted(models)}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    precisions = precisions or {}
    runners = {name: _runner(obj, batch, seq_len, dev, precisions.get(name, "fp32")) for name, obj in models.items()}

    def timed(fn: Callable[[], Any]) -> float:
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) / calls

    for _ in range(warmup):
        for fn in runners.values():
            fn()
    settle = settle_ms / 1000 if not cuda and len(runners) > 1 else 0.0
    times: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(reps):
        order = list(runners) if r % 2 == 0 else list(reversed(list(runners)))  # ABC CBA: no fixed position bias
        for name in order:
            time.sleep(settle)
            times[name].append(timed(runners[name]))
    ref_name = reference if reference is not None else next(iter(models))
    ref_median = statistics.median(times[ref_name])
    threads = torch.get_num_threads()
    results = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        results[name] = LatencyResult(
            name=name, batch=batch, seq_len=seq_len, reps=reps, median_ms=1000 * med,
            mean_ms=1000 * statistics.fmean(ts), p90_ms=1000 * float(np.percentile(ts, 90)),
            throughput=batch / med if med > 0 else float("inf"),
            speedup=ref_median / med if med > 0 else None, device=str(dev), threads=threads)
    return results


def latency_table(results: Mapping[str, LatencyResult]) -> str:
    """A Markdown table of LatencyResults (one row per model)."""
    lines = ["| model | batch | seq | median ms | p90 ms | examples/s | speedup |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results.values():
        sp = f"{r.speedup:.1f}x" if r.speedup is not None else "-"
        lines.append(f"| {r.name} | {r.batch} | {r.seq_len} | {r.median_ms:.2f} | {r.p90_ms:.2f} | "
                     f"{r.throughput:.1f} | {sp} |")
    return "\n".join(lines) + "\n"
