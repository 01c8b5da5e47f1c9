"""The evaluation report: a table laid out like TinyBERT's Table 1 plus score/size/speed plots.

Table columns (Jiao et al. 2020, Table 1): System, #Params, #FLOPs, Speedup, one dev score per task,
Avg, and the retention of the teacher's average ("96.8% the performance of its teacher" is a student
average over the teacher average). Written as reports/table.md and reports/table.html; plots
score_vs_latency.png, score_vs_size.png and loss_curves.png with matplotlib's Agg backend.
"""

from __future__ import annotations

import csv
import html
import math
import os
from pathlib import Path
from typing import Any, Mapping

from distillery.efficiency.spread import describe_speedup, resolved, speed_of
from distillery.io import atomic_path, write_text

METRIC_KEYS = ("accuracy", "f1", "mcc", "pearson", "spearman")
INFO_KEYS = {"params", "flops", "latency_ms", "retention", "speedup"}


class ReportError(ValueError):
    """The summary, latency or loss-curve input is malformed."""


def task_score(task: str, metrics: Mapping[str, Any]) -> float | None:
    """The task's headline score, a fraction as the models' main score is (`distillery.task_kinds`: GLUE's main score,
    the mean of F1/acc for MRPC/QQP, of Pearson/Spearman for STS-B, MCC for CoLA, accuracy otherwise; SQuAD's F1 over
    100, so that an average over GLUE and SQuAD adds like to like); unknown tasks: the mean of the metric keys present."""
    present = {k: float(metrics[k]) for k in METRIC_KEYS if isinstance(metrics.get(k), (int, float))}
    if not present:
        return None
    try:
        from distillery.task_kinds import task_kind

        return float(task_kind(task).main_score(present))
    except (ImportError, KeyError, ValueError):
        return sum(present.values()) / len(present)


#: the summary's key for the averages over its tasks (not a task)
AVERAGE = "average"


def verdicts(summary: Mapping[str, Mapping[str, Mapping[str, Any]]], students: list[str]) -> list[str]:
    """What the run bought, one line per task in words: its best student's score against the teacher's (retention),
    its speedup at batch 1 (and int8's), its gain over the same student trained without distillation, and how many
    students beat their direct baseline."""
    lines = []
    for task, models in summary.items():
        teacher = models.get("teacher", {})
        scored = {s: task_score(task, models[s]) for s in students if s in models}
        scored = {s: v for s, v in scored.items() if v is not None}
        t_score = task_score(task, teacher)
        if not scored or t_score is None or task == AVERAGE:
            continue
        best = max(scored, key=scored.get)
        row = models[best]
        kept = retention(scored[best], t_score)
        line = f"{task}: best student {best} {scored[best]:.4f}" + (
            f" = {kept:.2f} of the teacher's {t_score:.4f}" if kept is not None else f" (teacher {t_score:.4f})")
        if isinstance(row.get("speedup_b1"), (int, float)):
            line += f", {_speed(row, '_b1', 'faster at batch 1')}"
            if isinstance(row.get("speedup_b1_int8"), (int, float)):
                line += f" ({_speed(row, '_b1_int8', 'in int8')})"
        gains = {s: models[s]["gain_over_direct"] for s in scored
                 if isinstance(models[s].get("gain_over_direct"), (int, float))}
        if best in gains:
            line += (f", {100 * gains[best]:+.1f} points over the same student without distillation; "
                     f"{sum(g > 0 for g in gains.values())} of {len(gains)} students beat their direct baseline")
        lines.append(line)
    return lines


#: the kinds of training rows a task stage reads (`train_rows_<kind>` in the summary), as the report names them
ROW_KINDS = {"gold": "gold", "augmented": "augmented", "unlabeled": "unlabelled"}


