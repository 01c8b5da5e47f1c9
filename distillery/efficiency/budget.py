"""A latency budget in, the student shapes that meet it out, measured on the machine that will serve them.

AutoTinyBERT (Yin et al., 2021) searches sub-architectures under a speedup constraint with a latency *predictor*
trained on CPU timings; here every candidate is *timed* instead, on random weights (the weights do not change the
time of a forward pass), in paired rounds with the teacher as the reference (`distillery.efficiency.latency`:
warm-up, alternating order, samples of tens of milliseconds), so the figure is the one of this CPU, these threads and
this runtime. A candidate meets a speedup bound when the low end (10th percentile) of its per-round ratios does, and a
latency bound when its 90th-percentile latency does: one lucky median does not choose the shape.

Candidates are students of the teacher's architecture that are shallower and/or narrower: depth x width (the
teacher's head size kept, so the head count follows the width, as structured pruning of heads leaves it) x FFN
size (the teacher's FFN/width ratio times each of ``ffn_ratios``), each in every deployed form the machine serves:
``fp32`` and ``bf16`` (PyTorch; bf16 only where `distillery.precision` says it is fast) and ``int8`` (dynamic
quantisation through ONNX Runtime, `distillery.efficiency.export`). A budget is a speedup over the fp32 teacher
and/or a latency in milliseconds, at one batch size and sequence length.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from distillery.efficiency.latency import LatencyResult
from distillery.errors import UserError
from distillery.shape import Dims

FORMS = ("fp32", "bf16", "int8")

#: (models to time: name -> nn.Module or ONNX session, precisions: name -> "bf16" for the modules timed under bf16
#: autocast) -> every name's timing: a `LatencyResult` (its samples and its ratio to the teacher in each round), or
#: milliseconds per batch in each round (a sequence, round r of every name timed together; one number is one round;
#: the ratio is the teacher's time in that round over it). The default times them (`measure_latency`); a test passes
#: a fake clock.
Timer = Callable[[Mapping[str, Any], Mapping[str, str]], Mapping[str, "LatencyResult | float | Sequence[float]"]]


class BudgetError(UserError, ValueError):
    """No candidate meets the budget, or the budget itself is malformed."""


@dataclass(frozen=True)
class Budget:
    """At most ``latency_ms`` per batch and/or at least ``speedup`` times faster than the fp32 teacher, measured at
    ``batch`` x ``seq_len``."""

    speedup: float | None = None
    latency_ms: float | None = None
    batch: int = 1
    seq_len: int = 128
    #: the fraction of the limit kept free: a candidate must be this much faster than the bound (timings of small
    #: models move between runs, and the evaluate stage times the chosen one again)
    margin: float = 0.0

    def __post_init__(self) -> None:
        if self.speedup is None and self.latency_ms is None:
            raise BudgetError("a budget needs speedup (over the teacher) or latency_ms")
        if (self.speedup is not None and self.speedup <= 0) or (self.latency_ms is not None and self.latency_ms <= 0):
            raise BudgetError(f"budget: speedup and latency_ms must be > 0, got {self.speedup}, {self.latency_ms}")
        if not 0 <= self.margin < 1:
            raise BudgetError(f"budget: margin must lie in [0, 1), got {self.margin}")
        if self.batch < 1 or self.seq_len < 1:
            raise BudgetError(f"budget: batch and seq_len must be >= 1, got {self.batch}, {self.seq_len}")

    def limit_ms(self, teacher_ms: float) -> float:
        """The largest latency that meets every bound with the margin kept free, given the teacher's."""
        limits = [teacher_ms / self.speedup] if self.speedup is not None else []
        if self.latency_ms is not None:
            limits.append(self.latency_ms)
        return min(limits) * (1 - self.margin)

    def met_by(self, timed: "Timed") -> bool:
        """Whether a timed candidate meets every bound with the margin kept free, on the pessimistic end of its
        rounds: the 10th percentile of its speedups, the 90th of its latencies."""
        ok = self.speedup is None or timed.speedup_low * (1 - self.margin) >= self.speedup
        return ok and (self.latency_ms is None or timed.ms_high <= self.latency_ms * (1 - self.margin))

    def describe(self) -> str:
        parts = ([f"speedup >= {self.speedup:g}x over the fp32 teacher"] if self.speedup is not None else []) + (
            [f"latency <= {self.latency_ms:g} ms"] if self.latency_ms is not None else [])
        margin = f", {self.margin:.0%} margin" if self.margin else ""
        return f"{' and '.join(parts)} at batch {self.batch}, length {self.seq_len}{margin}"


