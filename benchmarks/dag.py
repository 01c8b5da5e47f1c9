"""The flow's DAG against the same flow one stage at a time, side by side.

Run as ``python -m benchmarks.dag [--params params.yaml] [--rounds 1]`` (params that name no relative paths, like
the demo's). Each round builds two fresh projects
(copies of distillery/, tasks/, flows/ and the params file) in a temporary directory and runs the whole pipeline in
each, alternating: "sequential" with `orchestration.max_workers: 1` (one stage at a time, in submission order) and
"dag" with the params' own orchestration (independent stages at once). Both start from nothing, so every stage runs.
Machine load drifts between minutes on a shared machine: alternate rounds and compare within a round. Prints each
run's wall time and the sum of its stage times, and whether the two runs wrote the same weights (every
`*.safetensors` under models/, byte for byte: with one device slot they must); the last line is
``dag_over_sequential: <median wall ratio>``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def project(base: Path, params: dict) -> Path:
    base.mkdir(parents=True)
    for name in ("distillery", "tasks", "flows"):
        shutil.copytree(ROOT / name, base / name, ignore=shutil.ignore_patterns("__pycache__"))
    (base / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    return base


def run_pipeline(path: Path) -> tuple[float, float]:
    """Wall seconds of `python -m flows.pipeline` in `path`, and the sum of its stages' `done in` seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["PYTHONPATH"] = str(path)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.pipeline"], cwd=path, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (path / "console.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode != 0:
        raise SystemExit(f"pipeline failed in {path}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    stages = sum(float(s) for s in re.findall(r": done in (\d+) s", proc.stdout))
    return wall, stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep", help="build the projects (and their console.log) under this directory and keep them")
    args = parser.parse_args(argv)
    params = yaml.safe_load(Path(args.params).read_text(encoding="utf-8"))
    sequential = {**params, "orchestration": {**(params.get("orchestration") or {}), "max_workers": 1}}
    ratios, same = [], True
    keep = contextlib.nullcontext(args.keep) if args.keep else None
    with keep or tempfile.TemporaryDirectory(prefix="distillery-dag-") as tmp:
        for r in range(args.rounds):
            walls = {}
            for name, p in (("sequential", sequential), ("dag", params)):
                wall, stages = run_pipeline(project(Path(tmp) / f"{name}-{r}", p))
                walls[name] = wall
                print(f"round {r + 1} {name:>10}: {wall:7.1f} s wall, stages {stages:7.1f} s", flush=True)
            ratios.append(walls["dag"] / walls["sequential"])
            a, b = (weights(Path(tmp) / f"{name}-{r}") for name in ("sequential", "dag"))
            print(f"round {r + 1} identical weights: {sum(a[k] == b.get(k) for k in a)}/{len(a)} files", flush=True)
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    print(f"round {r + 1} differs: {k}", flush=True)
            same = same and a == b
    print(f"dag_over_sequential: {statistics.median(ratios):.3f} identical: {same}")
    return 0 if same else 1


def weights(path: Path) -> dict[str, str]:
    import hashlib

    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted((path / "models").rglob("*.safetensors"))}


if __name__ == "__main__":
    sys.exit(main())
