"""Latency, throughput and speedup of several models measured side by side in one process.

The headline speedups of the seeds (TinyBERT4 "9.4x faster", MobileBERT "5.5x", DistilBERT "60%
faster") are wall-clock ratios against BERT-base. Here a speedup is a measurement with its spread:

* every model is timed in paired rounds, each sample of it between two samples of the reference (R A R B R C R, the
  others in alternating order from round to round: A B C, then C B A), and its ratio in that round is the mean of
  the two reference samples around it over its own. The machine's speed drifts within seconds (other tenants of a
  cloud host, its clock): a round of twenty models lasts seconds, and a ratio of two samples that far apart moves
  with the drift, while two samples side by side see the same machine;
* a sample is long enough to be timed well: back-to-back calls for at least `min_sample_ms` (the number of calls is
  calibrated per model after the warm-up), never one call after a pause, which times the runtime waking up;
* a model's speedup is the median over the rounds of its ratios, reported with their 10th and 90th percentiles and
  the distribution-free 95% interval of the median. When that interval reaches further than `MAX_UNCERTAINTY` from
  the median (a busy machine, or a runtime whose calls vary from round to round) the result is marked unresolved and
  reports print the spread, not a figure; `time_sessions` first adds rounds for such a model, up to ``max_reps``;
* rounds are spent where they narrow a figure: `time_sessions` starts with `FIRST_ROUNDS` and adds rounds only for a
  model whose interval is still wider than `PRECISE` (at batch 32, where one reference sample is a whole forward of
  the teacher, most speedups are pinned down after the first rounds).

On a CPU, a runtime's worker threads go on spinning for a while after a call returns (ONNX Runtime's for tens of
milliseconds, PyTorch's OpenMP threads for a few): timed right after another runtime, a model shares the cores with
those threads. So every CPU sample after another runtime's (anything but a PyTorch module) waits `settle_ms` before it
starts, and one after a PyTorch module's `TORCH_SETTLE_MS`: each model is timed as it is served, alone on the
machine. CPU runs use torch.get_num_threads() threads; on CUDA the device is synchronised around every
sample.

On Linux, glibc's malloc returns freed memory to the system when the top of its heap holds more than a threshold that
moves with the process's history, and serves large blocks by mmap: at batch 32 a forward pass's activations then fault
their pages in again on every call, or not, depending on what the process did before, and two processes timed the
same models a quarter apart. So before a CPU timing the allocator is put in the steady state of a server that keeps
its memory (`distillery.runtime.steady_allocator`: fixed thresholds, freed memory kept for reuse); the process keeps
it afterwards.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

from distillery.efficiency.spread import describe_speedup, median_interval, resolved, spread_of, uncertainty
from distillery.precision import autocast, fast_attention
from distillery.runtime import steady_allocator
from distillery.training import cpu_kernels

#: the shortest timed sample, in milliseconds of back-to-back calls of one model (its calls per sample are calibrated
#: to reach it): long against the clock's resolution and the scheduler's jitter, and the model's weights stay warm as
#: when it serves requests back to back
MIN_SAMPLE_MS = 30.0
#: the pause after a PyTorch module's sample: its OpenMP workers stop spinning within a millisecond or two
TORCH_SETTLE_MS = 5.0

@dataclass(frozen=True)
class LatencyResult:
    """Timing of one model over paired rounds: its median, 10th- and 90th-percentile latency per batch (ms), its
    throughput at the median, and its speedup over the reference: the median of the per-round ratios (the
    reference's time over this model's in the same round) with their 10th and 90th percentiles, and the 95% interval
    of that median (`distillery.efficiency.spread.median_interval`)."""

    name: str
    batch: int
    seq_len: int
    reps: int  # paired rounds
    calls: int  # back-to-back calls per timed sample
    median_ms: float
    p10_ms: float
    p90_ms: float
    throughput: float  # examples per second at the median latency
    speedup: float | None  # median of the per-round ratios; None without a reference
    speedup_p10: float | None
    speedup_p90: float | None
    device: str
    threads: int
    samples_ms: tuple[float, ...] = ()  # time per batch of each sample, in order (the reference: several a round)
    ratios: tuple[float, ...] = ()  # the speedup in each round: the reference's samples around this model's over it
    speedup_ci_low: float | None = None  # the 95% interval of the median speedup (`_speedup_fields`)
    speedup_ci_high: float | None = None

    @property
    def spread(self) -> float | None:
        """(p90 - p10) / median of the per-round speedups."""
        return spread_of(self.speedup, self.speedup_p10, self.speedup_p90)

    @property
    def pinned(self) -> bool:
        """Whether its speedup's median is pinned down: its 95% interval within `PRECISE` of it (no more rounds needed)."""
        u = uncertainty(self.speedup, self.speedup_ci_low, self.speedup_ci_high)
        return u is not None and u <= PRECISE

    @property
    def resolved(self) -> bool:
        """Whether the median is known closely enough (`MAX_UNCERTAINTY`) for the speedup to be reported as a figure."""
        return resolved(self.speedup, self.speedup_p10, self.speedup_p90, self.speedup_ci_low, self.speedup_ci_high)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "resolved": self.resolved}


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
        if precision == "bf16":  # its own copy, with the kernels inference runs: the same module may be timed in
            model = fast_attention(copy.deepcopy(model), device, precision)  # fp32 beside it
            cpu_kernels.put(model, device)  # (as every inference path opens `cpu_kernels.used`); never put back
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
                    device: str | torch.device | None = None, min_sample_ms: float = MIN_SAMPLE_MS,
                    precisions: Mapping[str, str] | None = None, settle_ms: float = 50.0) -> dict[str, LatencyResult]:
    """Time every model in `reps` paired rounds in one process and return {name: LatencyResult} (module docstring).

    `models` values: an nn.Module (fed random (batch, seq_len) inputs drawn from its vocabulary), an
    onnxruntime.InferenceSession (fed the same shapes by input name), or a zero-argument callable
    that runs one batch (its batch size is taken to be `batch`). `reference` names the model the
    speedups are relative to (default: the first). `device` "cpu"/"cuda" (default: cuda if present,
    only applied to nn.Modules). `min_sample_ms`: each sample is that many milliseconds of back-to-back calls at
    least (their mean is the sample; the calls per sample are calibrated per model on the warm-up, which is at least
    one call). `precisions`: name -> "bf16" for the nn.Modules timed under bf16 autocast (`distillery.precision`;
    the same module may appear twice, once in each precision); the others are timed in fp32 whatever precision is in
    force. `settle_ms`: on a CPU with more than one model, the pause before each sample that follows another
    runtime's (an ONNX session, a callable), so its threads have stopped spinning (module docstring).
    """
    if not models:
        raise ValueError("measure_latency needs at least one model")
    if reps < 1 or warmup < 0 or min_sample_ms < 0 or settle_ms < 0:
        raise ValueError(f"reps must be >= 1, warmup, min_sample_ms and settle_ms >= 0, got reps={reps}, "
                         f"warmup={warmup}, min_sample_ms={min_sample_ms}, settle_ms={settle_ms}")
    if reference is not None and reference not in models:
        raise KeyError(f"reference model {reference!r} is not among {sorted(models)}")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    precisions = precisions or {}
    if not cuda:
        steady_allocator()
    runners = {name: _runner(obj, batch, seq_len, dev, precisions.get(name, "fp32")) for name, obj in models.items()}

    def timed(fn: Callable[[], Any], calls: int) -> float:
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - t0) / calls

    many = not cuda and len(runners) > 1
    pause = {name: (TORCH_SETTLE_MS if isinstance(models[name], nn.Module) else settle_ms) / 1000 if many else 0.0
             for name in runners}
    calls: dict[str, int] = {}
    last: str | None = None
    for name, fn in runners.items():  # warm-up, the last call of which calibrates the sample's length
        for _ in range(max(0, warmup - 1)):
            fn()
        time.sleep(pause[last] if last else 0.0)
        once = timed(fn, 1)
        calls[name] = max(1, min(10_000, math.ceil(min_sample_ms / 1000 / once))) if once > 0 else 10_000
        last = name
    ref_name = reference if reference is not None else next(iter(models))
    others = [name for name in runners if name != ref_name]
    times: dict[str, list[float]] = {name: [] for name in runners}
    ratios: dict[str, list[float]] = {name: [] for name in runners}

    def sample(name: str) -> float:
        nonlocal last
        time.sleep(pause[last] if last else 0.0)
        t = timed(runners[name], calls[name])
        times[name].append(t)
        last = name
        return t

    for r in range(reps):
        before = sample(ref_name)
        if not others:
            ratios[ref_name].append(1.0)
        for name in others if r % 2 == 0 else others[::-1]:  # A B C, then C B A: no fixed position bias
            mine = sample(name)
            after = sample(ref_name)
            if mine > 0:
                ratios[name].append((before + after) / 2 / mine)
            ratios[ref_name].append(1.0)
            before = after
    threads = torch.get_num_threads()
    results = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        rs = ratios[name]
        results[name] = LatencyResult(
            name=name, batch=batch, seq_len=seq_len, reps=reps, calls=calls[name], median_ms=1000 * med,
            p10_ms=1000 * float(np.percentile(ts, 10)), p90_ms=1000 * float(np.percentile(ts, 90)),
            throughput=batch / med if med > 0 else float("inf"),
            device=str(dev), threads=threads, samples_ms=tuple(1000 * t for t in ts), ratios=tuple(rs),
            **_speedup_fields(rs))
    return results