def rows_lines(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """One line per task: the training rows of each kind each student and direct baseline read (the most one of its
    steps read), e.g. "Training rows on sst2 (gold / augmented / unlabelled): tiny 8,000 / 0 / 59,349; ..."."""
    lines = []
    for task, models in summary.items():
        counts = {m: [r.get(f"train_rows_{k}", 0) for k in ROW_KINDS] for m, r in models.items()
                  if any(f"train_rows_{k}" in r for k in ROW_KINDS)}
        if counts:
            each = "; ".join(f"{m} " + " / ".join(f"{n:,}" for n in c) for m, c in counts.items())
            lines.append(f"Training rows on {task} ({' / '.join(ROW_KINDS.values())}): {each}")
    return lines


def _speed(row: Mapping[str, Any], suffix: str, what: str) -> str:
    """"2.6x [2.5-2.7] faster at batch 1": a speedup with the 10th-90th percentiles of its paired rounds; "speedup at
    batch 1 unresolved [1.2-4.0x over the rounds]" when they do not pin the median down (a busy machine, or a runtime
    whose calls vary: `distillery.efficiency.spread`)."""
    speed = speed_of(row, suffix)
    p10, p90 = speed[1:3]
    if isinstance(p10, (int, float)) and isinstance(p90, (int, float)) and not resolved(*speed):
        return f"speedup {what.removeprefix('faster ')} unresolved [{p10:.1f}-{p90:.1f}x over the rounds]"
    return f"{describe_speedup(*speed)} {what}"


def retention(score: float, teacher_score: float) -> float | None:
    """A score over its teacher's (the papers' "retains 96.8% of its teacher"); None when the teacher's score is not
    positive (an MCC, F1 or correlation of 0 or below), where the ratio means nothing."""
    return score / teacher_score if teacher_score > 0 else None


def averages(main: Mapping[str, Mapping[str, float]], teacher: str) -> dict[str, dict[str, Any]]:
    """model -> its mean main score over the tasks, for the models scored on every task (`main`: task -> model ->
    main score); beside each other model, `retention` (its average over the teacher's average, the papers'
    "retains 96.8% of its teacher") and `mean_task_retention` (the mean of its per-task retentions)."""
    tasks = list(main)
    common = [m for m in main[tasks[0]] if all(m in main[t] for t in tasks)] if tasks else []
    out: dict[str, dict[str, Any]] = {}
    for model in common:
        out[model] = {"main": sum(main[t][model] for t in tasks) / len(tasks), "tasks": tasks}
    if teacher in out and out[teacher]["main"] > 0:
        for model, row in out.items():
            if model != teacher and all(main[t][teacher] > 0 for t in tasks):
                row["retention"] = retention(row["main"], out[teacher]["main"])
                row["mean_task_retention"] = sum(retention(main[t][model], main[t][teacher]) for t in tasks) / len(tasks)
    return out


def _latency_ms(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Mapping):
        v = value.get("median_ms", value.get("latency_ms"))
        return float(v) if v is not None else None
    v = getattr(value, "median_ms", None)  # distillery.efficiency.LatencyResult
    if v is None:
        raise ReportError(f"latency entry of type {type(value).__name__} has no median_ms")
    return float(v)


def build_rows(summary: Mapping[str, Mapping[str, Mapping[str, Any]]], *, latency: Mapping[str, Any] | None = None,
               teacher: str | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """(tasks, rows): one row per model with params, flops, latency_ms, speedup, scores{task}, avg, retention.

    The teacher is `teacher` or else the one model with no "retention" entry in any task (first seen
    when ambiguous); speedup and retention are relative to it.
    """
    if not isinstance(summary, Mapping) or not summary:
        raise ReportError("summary must be a non-empty {task: {model: {metric: value}}} mapping")
    tasks = [t for t in summary if t != AVERAGE]
    models: dict[str, dict[str, Any]] = {}
    for task in tasks:
        per_model = summary[task]
        if not isinstance(per_model, Mapping):
            raise ReportError(f"summary[{task!r}] must map model names to metric dicts")
        for name, metrics in per_model.items():
            if not isinstance(metrics, Mapping):
                raise ReportError(f"summary[{task!r}][{name!r}] must be a dict of metrics")
            row = models.setdefault(name, {"model": name, "scores": {}, "is_student": False})
            score = task_score(task, metrics)
            if score is not None:
                row["scores"][task] = score
            for key in ("params", "flops", "latency_ms"):
                if metrics.get(key) is not None:
                    row[key] = metrics[key]
            if "retention" in metrics:
                row["is_student"] = True
            if isinstance(gain := metrics.get("gain_over_direct"), (int, float)) and gain <= 0:
                row.setdefault("below_direct", []).append(task)  # distillation bought nothing here
    if teacher is None:
        candidates = [n for n, r in models.items() if not r["is_student"]]
        teacher = candidates[0] if candidates else None
    elif teacher not in models:
        raise ReportError(f"teacher {teacher!r} is not in the summary (models: {sorted(models)})")
    for name, value in (latency or {}).items():
        if name in models:
            models[name]["latency_ms"] = _latency_ms(value)
            if isinstance(value, Mapping) and isinstance(value.get("speedup"), (int, float)):
                models[name]["rounds"] = speed_of(value)
    t_row = models.get(teacher) if teacher else None
    for row in models.values():
        scores = row["scores"]
        # over every task, as in the papers' tables: a model not scored on one (a task whose teacher failed the gate
        # has no student) gets none rather than an average over fewer tasks beside the others'
        row["avg"] = sum(scores.values()) / len(scores) if scores and len(scores) == len(tasks) else None
        row["speedup"] = None
        if row.get("rounds"):  # the median of paired rounds, with its spread
            row["speedup"] = row["rounds"][0]
        elif t_row and t_row.get("latency_ms") and row.get("latency_ms"):
            row["speedup"] = t_row["latency_ms"] / row["latency_ms"]
        row["retention"] = None
        if t_row and row is not t_row and row["is_student"]:  # the summary gives no retention without a teacher
            common = [t for t in scores if t in t_row["scores"]]
            t_avg = sum(t_row["scores"][t] for t in common) / len(common) if common else 0
            if common:
                row["retention"] = retention(sum(scores[t] for t in common) / len(common), t_avg)
        row["is_teacher"] = row is t_row
    ordered = ([t_row] if t_row else []) + [r for r in models.values() if r is not t_row]
    return tasks, ordered


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}" if abs(x) <= 1.0 else f"{x:.1f}"


def _count(x: Any, unit: float, suffix: str) -> str:
    """1.2B / 14.5M as in the papers' tables; small models keep significant digits (0.034B, not 0.0B)."""
    if x is None:
        return "-"
    v = float(x) / unit
    return f"{v:.1f}{suffix}" if v >= 1 else f"{v:.2g}{suffix}"


def _cells(tasks: list[str], row: dict[str, Any]) -> list[str]:
    name = row["model"] + (" (teacher)" if row["is_teacher"] else "")
    if row.get("below_direct"):
        name += f" (not above direct: {', '.join(row['below_direct'])})"
    speed = "-" if row["speedup"] is None else f"{row['speedup']:.1f}x"
    if row.get("rounds") and not row.get("is_teacher"):
        speed = describe_speedup(*row["rounds"])
    return ([name, _count(row.get("params"), 1e6, "M"), _count(row.get("flops"), 1e9, "B"), speed]
            + [_pct(row["scores"].get(t)) for t in tasks] + [_pct(row["avg"]),
               "-" if row["retention"] is None else f"{100 * row['retention']:.1f}%"])


def _header(tasks: list[str]) -> list[str]:
    return ["System", "#Params", "#FLOPs", "Speedup"] + [t.upper() for t in tasks] + ["Avg", "Retention"]


def _intro(tasks: list[str], rows: list[dict[str, Any]]) -> str:
    text = ("Dev-set scores (x100), parameters, FLOPs per example and speedup over the teacher (the median of paired "
            "rounds, [10th-90th percentile]; unresolved when they do not pin the median down); "
            "retention = student average / teacher average.")
    if any(r["model"] == "trivial" for r in rows):
        from distillery.task_kinds import task_kind

        what = "; ".join(dict.fromkeys(task_kind(t).trivial_description for t in tasks))
        text += f" trivial: the floor a teacher must beat: {what}."
    if any(r["model"].endswith("-direct") for r in rows):
        text += (" Rows ending in -direct: the student's architecture and initialisation trained on the gold"
                 " labels alone (no teacher), what the student would be without distillation.")
    if any(r.get("below_direct") for r in rows):
        text += (" A student marked 'not above direct' does not beat its direct baseline on those tasks: the registry"
                 " never makes it champion.")
    if any(r["model"].endswith("-int8") for r in rows):
        text += " Rows ending in -int8: the student above, exported to ONNX with int8 dynamic quantisation."
    if any(r["model"].endswith("-bf16") for r in rows):
        text += (" Rows ending in -bf16: the student above served by PyTorch under bf16 autocast (its weights"
                 " unchanged).")
    return text


def render_markdown(tasks: list[str], rows: list[dict[str, Any]], notes: list[str] = (),
                    lines: list[str] = (), utilisation: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """The table under its introduction (with `notes`), then `lines` as a list, one item each; then each training
    stage's share of the machine's matmul ceiling (`stage_utilisation`), when given."""
    head = _header(tasks)
    table = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    table += ["| " + " | ".join(_cells(tasks, r)) + " |" for r in rows]
    items = "".join(f"- {line}\n" for line in lines)
    text = " ".join([_intro(tasks, rows), *notes]) + "\n\n" + (items + "\n" if items else "") + "\n".join(table) + "\n"
    if utilisation:
        util = ["| " + " | ".join(UTILISATION_HEADER) + " |", "|---|" + "---:|" * (len(UTILISATION_HEADER) - 1)]
        util += ["| " + " | ".join(_utilisation_cells(name, u)) + " |" for name, u in utilisation.items()]
        text += "\n" + UTILISATION_INTRO + "\n\n" + "\n".join(util) + "\n"
    return text


#: the columns of the training stages' utilisation table
UTILISATION_HEADER = ("training run", "TFLOP/s", "matmul ceiling TFLOP/s", "MFU", "padded positions")
UTILISATION_INTRO = ("Each training stage's achieved FLOP/s (the papers' count: student forward and backward, the "
                     "teacher's forward where it ran, over the run's wall time) against this machine's own matmul "
                     "throughput at the run's shapes and precision, measured in the run (its model FLOPs "
                     "utilisation, MFU), and the share of the positions it fed that were padding.")


def _utilisation_cells(name: str, u: Mapping[str, float]) -> list[str]:
    return [name, f"{u['train_tflops']:.3g}", f"{u['ceiling_tflops']:.3g}", f"{u['mfu']:.0%}",
            f"{u.get('padded_share', 0.0):.0%}"]


def stage_utilisation(curves: Mapping[str, str | os.PathLike]) -> dict[str, dict[str, float]]:
    """name -> the end row's ``train_tflops``, ``ceiling_tflops``, ``mfu`` and ``padded_share`` of every training
    log (`train_log.csv`) whose run logged them (`distillery.efficiency.ceiling.utilisation`)."""
    out = {}
    for name, path in curves.items():
        with open(path, newline="", encoding="utf-8") as fh:
            ends = [r for r in csv.DictReader(fh) if r.get("mfu") not in (None, "")]
        if ends:
            out[name] = {k: float(ends[-1][k]) for k in ("train_tflops", "ceiling_tflops", "mfu", "padded_share")
                         if ends[-1].get(k) not in (None, "")}
    return out


def render_html(tasks: list[str], rows: list[dict[str, Any]], images: list[str], notes: list[str] = (),
                lines: list[str] = (), utilisation: Mapping[str, Mapping[str, float]] | None = None) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in _header(tasks))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(tasks, r)) + "</tr>\n" for r in rows)
    util = ""
    if utilisation:
        uth = "".join(f"<th>{html.escape(h)}</th>" for h in UTILISATION_HEADER)
        ubody = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _utilisation_cells(n, u)) + "</tr>\n"
                        for n, u in utilisation.items())
        util = (f"<h2>Training against the machine's matmul ceiling</h2>\n<p>{html.escape(UTILISATION_INTRO)}</p>\n"
                f"<table><thead><tr>{uth}</tr></thead><tbody>\n{ubody}</tbody></table>\n")
    imgs = "".join(f'<figure><img src="{html.escape(i)}" alt="{html.escape(i)}" width="560"></figure>\n' for i in images)
    items = "".join(f"<li>{html.escape(line)}</li>\n" for line in lines)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>distillery report</title>\n"
            "<style>table{border-collapse:collapse;font-family:sans-serif}td,th{border:1px solid #999;"
            "padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}</style></head><body>\n"
            f"<h1>Students vs teacher</h1>\n<p>{html.escape(' '.join([_intro(tasks, rows), *notes]))}</p>\n"
            + (f"<ul>\n{items}</ul>\n" if items else "") +
            f"<table><thead><tr>{th}</tr></thead><tbody>\n{body}</tbody></table>\n{util}{imgs}</body></html>\n")


