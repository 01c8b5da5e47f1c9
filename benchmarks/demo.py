"""The demo's claim, checked: the README's demo line against fresh runs of the demo, run to run.

Run before every stop that touches training (it takes one demo run per `--runs`, about 12 minutes each on 2 cores):

    python -m benchmarks.demo [--runs 2] [--workdir DIR] [--params params.yaml] [--write]

Each run is `python -m flows.pipeline --params P` in a fresh clone of this checkout's HEAD (committed code only), one
after the other, nothing else running. Then, and only then, the checks:

* every student beats its direct baseline (`gain_over_direct` > 0 in `metrics/summary.json`);
* the run's last line (the verdict of `distillery.report.verdicts`) says what the README's demo line says: the same
  student, scores and counts to the digit; each speedup within 10% of the README's, or unresolved in both;
* with two runs or more: every model file of every stage holds the same tensors (`torch.equal`), every score is equal,
  and every reported speedup of one run is within 10% of the other's (or unresolved in both);
* two students of the same shape (parameter count and architecture) are timed within 10% of each other.

`--write` appends the first run to the results log (`docs/results.md`, `distillery.results`) and puts its line and
table into README.md (between the `demo-line` and `results-table` markers) before checking: a figure in the README
comes from a run.
The last line is `demo check: ok` or `demo check: N problem(s)`; the exit code is 0 or 1.

The timings alone, without training again:

    python -m benchmarks.demo --retime RUN_DIR [--times 3]

runs the evaluate stage of a finished run (a project whose pipeline ran, e.g. a `--workdir`'s ``run-1``) `--times`
times over the same saved models (``python -m flows.stage evaluate``, tracking off; it rewrites that run's evaluate
outputs) and compares every speedup of each timing with the first's as above; it counts the speedups that agree,
those within 10% that one timing leaves unresolved, and those further apart. Last line: `timing check: ok` or
`timing check: N problem(s)`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKERS = ("<!-- demo-line -->", "<!-- /demo-line -->")
TABLE_MARKERS = ("<!-- results-table -->", "<!-- /results-table -->")
#: how far apart two timings of one figure may be and still agree
TOLERANCE = 0.10
_SPEED = re.compile(r"(\d+(?:\.\d+)?)x(?: \[(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)\])?|unresolved \[[^\]]*\]")


def readme_line(text: str) -> str:
    """The demo line between the README's markers ("" when it has none)."""
    start, end = (text.find(m) for m in MARKERS)
    if start < 0 or end < start:
        return ""
    return text[start + len(MARKERS[0]):end].strip().strip("`").strip()


def with_readme_line(text: str, line: str) -> str:
    start, end = (text.find(m) for m in MARKERS)
    if start < 0 or end < start:
        raise SystemExit(f"error: {README}: no {MARKERS[0]} ... {MARKERS[1]} markers around the demo line")
    return text[:start + len(MARKERS[0])] + f"`{line}`" + text[end:]


def with_readme_table(text: str, table: str) -> str:
    """The README with `table` (`distillery.results.readme_table`) between its table markers."""
    start, end = (text.find(m) for m in TABLE_MARKERS)
    if start < 0 or end < start:
        raise SystemExit(f"error: {README}: no {TABLE_MARKERS[0]} ... {TABLE_MARKERS[1]} markers around the table")
    return text[:start + len(TABLE_MARKERS[0])] + "\n" + table + text[end:]


def split_line(line: str) -> tuple[str, list[float | None]]:
    """(the line with every speedup replaced by "#", the speedups in order: None where unresolved)."""
    speeds: list[float | None] = []

    def take(m: re.Match) -> str:
        speeds.append(float(m.group(1)) if m.group(1) else None)
        return "#"

    return _SPEED.sub(take, line), speeds


def close(a: float | None, b: float | None) -> bool:
    """Two speedups agree: within `TOLERANCE` of each other, or both unresolved."""
    if a is None or b is None:
        return a is b
    return abs(a - b) <= TOLERANCE * max(a, b)


def compare_lines(expected: str, got: str, what: str) -> list[str]:
    shape_e, speeds_e = split_line(expected)
    shape_g, speeds_g = split_line(got)
    if shape_e != shape_g or len(speeds_e) != len(speeds_g):
        return [f"{what}: the line differs beyond its speedups:\n  expected: {expected}\n  got:      {got}"]
    return [f"{what}: speedup {i + 1} is {g} against {e} (more than {TOLERANCE:.0%} apart)"
            for i, (e, g) in enumerate(zip(speeds_e, speeds_g)) if not close(e, g)]