def _speedup_fields(ratios: list[float]) -> dict[str, float | None]:
    """A LatencyResult's speedup fields from its per-round ratios: their median, 10th and 90th percentiles, and the
    median's 95% interval (`median_interval`; with too few rounds for one, their whole range, which is then judged
    as if it were one). All None without ratios (no reference)."""
    if not ratios:
        return dict.fromkeys(("speedup", "speedup_p10", "speedup_p90", "speedup_ci_low", "speedup_ci_high"))
    speedup, p10, p90 = (float(np.percentile(ratios, q)) for q in (50, 10, 90))
    low, high = median_interval(ratios) or (min(ratios), max(ratios))
    return {"speedup": speedup, "speedup_p10": p10, "speedup_p90": p90, "speedup_ci_low": float(low),
            "speedup_ci_high": float(high)}


#: how many sessions of each ONNX Runtime model a timing draws: sessions of one file time differently (thread
#: placement, memory layout), so one session would make an int8 figure a draw
ONNX_SESSIONS = 3
#: the rounds a timing starts with, spread evenly over its sessions: at 95% the median's interval of 9 rounds is their
#: 2nd and 8th smallest ratio (`distillery.efficiency.spread.median_interval`)
FIRST_ROUNDS = 9
#: a speedup whose median's 95% interval reaches no further than this share of it is pinned down: no more rounds
#: (at batch 32 most are after the first rounds; at batch 1 most need the planned ones)
PRECISE = 0.03


