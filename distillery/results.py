"""The results log: every measured run one row, written from the run's own `metrics/summary.json`, never by hand.

`docs/results.jsonl` holds the rows (one JSON object per run: date, commit, machine, command, wall time, and per task
every model's main dev score and speedups at batch 1 with their spread); `docs/results.md` is rendered from it by
:func:`render` (the tests check the two agree). A row is added with :func:`append_run` (``python -m benchmarks.demo
--write`` does it for the demo).

The runs measured before the log existed were written up by hand in the docs' pages, their summaries not kept; their
figures are rows too, marked ``"transcribed"`` with the page they came from (and a ``"note"``: what the run was), so the
pages explain and the log holds every figure.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
from pathlib import Path
from typing import Any, Mapping

from distillery.efficiency.spread import KEYS, describe_speedup, speed_of
from distillery.io import write_text

HEADER = ("# Results log\n\nEvery measured run, one row each, written from the run's `metrics/summary.json` by "
          "`distillery.results.append_run` (`python -m benchmarks.demo --write` for the demo); the runs measured "
          "before this log existed are transcribed from the pages that wrote them up, and say so. Generated from "
          "`results.jsonl`: do not edit by hand.\n")


def machine() -> str:
    """The CPU's model name as `lscpu` gives it, its core count and its fast-bf16 instruction sets: one model name
    covers CPUs with and without them (AMD EPYC), and `precision: auto` trains in bf16 on the first, fp32 on the other,
    so their runs differ in scores as well as speed."""
    import os

    from distillery.precision import cpu_bf16_flags

    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {'+'.join(cpu_bf16_flags()) or 'no fast bf16'}"


def _commit(run_dir: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=run_dir, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def row_from_summary(summary: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """task -> model -> {main, speedup_b1 [p10, p90], speedup_b1_int8 ...}: the figures a reader compares."""
    tasks: dict[str, Any] = {}
    for task, models in summary.items():
        if task == "average":
            continue
        tasks[task] = {}
        for name, r in models.items():
            entry = {k: r[k] for k in ("main", "accuracy", "f1", "mcc", "pearson", "retention", "gain_over_direct")
                     if isinstance(r.get(k), (int, float))}
            for k in (f"{key}_b1" for key in KEYS):
                if isinstance(r.get(k), (int, float)):
                    entry[k] = r[k]
            tasks[task][name] = entry
    return tasks


def append_run(md: str | Path, run_dir: str | Path, *, command: str, seconds: float,
               commit: str | None = None) -> dict[str, Any]:
    """Add the run in `run_dir` (its metrics/summary.json) to the log beside `md` (results.jsonl) and render `md`;
    the commit it ran at is `commit`, else the run directory's HEAD."""
    run_dir, md = Path(run_dir), Path(md)
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text(encoding="utf-8"))
    row = {"date": _dt.date.today().isoformat(), "commit": commit or _commit(run_dir), "machine": machine(),
           "command": command, "wall_s": round(seconds, 1), "tasks": row_from_summary(summary)}
    searches = {}  # a budgeted student's search: the form it chose and the speedup it timed, beside evaluate's
    for found in sorted((run_dir / "models" / "search").glob("*/search.json")):
        winner = json.loads(found.read_text(encoding="utf-8"))["winner"]
        searches[found.parent.name] = {k: winner[k] for k in ("name", "form", "speedup", "speedup_p10") if k in winner}
    if searches:
        row["search"] = searches
    return _append(md, row)


