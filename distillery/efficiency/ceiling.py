"""The machine's own matmul ceiling at a model's shapes, and a training run's share of it (model FLOPs utilisation).

A training step's useful work is its matrix multiplications: the FLOPs the papers count (`flops_per_example`: the
linear layers and attention products of every layer, 2 per multiply-add), three times for the student (forward,
input gradients, weight gradients) and once for a teacher that runs. The ceiling is not a data sheet's peak but the
throughput this machine's matmul reaches, measured in this process, in the precision the run trains in (bf16 under
autocast, else fp32), at the run's own shapes: every linear layer of a transformer layer (Q, K, V and output
projections, the FFN's two) at the run's tokens per batch, in the three forms of a training step (``Y = X W``,
``dX = dY W^T``, ``dW = X^T dY``). Its FLOP-weighted throughput (all the shapes' FLOPs over all their times) is what
the step's matmuls would reach if they alone ran, back to back: MFU = achieved FLOP/s over it, and what is missing
goes to everything else (elementwise work, casts, softmax, normalisation, the optimizer, data loading).
"""

from __future__ import annotations

import collections
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from distillery.efficiency.flops import flops_if_counted

#: the shortest timed sample of one shape, in seconds of back-to-back calls
SAMPLE_S = 0.02


@dataclass(frozen=True)
class Ceiling:
    """The measured matmul throughput (FLOP/s) at `shapes` (m, k, n) in `dtype` on `device`."""

    flops_per_s: float
    dtype: str
    device: str
    shapes: tuple[tuple[int, int, int], ...]
    threads: int


def layer_shapes(hidden: int, intermediate: int, tokens: int, *, training: bool = True) -> list[tuple[int, int, int]]:
    """(m, k, n) of one transformer layer's linear layers (Q, K, V, output: hidden -> hidden; FFN: hidden ->
    intermediate -> hidden) at `tokens` rows; with `training`, each also as its input-gradient and weight-gradient
    product."""
    out = []
    for k, n, count in ((hidden, hidden, 4), (hidden, intermediate, 1), (intermediate, hidden, 1)):
        forms = [(tokens, k, n)] + ([(tokens, n, k), (k, tokens, n)] if training else [])
        out += [s for s in forms for _ in range(count)]
    return out


def _operands(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Seeded (m, k) and (k, n) operands and an (m, n) output of one timed matmul."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(k, n, generator=g).to(device=device, dtype=dtype)
    return a, b, torch.empty(m, n, device=device, dtype=dtype)


def _time_mm(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, samples: int) -> float:
    """Median seconds of one (m, k) x (k, n) matmul over `samples` samples of back-to-back calls."""
    a, b, out = _operands(m, k, n, dtype, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.mm(a, b, out=out)  # warm-up, and the calls per sample
    sync()
    t0 = time.perf_counter()
    torch.mm(a, b, out=out)
    sync()
    once = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, min(10_000, int(SAMPLE_S / once)))
    times = []
    for _ in range(samples):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=out)
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


@functools.lru_cache(maxsize=64)
def _measured(shapes: tuple[tuple[int, int, int], ...], dtype: str, device: str, threads: int,
              samples: int) -> float:
    dev, dt = torch.device(device), getattr(torch, dtype)
    flops = seconds = 0.0
    for (m, k, n), count in collections.Counter(shapes).items():
        t = _time_mm(m, k, n, dt, dev, samples)
        flops += count * 2 * m * k * n
        seconds += count * t
    return flops / seconds


def matmul_ceiling(shapes: Sequence[tuple[int, int, int]], *, dtype: str = "float32", device: str = "cpu",
                   samples: int = 3) -> Ceiling:
    """The FLOP-weighted matmul throughput at `shapes` (each timed once however often it appears, weighted by its
    count), in `dtype` ("float32" or "bfloat16") on `device`, with this process's threads. Measured once per process
    for the same arguments (the machine does not change within a run)."""
    shapes = tuple(tuple(int(x) for x in s) for s in shapes)
    if not shapes or any(min(s) < 1 for s in shapes):
        raise ValueError(f"matmul_ceiling needs positive (m, k, n) shapes, got {shapes}")
    threads = torch.get_num_threads()
    rate = _measured(shapes, dtype, str(torch.device(device)), threads, samples)
    return Ceiling(rate, dtype, str(torch.device(device)), shapes, threads)


def matmul_pass(shapes: Sequence[tuple[int, int, int]], *, dtype: str = "float32",
                device: str = "cpu") -> tuple[float, Callable[[], None]]:
    """The FLOPs of one pass over `shapes` and a function that runs it: each shape's matmul once per time it
    appears, back to back. Timed in the same rounds as a training step (alternating with it), its FLOPs over its
    median time are `matmul_ceiling` measured side by side with the step: a machine's slow spells then slow both
    alike, where a ceiling measured before or after the step can fall in another spell."""
    dev, dt = torch.device(device), getattr(torch, dtype)
    shapes = [tuple(int(x) for x in s) for s in shapes]
    operands = {s: _operands(*s, dt, dev) for s in set(shapes)}
    order = [operands[s] for s in shapes]

    def run() -> None:
        for a, b, out in order:
            torch.mm(a, b, out=out)

    return float(sum(2 * m * k * n for m, k, n in shapes)), run