def time_sessions(models: Mapping[str, Any], *, reps: int = 20, sessions: int = ONNX_SESSIONS,
                  max_reps: int | None = None, **options: Any) -> dict[str, LatencyResult]:
    """`measure_latency` of `models` in runs, every model that has a ``fresh()`` (an ONNX Runtime session,
    `distillery.efficiency.export.OnnxModel`) in a new session in each run, the runs `pooled`: first `sessions`
    runs (one with no such model) that share `FIRST_ROUNDS` rounds (or ``reps``, if fewer; at least 3 a run); then,
    while a model's speedup is not pinned down (`LatencyResult.pinned`) and it has had fewer than ``reps`` rounds,
    one more run of the reference and those models; then, with ``max_reps``, while a model's speedup is unresolved
    (`LatencyResult.resolved`) and more rounds stay within ``max_reps``, likewise. Rounds narrow a median's
    interval, not the rounds' spread; a figure already pinned down spends no more of the machine's time."""
    if sessions < 1:
        raise ValueError(f"sessions must be >= 1, got {sessions}")
    if not any(hasattr(m, "fresh") for m in models.values()):
        sessions = 1
    per = max(3, math.ceil(min(FIRST_ROUNDS, reps) / sessions))
    reference = options.get("reference") or next(iter(models))
    models = dict(models)  # each model's latest session
    runs = []
    for s in range(sessions):
        if s:
            models = {name: m.fresh() if hasattr(m, "fresh") else m for name, m in models.items()}
        runs.append(measure_latency(models, reps=per, **options))
    result = pooled(runs)

    def more(wanted: Callable[[LatencyResult], bool]) -> None:
        nonlocal result
        while True:
            todo = {n for n, r in result.items() if n != reference and r.speedup is not None and wanted(r)}
            if not todo:
                return
            for n in todo | {reference}:  # a new session where the model has one
                models[n] = models[n].fresh() if hasattr(models[n], "fresh") else models[n]
            runs.append(measure_latency({n: m for n, m in models.items() if n == reference or n in todo}, reps=per,
                                        **options))
            result = pooled(runs)

    more(lambda r: r.reps < reps and not r.pinned)
    if max_reps is not None:
        more(lambda r: not r.resolved and r.reps + per <= max_reps)
    return result


def pooled(runs: list[Mapping[str, LatencyResult]]) -> dict[str, LatencyResult]:
    """Several timings of the same models as one: every round of every run counts (samples and per-round ratios
    joined, medians, percentiles and the median's interval over all of them); a model missing from a later run (one
    that needed no more rounds) is pooled over the runs that hold it."""
    if not runs:
        raise ValueError("pooled needs at least one timing")
    if len(runs) == 1:
        return dict(runs[0])
    out = {}
    for name, first in runs[0].items():
        rows = [r[name] for r in runs if name in r]
        ts = [t for r in rows for t in r.samples_ms]
        rs = [x for r in rows for x in r.ratios]
        med = statistics.median(ts)
        out[name] = replace(first, reps=sum(r.reps for r in rows), median_ms=med,
                            p10_ms=float(np.percentile(ts, 10)), p90_ms=float(np.percentile(ts, 90)),
                            throughput=first.batch / (med / 1000) if med > 0 else float("inf"),
                            samples_ms=tuple(ts), ratios=tuple(rs), **_speedup_fields(rs))
    return out


def latency_table(results: Mapping[str, LatencyResult]) -> str:
    """A Markdown table of LatencyResults (one row per model)."""
    lines = ["| model | batch | seq | calls per sample | median ms | p10-p90 ms | examples/s | speedup (p10-p90) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results.values():
        sp = describe_speedup(r.speedup, r.speedup_p10, r.speedup_p90, r.speedup_ci_low, r.speedup_ci_high)
        lines.append(f"| {r.name} | {r.batch} | {r.seq_len} | {r.calls} | {r.median_ms:.2f} | "
                     f"{r.p10_ms:.2f}-{r.p90_ms:.2f} | {r.throughput:.1f} | {sp} |")
    return "\n".join(lines) + "\n"