@dataclass(frozen=True)
class Candidate:
    """One student shape in one deployed form."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    form: str = "fp32"

    @property
    def shape(self) -> dict[str, int]:
        """The ``shape`` of a student in params."""
        return {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "intermediate": self.intermediate}

    @property
    def shape_name(self) -> str:
        return f"{self.layers}x{self.hidden}-h{self.heads}-f{self.intermediate}"

    @property
    def name(self) -> str:
        return f"{self.shape_name}-{self.form}"


@dataclass(frozen=True)
class Timed:
    """A candidate's measured median latency (and its 90th percentile over the rounds), its speedup over the fp32
    teacher (the median of the per-round ratios, and their 10th percentile) and its parameter count."""

    candidate: Candidate
    ms: float
    speedup: float
    params: int
    speedup_low: float = 0.0  # the 10th percentile of the per-round speedups
    ms_high: float = 0.0  # the 90th percentile of the per-round latencies

    def __post_init__(self) -> None:  # one round: its figures are their own bounds
        if not self.speedup_low:
            object.__setattr__(self, "speedup_low", self.speedup)
        if not self.ms_high:
            object.__setattr__(self, "ms_high", self.ms)


def candidates(teacher: Dims, *, depths: Iterable[int] | None = None, width_fractions: Sequence[float] = (1, .75, .5),
               ffn_ratios: Sequence[float] = (1.0, 0.5), forms: Sequence[str] = FORMS) -> list[Candidate]:
    """Every depth x width x FFN x form, shallower or narrower than the teacher (never the teacher's own shape).

    ``depths``: default 1 .. teacher layers. ``width_fractions``: of the teacher's heads, rounded to whole heads of
    the teacher's head size. ``ffn_ratios``: of the teacher's FFN/width ratio."""
    bad = [f for f in forms if f not in FORMS]
    if bad:
        raise BudgetError(f"unknown deployed form(s) {bad}; known: {', '.join(FORMS)}")
    head_size = teacher.hidden // teacher.heads
    ratio = teacher.intermediate / teacher.hidden
    depths = sorted(set(depths)) if depths is not None else list(range(1, teacher.layers + 1))
    if not depths or min(depths) < 1 or max(depths) > teacher.layers:
        raise BudgetError(f"search depths must lie in 1..{teacher.layers} (the teacher's), got {depths}")
    heads = sorted({max(1, round(teacher.heads * f)) for f in width_fractions if 0 < f <= 1}, reverse=True)
    if not heads:
        raise BudgetError(f"width fractions must lie in (0, 1], got {list(width_fractions)}")
    out = []
    for n_layers in depths:
        for h in heads:
            hidden = h * head_size
            for inter in sorted({max(1, round(ratio * hidden * r)) for r in ffn_ratios if 0 < r <= 1}, reverse=True):
                if (n_layers, hidden, inter) == (teacher.layers, teacher.hidden, teacher.intermediate):
                    continue
                out += [Candidate(n_layers, hidden, h, inter, form) for form in forms]
    return out


def _models(teacher, shapes: Iterable[Candidate], workdir: Path) -> tuple[dict, dict, dict]:
    """name -> a random-weight model (or ONNX int8 session) of every candidate, the bf16 names, and shape name ->
    parameter count."""
    from distillery.efficiency.export import OnnxModel, export_onnx, int8_export
    from distillery.models import build_student, num_parameters

    models: dict[str, Any] = {"teacher": teacher}
    precisions: dict[str, str] = {}
    built: dict[str, Any] = {}
    for c in shapes:
        if c.shape_name not in built:
            built[c.shape_name] = build_student(c.shape, None, head="sequence-classification",
                                                base=teacher.config).eval()
        model = built[c.shape_name]
        if c.form == "int8":
            fp32 = workdir / f"{c.shape_name}.onnx"
            if not fp32.exists():
                export_onnx(model, fp32, check=False)
            int8 = workdir / f"{c.shape_name}-int8.onnx"
            int8_export(model, fp32, int8)  # the form the evaluate stage serves and times
            models[c.name] = OnnxModel(int8, vocab_size=model.config.vocab_size)
        else:
            models[c.name] = model
            if c.form == "bf16":
                precisions[c.name] = "bf16"
    return models, precisions, {name: num_parameters(model) for name, model in built.items()}


def measured_timer(budget: Budget, *, reps: int = 10, warmup: int = 2) -> Timer:
    """The real clock: every model in paired rounds with the teacher (`measure_latency`, as the evaluate stage times
    the chosen student)."""
    from distillery.efficiency.latency import measure_latency

    def timer(models: Mapping[str, Any], precisions: Mapping[str, str]) -> Mapping[str, LatencyResult]:
        return measure_latency(models, batch=budget.batch, seq_len=budget.seq_len, reps=reps, warmup=warmup,
                               reference="teacher", device="cpu", precisions=precisions)

    return timer


def _rounds(value: "LatencyResult | float | Sequence[float]") -> list[float]:
    if isinstance(value, LatencyResult):
        return list(value.samples_ms)
    return [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]


def _percentile(values: Sequence[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q))


def time_candidates(teacher, cands: Sequence[Candidate], budget: Budget, *, timer: Timer | None = None,
                    workdir: str | Path | None = None, sessions: int | None = None) -> tuple[float, list[Timed]]:
    """(the fp32 teacher's median ms, every candidate timed), fastest first. ``teacher``: the teacher model (its
    config gives the students' architecture; its weights are timed as they are). Forms the machine cannot serve
    (bf16 without fast bf16) must have been left out of ``cands`` (`available_forms`).

    ``sessions`` (default `ONNX_SESSIONS`, as the evaluate stage's `time_sessions`): the timer runs that many times,
    every int8 candidate in a fresh ONNX Runtime session of its file each time, and every round of every session
    counts: a candidate's median and spread are over all of them (its speedup in a round is the teacher's time in that
    round over its own). Sessions of one file time differently, so one session would make the shape chosen a draw."""
    if not cands:
        raise BudgetError("no candidate shapes to time")
    from distillery.efficiency.export import OnnxModel
    from distillery.efficiency.latency import ONNX_SESSIONS

    sessions = ONNX_SESSIONS if sessions is None else sessions
    if sessions < 1:
        raise BudgetError(f"sessions must be >= 1, got {sessions}")

    timer = timer or measured_timer(budget)
    with tempfile.TemporaryDirectory(prefix="distillery-budget-") as tmp:
        models, precisions, params = _models(teacher, cands, Path(workdir or tmp))
        figures = [timer(models, precisions)]
        for _ in range(sessions - 1):
            models = {name: m.fresh() if isinstance(m, OnnxModel) else m for name, m in models.items()}
            figures.append(timer(models, precisions))
    ms: dict[str, list[float]] = {name: [] for name in figures[0]}
    ratios: dict[str, list[float]] = {name: [] for name in figures[0]}
    for f in figures:
        ref = _rounds(f["teacher"])
        for name in ms:
            mine = _rounds(f[name])
            ms[name] += mine
            ratios[name] += (list(f[name].ratios) if isinstance(f[name], LatencyResult)
                             else [r / m for r, m in zip(ref, mine) if m > 0])
    teacher_ms = statistics.median(ms["teacher"])
    timed = [Timed(c, statistics.median(ms[c.name]), statistics.median(ratios[c.name]), params[c.shape_name],
                   speedup_low=_percentile(ratios[c.name], 10), ms_high=_percentile(ms[c.name], 90)) for c in cands]
    return teacher_ms, sorted(timed, key=lambda t: t.ms)


def available_forms(device: str = "cpu") -> tuple[str, ...]:
    """The deployed forms this machine serves: bf16 only where `distillery.precision` finds it fast."""
    from distillery.precision import bf16_supported

    return tuple(f for f in FORMS if f != "bf16" or bf16_supported(device))


def within_budget(timed: Sequence[Timed], teacher_ms: float, budget: Budget) -> list[Timed]:
    """The candidates that meet the budget, largest first (most parameters: the best score expected), then fastest.
    None meets it: one `BudgetError` naming the budget and the fastest candidate's figure."""
    limit = budget.limit_ms(teacher_ms)
    keep = [t for t in timed if budget.met_by(t)]
    if not keep:
        fastest = min(timed, key=lambda t: t.ms)
        raise BudgetError(
            f"no candidate meets the budget ({budget.describe()}: <= {limit:.2f} ms, the fp32 teacher "
            f"{teacher_ms:.2f} ms); the fastest, {fastest.candidate.name}, takes {fastest.ms:.2f} ms "
            f"({fastest.speedup:.2f}x): loosen the budget or allow smaller shapes")
    return sorted(keep, key=lambda t: (-t.params, t.ms))


def finalists(keep: Sequence[Timed], n: int) -> list[Timed]:
    """Of the candidates that meet the budget (`within_budget`), each shape once, in its most faithful form that
    meets it (fp32, else bf16, else int8: the one whose scores the search's fp32 training predicts best); then ``n``
    of them: first the largest shape of each depth (so deep-and-narrow competes with shallow-and-wide: most
    parameters alone would pick the widest shapes, the embeddings being most of them), then the next largest; each
    group by parameters (the best score expected first), fastest first among equals."""
    best: dict[str, Timed] = {}
    for t in keep:
        held = best.get(t.candidate.shape_name)
        if held is None or FORMS.index(t.candidate.form) < FORMS.index(held.candidate.form):
            best[t.candidate.shape_name] = t
    ranked = sorted(best.values(), key=lambda t: (-t.params, t.ms))
    depths: dict[int, Timed] = {}
    for t in ranked:
        depths.setdefault(t.candidate.layers, t)
    firsts = list(depths.values())
    return (firsts + [t for t in ranked if t not in firsts])[:n]


def confirm(teacher, keep: Sequence[Timed], budget: Budget, n: int, *, timer: Timer | None = None,
            workdir: str | Path | None = None) -> list[Timed]:
    """`finalists` of ``keep`` whose figures hold when each is timed again alone beside the teacher (`time_candidates`
    of that candidate only): the pass over every candidate lasts minutes, in which the machine's speed drifts, and a
    borderline shape met the budget or missed it by the draw; one candidate's pass lasts seconds. Each finalist gets
    its second timing's figures; one that no longer meets the budget is dropped and the next in line takes its place.
    None holds: `BudgetError`, as `within_budget`'s."""
    pool, again = list(keep), {}
    while pool:
        final = finalists(pool, n)
        todo = [t for t in final if t.candidate.name not in again]
        if not todo:
            return [again[t.candidate.name] for t in final]
        for t in todo:
            _, (timed,) = time_candidates(teacher, [t.candidate], budget, timer=timer, workdir=workdir)
            again[t.candidate.name] = timed
            pool = [timed if p is t else p for p in pool] if budget.met_by(timed) else [p for p in pool if p is not t]
    raise BudgetError(f"no candidate meets the budget ({budget.describe()}) when timed again alone beside the "
                      f"fp32 teacher: {', '.join(f'{t.candidate.name} {t.speedup:.2f}x' for t in again.values())}; "
                      "loosen the budget or allow smaller shapes")


def successive_halving(names: Sequence[str], score: Callable[[str, int], float], first: int,
                       ) -> tuple[str, list[dict[str, float]]]:
    """Successive halving (Jamieson & Talwalkar, 2016; the schedule of Hyperband's brackets): every name is scored
    with ``first`` training examples, the better half (rounded up) goes on with twice as many, until one is left.
    ``score(name, examples)``: higher is better; a tie keeps the earlier name (``names`` comes largest first).
    Returns (the winner, each round's scores: name -> score). One name: it wins without training."""
    if not names:
        raise BudgetError("no candidate to search")
    alive, rounds, examples = list(names), [], first
    while len(alive) > 1:
        scores = {name: float(score(name, examples)) for name in alive}
        rounds.append(scores)
        ranked = sorted(alive, key=lambda name: -scores[name])  # stable: ties keep the earlier name
        alive = ranked[: (len(alive) + 1) // 2]
        examples *= 2
    return alive[0], rounds


__all__ = ["Budget", "BudgetError", "Candidate", "FORMS", "Timed", "Timer", "available_forms", "candidates", "confirm",
           "finalists", "measured_timer", "successive_halving", "time_candidates", "within_budget"]