def read_loss_curve(path: str | os.PathLike) -> tuple[list[float], list[float]]:
    """(steps, losses) from a training-log CSV with columns `step` and `loss` (rows without loss skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"loss-curve CSV not found: {path}")
    steps, losses = [], []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "step" not in reader.fieldnames or "loss" not in reader.fieldnames:
            raise ReportError(f"{path}: needs 'step' and 'loss' columns, has {reader.fieldnames}")
        for lineno, row in enumerate(reader, start=2):
            if row["loss"] in ("", None):
                continue
            try:
                steps.append(float(row["step"]))
                losses.append(float(row["loss"]))
            except ValueError as exc:
                raise ReportError(f"{path}:{lineno}: non-numeric step/loss ({exc})") from exc
    return steps, losses


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return path


#: the marker of a student's row by its form (its name's suffix): int8 / bf16 export, direct baseline, the student
FORM_MARKERS = {"-int8": "s", "-bf16": "D", "-direct": "x", "": "o"}


def _family(name: str) -> tuple[str, str]:
    """(the student a row belongs to, its form's suffix): a student, its int8 and bf16 forms and its direct baseline
    are one family."""
    for suffix in FORM_MARKERS:
        if suffix and name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower x, higher y), by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def _scatter(rows: list[dict[str, Any]], key: str, xlabel: str, scale: float, path: Path) -> Path | None:
    """Score vs cost, one legend entry per model (no labels printed over each other), the Pareto front drawn."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    pts = [(float(r[key]) / scale, 100 * r["avg"] if abs(r["avg"]) <= 1 else r["avg"], r)
           for r in rows if r.get(key) is not None and r["avg"] is not None]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colours = plt.get_cmap("tab10").colors
    families: dict[str, int] = {}  # a student, its int8 and bf16 forms and its direct baseline share a colour
    for x, y, r in pts:
        student, form = _family(r["model"])
        family = families.setdefault(student, len(families))
        marker = "*" if r["is_teacher"] else FORM_MARKERS[form]
        ax.scatter([x], [y], marker=marker, s=160 if r["is_teacher"] else 55, color=colours[family % len(colours)],
                   label=r["model"] + (" (teacher)" if r["is_teacher"] else ""), zorder=3)
    front = pareto_front([(x, y) for x, y, _ in pts])
    if len(front) > 1:
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], color="0.4", linestyle="--", linewidth=1,
                drawstyle="steps-post", zorder=2, label="Pareto front (no model is cheaper and better)")
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 2, 5, 10 rather than 2x10^0
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("average dev score")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def search_plot(candidates: list[Mapping[str, Any]], teacher_ms: float, limit_ms: float, winner: str,
                path: Path) -> Path:
    """A budget search at a glance: every candidate's measured latency (a tick on the axis below; those over the
    budget grey), the trained ones at their last round's mean dev retention, the teacher at 100 %, the budget's limit,
    the front of the trained ones and the winner (circled among the timed ones when it was chosen untrained).
    ``candidates``: rows with name, form, ms, meets_budget, scores."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, (ax, rug) = plt.subplots(2, 1, figsize=(7.5, 5.0), sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    ax.scatter([teacher_ms], [100.0], marker="*", s=180, color="black", label=f"teacher (fp32, {teacher_ms:.2f} ms)",
               zorder=4)
    colours = {"fp32": "tab:blue", "bf16": "tab:orange", "int8": "tab:green"}
    scored = [c for c in candidates if c.get("scores")]
    for form, colour in colours.items():
        mine = [c for c in scored if c["form"] == form]
        if mine:
            ax.scatter([c["ms"] for c in mine], [100 * c["scores"][-1] for c in mine], color=colour, s=50, zorder=3,
                       label=f"trained candidates ({form})")
        timed = [c for c in candidates if c["form"] == form]
        if timed:
            rug.scatter([c["ms"] for c in timed], [list(colours).index(form)] * len(timed), marker="|", s=120,
                        color=[colour if c["meets_budget"] else "0.75" for c in timed])
    front = pareto_front([(c["ms"], c["scores"][-1]) for c in scored])
    if len(front) > 1:
        ax.plot([scored[i]["ms"] for i in front], [100 * scored[i]["scores"][-1] for i in front], color="0.4",
                linestyle="--", linewidth=1, drawstyle="steps-post", zorder=2, label="front of the trained ones")
    best = next((c for c in scored if c["name"] == winner), None)
    if best is not None:
        ax.scatter([best["ms"]], [100 * best["scores"][-1]], s=260, facecolors="none", edgecolors="red", linewidths=2,
                   zorder=5, label=f"chosen: {winner}")
    elif (chosen := next((c for c in candidates if c["name"] == winner), None)) is not None:
        # chosen without a training round (one finalist): circled where it was timed
        rug.scatter([chosen["ms"]], [list(colours).index(chosen["form"])], s=160, facecolors="none", edgecolors="red",
                    linewidths=2, zorder=5)
        ax.scatter([], [], s=160, facecolors="none", edgecolors="red", linewidths=2,
                   label=f"chosen, untrained: {winner}")
    for a in (ax, rug):
        a.axvline(limit_ms, color="red", linestyle=":", linewidth=1)
    ax.plot([], [], color="red", linestyle=":", linewidth=1, label=f"budget: <= {limit_ms:.2f} ms")
    rug.set_yticks(range(len(colours)), list(colours))
    rug.set_ylim(-0.7, len(colours) - 0.3)
    rug.set_ylabel("timed", fontsize=8)
    rug.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    rug.xaxis.set_major_formatter(plain)
    xs = [c["ms"] for c in candidates] + [teacher_ms, limit_ms]
    if max(xs) / min(xs) < 30:  # a decade or so: label the minor ticks too, they do not crowd
        rug.xaxis.set_minor_formatter(plain)
        rug.tick_params(axis="x", which="minor", labelsize=7)
    else:
        rug.xaxis.set_minor_formatter(NullFormatter())
    rug.set_xlabel("latency per batch (ms, log; measured on this machine)")
    ax.set_ylabel("mean dev retention (%),\nin its last round")
    ax.grid(True, alpha=0.3)
    rug.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def _curve_panels(curves: Mapping[str, tuple[list[float], list[float]]], path: Path) -> Path:
    """One panel per stage (a curve's name is `<stage>-<item>`), each with its own legend of items."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    groups: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for name, curve in curves.items():
        stage, _, item = name.partition("-")
        groups.setdefault(stage, {})[item or stage] = curve
    cols = min(2, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.2 * rows), squeeze=False)
    for ax, (stage, items) in zip(axes.flat, groups.items()):
        for item, (steps, losses) in items.items():
            ax.plot(steps, losses, label=item, linewidth=1.2)
        values = [v for line in ax.get_lines() for v in line.get_ydata()]
        if all(v > 0 for v in values):
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            # minor ticks labelled only within one decade (across several their labels ran into each other)
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}") if max(values) < 10 * min(values)
                                         else NullFormatter())
        ax.set_title(stage.replace("_", " "), fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("training loss", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if len(items) > 1 or next(iter(items)) != stage:
            ax.legend(fontsize=7, frameon=False)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    fig.tight_layout()
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def write_report(summary: Mapping[str, Mapping[str, Mapping[str, Any]]], out_dir: str | os.PathLike, *,
                 latency: Mapping[str, Any] | None = None, loss_curves: Mapping[str, str | os.PathLike] | None = None,
                 teacher: str | None = None, notes: list[str] = (), lines: list[str] = ()) -> list[Path]:
    """Write table.md, table.html and the PNG plots under `out_dir`; return the written paths.

    summary: {task: {model: {"params": int, "<metric>": value, ..., "retention": x (students),
    optional "flops", "latency_ms"}}}. latency: {model: ms | {"median_ms": ms} | LatencyResult}
    (overrides latency_ms). loss_curves: {name: CSV with step,loss columns}. Plots without data are
    skipped (score vs latency needs latencies). notes: sentences appended to the table's introduction; lines: one
    list item each between the introduction and the table (e.g. a task whose teacher failed the gate).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)

    out = Path(out_dir)
    tasks, rows = build_rows(summary, latency=latency, teacher=teacher)
    curves = {name: read_loss_curve(path) for name, path in (loss_curves or {}).items()}  # validate first
    written: list[Path] = []
    images: list[str] = []
    for key, label, scale, fname in (("latency_ms", "latency per batch (ms, log)", 1.0, "score_vs_latency.png"),
                                     ("params", "parameters (millions, log)", 1e6, "score_vs_size.png")):
        p = _scatter(rows, key, label, scale, out / fname)
        if p is not None:
            written.append(p)
            images.append(fname)
    if curves:
        written.append(_curve_panels(curves, out / "loss_curves.png"))
        images.append("loss_curves.png")
    util = stage_utilisation(loss_curves or {})
    written.insert(0, write_text(out / "table.md", render_markdown(tasks, rows, notes, lines, util)))
    written.insert(1, write_text(out / "table.html", render_html(tasks, rows, images, notes, lines, util)))
    return written