def _dims(config: Any) -> tuple[int, int] | None:
    """(hidden, intermediate) of a config's layers (MobileBERT: its bottleneck width), None when unknown."""
    get = (config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d))
    if get("model_type") == "mobilebert" and get("use_bottleneck"):
        return get("intra_bottleneck_size"), get("intermediate_size")
    hidden = get("hidden_size") or get("dim")
    inter = get("intermediate_size") or get("hidden_dim")
    return (int(hidden), int(inter)) if hidden and inter else None


def _head(model: Any) -> str:
    name = type(model).__name__
    return "mlm" if name.endswith(("ForMaskedLM", "ForPreTraining")) else "classifier"


class StepFlops:
    """A training step's FLOPs from its inputs (the Trainer's `floating_point_ops`): the student's forward counted
    three times (its backward is two more products of every forward one), the teacher's once when `teacher_runs`
    says it ran for these inputs. Keeps the totals it counted (FLOPs, steps, tokens, padded positions) for
    `utilisation`. A model type whose FLOPs are not counted counts 0. `unpadded`: the models run on the real tokens
    alone (`distillery.training.unpadding`), so a batch counts the share of its positions that are real (the
    attention, which runs padded, is a few percent of a step at GLUE's lengths and goes uncounted). `sparse`: a
    masked LM's prediction head runs on the labelled positions alone (`distillery.training.sparse_prediction`), so
    a batch counts the head there only."""

    def __init__(self, student: Any, teacher: Any = None,
                 teacher_runs: Callable[[Mapping[str, Any]], bool] | None = None, unpadded: bool = False,
                 sparse: bool = False) -> None:
        self.student, self.teacher = student, teacher
        self.teacher_runs = teacher_runs or (lambda inputs: teacher is not None)
        self.unpadded, self.sparse = unpadded, sparse
        self.flops = 0.0
        self.steps = self.tokens = self.padded = 0
        self._configs: dict[int, dict] = {}
        self._per_example: dict[tuple[int, int], int] = {}

    def _model(self, model: Any, length: int, head: str | None = None) -> int:
        """Its FLOPs per example at `length` with its own head (or `head`), counted once per model, length and head
        (the model's config is read once: it does not change within a run)."""
        head = head or _head(model)
        key = (id(model), length, head)
        if key not in self._per_example:
            if id(model) not in self._configs:
                self._configs[id(model)] = model.config.to_dict()
            self._per_example[key] = flops_if_counted(self._configs[id(model)], length, head=head) or 0
        return self._per_example[key]

    def __call__(self, inputs: Mapping[str, Any]) -> float:
        ids = inputs.get("input_ids")
        if ids is None or ids.dim() != 2:
            return 0.0
        batch, length = ids.shape
        student = self._model(self.student, length)
        labels = inputs.get("labels")
        head = 0  # the MLM head's FLOPs at every position, when it runs on the labelled ones alone
        if self.sparse and _head(self.student) == "mlm" and labels is not None and labels.shape == ids.shape:
            head = student - self._model(self.student, length, "classifier")
        flops = 3 * batch * (student - head)
        if self.teacher is not None and self.teacher_runs(inputs):
            flops += batch * self._model(self.teacher, length)
        mask = inputs.get("attention_mask")
        padded = int((mask == 0).sum()) if mask is not None else 0
        if self.unpadded:
            flops *= 1 - padded / (batch * length)
        if head:
            flops += 3 * head * int((labels != -100).sum()) / length
        self.steps += 1
        self.tokens += batch * length
        self.padded += padded
        self.flops += flops
        return float(flops)


def utilisation(counted: StepFlops, seconds: float, *, bf16: bool, device: str = "cpu") -> dict[str, float]:
    """What a training run achieved against the ceiling at its own shapes: ``train_tflops`` (counted FLOPs over the
    run's wall seconds), ``ceiling_tflops`` (`matmul_ceiling` at the student's layer shapes and the run's mean tokens
    per step, in the run's precision), ``mfu`` (their ratio) and ``padded_share`` (padded positions among the
    tokens the steps fed). Empty when nothing was counted."""
    dims = _dims(counted.student.config)
    if not counted.steps or counted.flops <= 0 or seconds <= 0 or dims is None:
        return {}
    tokens = max(1, round(counted.tokens / counted.steps))
    ceiling = matmul_ceiling(layer_shapes(*dims, tokens), dtype="bfloat16" if bf16 else "float32", device=device)
    achieved = counted.flops / seconds
    figures = {"train_tflops": achieved / 1e12, "ceiling_tflops": ceiling.flops_per_s / 1e12,
               "mfu": achieved / ceiling.flops_per_s, "padded_share": counted.padded / counted.tokens}
    return {k: float(f"{v:.4g}") for k, v in figures.items()}