def run_demo(workdir: Path, index: int, params: str) -> dict:
    """One fresh clone of HEAD, the demo run in it; returns its last line, summary, wall time and directory."""
    clone = workdir / f"run-{index}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.pipeline", "--params", params], cwd=clone,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    (clone / "console.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    verdict = next((ln for ln in reversed(lines) if re.match(r"^\S+: best student ", ln)), "")
    summary = clone / "metrics" / "summary.json"
    if proc.returncode != 0 or not summary.is_file():
        raise SystemExit(f"error: demo run {index} failed (exit {proc.returncode}); see {clone / 'console.log'}")
    print(f"run {index}: {seconds:.0f} s: {verdict}", flush=True)
    return {"dir": clone, "line": verdict, "summary": json.loads(summary.read_text()), "seconds": seconds}


def model_files(run_dir: Path) -> dict[str, Path]:
    return {str(f.relative_to(run_dir)): f for f in sorted((run_dir / "models").rglob("*.safetensors"))}


def different_tensors(a: Path, b: Path) -> list[str]:
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    if ta.keys() != tb.keys():
        return ["(different tensor names)"]
    return [k for k in ta if ta[k].dtype != tb[k].dtype or not torch.equal(ta[k], tb[k])]


def speed_keys(row: dict) -> dict[str, tuple]:
    """Each speedup of a summary row with its spread: key -> (median, p10, p90, low, high) (`speed_of`)."""
    from distillery.efficiency.spread import speed_of

    return {k: speed_of(row, k.removeprefix("speedup"))
            for k in row if k.startswith("speedup_b") and isinstance(row[k], (int, float))}


def figure(rounds: tuple) -> float | None:
    """A summary's speedup, None when its rounds leave it unresolved."""
    from distillery.efficiency.spread import resolved

    return rounds[0] if None in rounds[1:3] or resolved(*rounds) else None


def check_runs(runs: list[dict]) -> list[str]:
    problems = []
    first = runs[0]
    for task, models in first["summary"].items():
        for name, row in models.items():
            if isinstance(row.get("gain_over_direct"), (int, float)) and row["gain_over_direct"] <= 0:
                problems.append(f"run 1: {task}: {name} does not beat its direct baseline "
                                f"({row['gain_over_direct']:+.4f})")
        same_shape: dict[tuple, list[str]] = {}
        for name, row in models.items():
            if "baseline_of" not in row and "retention" in row and "main_change_vs_fp32" not in row \
                    and isinstance(row.get("speedup_b1"), (int, float)):  # a student's own row
                same_shape.setdefault((row.get("params"), row.get("flops")), []).append(name)
        for names in same_shape.values():
            for other in names[1:]:
                a, b = (figure(speed_keys(models[n])["speedup_b1"]) for n in (names[0], other))
                if not close(a, b):
                    problems.append(f"run 1: {task}: {names[0]} and {other} have the same shape but were timed "
                                    f"{a}x and {b}x at batch 1")
    for i, other in enumerate(runs[1:], start=2):
        files_a, files_b = model_files(first["dir"]), model_files(other["dir"])
        if files_a.keys() != files_b.keys():
            problems.append(f"run {i}: other model files than run 1's: {sorted(files_a.keys() ^ files_b.keys())[:5]}")
        for rel in sorted(files_a.keys() & files_b.keys()):
            if bad := different_tensors(files_a[rel], files_b[rel]):
                problems.append(f"run {i}: {rel}: tensors differ from run 1's ({', '.join(bad[:3])})")
        for task, models in first["summary"].items():
            for name, row in models.items():
                theirs = other["summary"].get(task, {}).get(name, {})
                for key, value in row.items():
                    if isinstance(value, float) and not key.startswith(("speedup", "latency", "throughput")) \
                            and key in ("main", "accuracy", "f1", "mcc", "exact_match", "pearson", "spearmanr",
                                        "gain_over_direct", "retention") and theirs.get(key) != value:
                        problems.append(f"run {i}: {task}: {name}.{key} {theirs.get(key)} against {value}")
        problems += speed_problems(first["summary"], other["summary"], f"run {i}")
        problems += compare_lines(first["line"], other["line"], f"run {i}'s last line against run 1's")
    return problems


def speed_pairs(ours: dict, theirs: dict):
    """(task, model, key, our rounds, their rounds) for each speedup both results hold ({task: {model: row}})."""
    for task, models in ours.items():
        for name, row in models.items():
            their_speeds = speed_keys(theirs.get(task, {}).get(name, {}))
            for key, rounds in speed_keys(row).items():
                if key in their_speeds:
                    yield task, name, key, rounds, their_speeds[key]


def speed_problems(ours: dict, theirs: dict, label: str) -> list[str]:
    """A line for each speedup of `theirs` more than `TOLERANCE` from ours, or resolved in one of the two only."""
    return [f"{label}: {task}: {name}.{key} {b[0]} against {a[0]} (more than {TOLERANCE:.0%} apart, or resolved in "
            "one run only)" for task, name, key, a, b in speed_pairs(ours, theirs) if not close(figure(a), figure(b))]


def retime(run_dir: Path, times: int) -> list[dict]:
    """The evaluate stage of the finished run in `run_dir`, `times` times over its saved models: each time's rows
    ({task: {model: row}}, `metrics/eval/<task>.json`)."""
    tasks = sorted(f.stem for f in (run_dir / "metrics" / "eval").glob("*.json"))
    if not tasks:
        raise SystemExit(f"error: {run_dir}: no metrics/eval/*.json (a project whose pipeline ran)")
    env = {**os.environ, "DISTILLERY_TRACKING": "off"}
    timings = []
    for i in range(times):
        rows = {}
        for task in tasks:
            (run_dir / ".prefect" / "stamps" / f"evaluate@{task}").unlink(missing_ok=True)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "flows.stage", "evaluate", "--item", task], cwd=run_dir,
                                  env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"error: timing {i + 1}: evaluate[{task}] failed (exit {proc.returncode}):\n"
                                 f"{(proc.stdout + proc.stderr)[-3000:]}")
            rows[task] = json.loads((run_dir / "metrics" / "eval" / f"{task}.json").read_text(encoding="utf-8"))
            print(f"timing {i + 1}: evaluate[{task}] {time.perf_counter() - t0:.0f} s", flush=True)
        timings.append(rows)
    return timings