def append_output(md: str | Path, output: str | Path, *, command: str, seconds: float, machine_name: str | None = None,
                  commit: str | None = None) -> dict[str, Any]:
    """Add a benchmark's run to the log beside `md`: `output`, the file its console output went to (every line kept,
    its last line the figures it is read by), with the command and wall time; the commit is the project's and the
    machine this one unless given (a run on another machine, e.g. a lent GPU)."""
    md, output = Path(md), Path(output)
    lines = [ln.rstrip() for ln in output.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{output}: empty (the benchmark's console output goes there)")
    row = {"date": _dt.date.today().isoformat(), "commit": commit or _commit(Path(__file__).resolve().parent),
           "machine": machine_name or machine(), "command": command, "wall_s": round(seconds, 1), "output": lines,
           "tasks": {}}
    return _append(md, row)


def _append(md: Path, row: dict[str, Any]) -> dict[str, Any]:
    """`row` added to the log beside `md` (results.jsonl), and `md` rendered from all its rows."""
    log = md.with_suffix(".jsonl")
    rows = read_log(log) + [row]
    write_text(log, "".join(json.dumps(r) + "\n" for r in rows))
    write_text(md, render(rows))
    return row


def read_log(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _score(entry: Mapping[str, Any]) -> str:
    for k in ("accuracy", "f1", "mcc", "pearson", "main"):
        if isinstance(entry.get(k), (int, float)):
            return f"{100 * entry[k]:.2f}"
    return "-"


def newest_first(rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows by date, newest first; of one date, the last appended first."""
    return sorted(reversed(rows), key=lambda r: r["date"], reverse=True)


def render(rows: list[Mapping[str, Any]]) -> str:
    """The log as Markdown: per run a heading line and one table row per model."""
    out = [HEADER]
    for r in newest_first(rows):
        out.append(f"\n## {r['date']} · {r['commit']} · {r['machine']}\n\n`{r['command']}`"
                   + (f": {r['wall_s']:.0f} s" if r.get("wall_s") is not None else "") + "\n")
        if r.get("note"):
            out.append(f"\n{r['note']}\n")
        if r.get("output"):
            out.append("\n```text\n" + "\n".join(r["output"]) + "\n```\n")
        if r.get("transcribed"):
            out.append(f"\nTranscribed from {r['transcribed']} (written up by hand before this log; "
                       "no summary kept).\n")
        for student, found in (r.get("search") or {}).items():
            out.append(f"\nSearch of {student}: chose {found['name']} at {found['speedup']:.2f}x the fp32 teacher "
                       f"(p10 {found['speedup_p10']:.2f}x) at batch 1; the tables below are the evaluate stage's.\n")
        for task, models in r["tasks"].items():
            out.append(f"\n| {task} | dev score | retention | gain over direct | speedup b1 [p10-p90] |\n"
                       "|---|---:|---:|---:|---:|\n")
            for name, e in models.items():
                kept = f"{e['retention']:.3f}" if "retention" in e else "-"
                gain = f"{100 * e['gain_over_direct']:+.2f}" if "gain_over_direct" in e else "-"
                speed = describe_speedup(*speed_of(e, "_b1"))
                out.append(f"| {name} | {_score(e)} | {kept} | {gain} | {speed} |\n")
    return "".join(out)


def readme_table(rows: list[Mapping[str, Any]], task: str = "demo") -> str:
    """The README's table: the newest measured (not transcribed) run of `task`, one line per student with its direct
    baseline, its served forms' speedups beside its own."""
    measured = [r for r in rows if not r.get("transcribed") and task in r.get("tasks", {})]
    if not measured:
        return ""
    run = newest_first(measured)[0]
    models = run["tasks"][task]

    def speed(name: str) -> str:
        e = models.get(name, {})
        return describe_speedup(*speed_of(e, "_b1"))

    out = [f"| {task} ({run['date']}, {run['commit']}, {run['machine']}) | dev score | retention | direct | "
           "speedup b1 [p10-p90] | bf16 | int8 |\n|---|---:|---:|---:|---:|---:|---:|\n"]
    teacher = models.get("teacher")
    if teacher:
        out.append(f"| teacher | {_score(teacher)} | - | - | 1.0x | - | - |\n")
    for name, e in models.items():
        if f"{name}-direct" not in models:
            continue
        out.append(f"| {name} | {_score(e)} | {e['retention']:.3f} | {_score(models[f'{name}-direct'])} | "
                   f"{speed(name)} | {speed(f'{name}-bf16')} | {speed(f'{name}-int8')} |\n"
                   if "retention" in e else f"| {name} | {_score(e)} | - | - | {speed(name)} | - | - |\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m distillery.results RUN_DIR --command CMD --seconds S``: add the run in RUN_DIR (a project that ran;
    its metrics/summary.json) to docs/results.jsonl and render docs/results.md. ``--output FILE`` instead of RUN_DIR:
    a benchmark's run, FILE its console output."""
    from distillery.errors import ArgumentParser, InputNotFoundError, run_main

    parser = ArgumentParser(prog="python -m distillery.results", description=main.__doc__)
    parser.add_argument("run_dir", nargs="?", help="the project directory of the run (its metrics/summary.json)")
    parser.add_argument("--output", help="instead of a run directory: the console output of a benchmark's run")
    parser.add_argument("--command", required=True, help="the command that made the run, as a reader would type it")
    parser.add_argument("--seconds", type=float, required=True, help="its wall time")
    parser.add_argument("--machine", help="with --output: the machine it ran on, when not this one (lscpu's model name"
                        " and cores; a GPU's name)")
    parser.add_argument("--commit", help="the commit it ran at, when not this checkout's HEAD (with --output) or the "
                        "run directory's (a checkout moved on after the run)")
    parser.add_argument("--log", default=str(Path(__file__).resolve().parents[1] / "docs" / "results.md"),
                        help="the results page (its .jsonl beside it holds the rows)")
    args = parser.parse_args(argv)

    def add() -> int:
        if (args.run_dir is None) == (args.output is None):
            parser.error("give a run directory or --output FILE (one of the two)")
        if args.output is not None:
            if not Path(args.output).is_file():
                raise InputNotFoundError(f"{args.output}: no such file (the benchmark's console output)")
            row = append_output(args.log, args.output, command=args.command, seconds=args.seconds,
                                machine_name=args.machine, commit=args.commit)
            print(f"{args.log}: added the run of {row['date']} ({row['commit']}, {row['machine']})")
            return 0
        if not (Path(args.run_dir) / "metrics" / "summary.json").is_file():
            raise InputNotFoundError(f"{args.run_dir}: no metrics/summary.json (the report stage writes it)")
        row = append_run(args.log, args.run_dir, command=args.command, seconds=args.seconds, commit=args.commit)
        print(f"{args.log}: added the run of {row['date']} ({row['commit']}, {row['machine']})")
        return 0

    return run_main(add)


if __name__ == "__main__":
    raise SystemExit(main())