def timing_counts(timings: list[dict]) -> str:
    """How each later timing's speedups compare with the first's: agreeing, within `TOLERANCE` but unresolved in one
    only, further apart; and the largest ratio of two medians, unresolved ones included."""
    agree = flip = apart = 0
    largest = 1.0
    for other in timings[1:]:
        for *_, a, b in speed_pairs(timings[0], other):
            largest = max(largest, a[0] / b[0], b[0] / a[0])
            if close(figure(a), figure(b)):
                agree += 1
            elif close(a[0], b[0]):
                flip += 1
            else:
                apart += 1
    return (f"{agree + flip + apart} speedups against the first timing's: {agree} agree, {flip} within "
            f"{TOLERANCE:.0%} but unresolved in one timing only, {apart} further apart; the largest ratio of two "
            f"medians {largest:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--workdir", default=None, help="where the clones go (default: a new temporary directory)")
    ap.add_argument("--write", action="store_true", help="put run 1's line into README.md and the results log")
    ap.add_argument("--retime", default=None, metavar="RUN_DIR",
                    help="instead of demo runs: time a finished run's saved models again (its evaluate stage)")
    ap.add_argument("--times", type=int, default=3, help="with --retime: how many timings")
    args = ap.parse_args(argv)
    if args.retime:
        timings = retime(Path(args.retime).resolve(), args.times)
        problems = [p for i, t in enumerate(timings[1:], start=2) for p in speed_problems(timings[0], t, f"timing {i}")]
        for p in problems:
            print(p)
        print(timing_counts(timings))
        print("timing check: ok" if not problems else f"timing check: {len(problems)} problem(s)")
        return 0 if not problems else 1
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="distillery-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runs = [run_demo(workdir, i + 1, args.params) for i in range(args.runs)]
    if args.write:
        from distillery.results import append_run, read_log, readme_table

        md = ROOT / "docs" / "results.md"
        append_run(md, runs[0]["dir"], command=f"python -m flows.pipeline --params {args.params}",
                   seconds=runs[0]["seconds"])
        text = with_readme_line(README.read_text(encoding="utf-8"), runs[0]["line"])
        README.write_text(with_readme_table(text, readme_table(read_log(md.with_suffix(".jsonl")))), encoding="utf-8")
    problems = check_runs(runs)
    claim = readme_line(README.read_text(encoding="utf-8"))
    problems += compare_lines(claim, runs[0]["line"], "run 1's last line against the README's") if claim else [
        f"{README}: no demo line between {MARKERS[0]} and {MARKERS[1]}"]
    for p in problems:
        print(p)
    print("demo check: ok" if not problems else f"demo check: {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
