"""A training stage alone and beside one CPU-bound process, side by side in one run.

The stage: the demo's TinyBERT intermediate-layer distillation (teacher 4/128/4/512, student 2/64/4/256, vocab
500, batch 32, length 64) through the `Distiller` module the Trainer optimises: forward, backward, AdamW step. It
runs in a fresh process so that the OpenMP settings apply from the first `import torch`, under two settings:

- ``fixed``: torch's own thread count (one per core) for the whole run, the OpenMP runtime's defaults;
- ``governed``: what every training loop of the project does (`distillery.runtime.FreeCores`): the thread count
  follows the cores the other processes leave free, looked at once a second.

Each runs quiet and beside one CPU-bound process of each kind: ``spin`` (a pure Python loop, e.g. a data job or a
compiler) and ``stage`` (a second training process with the same setting: two stages on one worker). Runs are
interleaved, medians taken. Last line:
`busy_ratio: <governed busy/quiet, worst kind> fixed_busy_ratio: <...> quiet_cost: <governed quiet / fixed quiet>`.

Run: python -m benchmarks.busy [--steps 40] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

SETTINGS = ("fixed", "governed")
KINDS = ("quiet", "spin", "stage")

SPIN = "while True: pass"


def child_env(setting: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env["DISTILLERY_BENCH_SETTING"] = setting
    return env


def stage(steps: int) -> float:
    """Seconds for `steps` intermediate-layer distillation steps (after 3 warm-up steps); forever when steps == 0."""
    import torch

    from distillery.runtime import ThreadGovernor

    from benchmarks.distill import INTERMEDIATE, batch, student_model, teacher_model
    from distillery.layer_map import build_layer_map
    from distillery.training.distill import Distiller, make_projection
    from distillery.training.spec import DistillSpec

    torch.manual_seed(0)
    teacher, student = teacher_model((4, 128, 4, 512), 500), student_model((2, 64, 4, 256), 500)
    lm = build_layer_map("uniform", 2, 4)
    distiller = Distiller(student, teacher, DistillSpec(INTERMEDIATE, "intermediate", lm),
                          make_projection(student, teacher, lm)).train()
    opt = torch.optim.AdamW([p for p in distiller.parameters() if p.requires_grad], lr=1e-4)
    b = batch(32, 64, vocab=500)

    governor = ThreadGovernor() if os.environ.get("DISTILLERY_BENCH_SETTING") == "governed" else None

    def step() -> None:
        distiller(**b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if governor is not None:
            governor.tick()  # what the Trainer callback `FreeCores` does at each step's end

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    i = 0
    while steps == 0 or i < steps:
        step()
        i += 1
    return time.perf_counter() - t0


def measure(setting: str, kind: str, steps: int) -> float:
    hog = None
    if kind == "spin":
        hog = subprocess.Popen([sys.executable, "-c", SPIN])
    elif kind == "stage":
        hog = subprocess.Popen([sys.executable, "-m", "benchmarks.busy", "--child", "0"], env=child_env(setting))
    try:
        if hog is not None:
            time.sleep(2.0)  # the other process is up and computing
        out = subprocess.run([sys.executable, "-m", "benchmarks.busy", "--child", str(steps)], env=child_env(setting),
                             check=True, capture_output=True, text=True).stdout
        return float(out.strip().splitlines()[-1])
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="timed steps per run")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions of every (setting, kind)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(f"{stage(args.child):.6f}", flush=True)
        return
    print(f"{os.cpu_count()} CPUs; {args.steps} steps per run, median of {args.reps}", flush=True)
    times: dict[tuple[str, str], list[float]] = {(s, k): [] for s in SETTINGS for k in KINDS}
    for rep in range(args.reps):
        order = [(s, k) for k in KINDS for s in (SETTINGS if rep % 2 == 0 else SETTINGS[::-1])]
        for s, k in order:
            times[s, k].append(measure(s, k, args.steps))
    med = {key: statistics.median(v) for key, v in times.items()}
    for s in SETTINGS:
        cells = "  ".join(f"{k} {med[s, k] / args.steps * 1000:7.1f} ms/step ({med[s, k] / med[s, 'quiet']:.2f}x)"
                          for k in KINDS)
        print(f"{s:8s} {cells}")
    worst = {s: max(med[s, k] / med[s, "quiet"] for k in KINDS[1:]) for s in SETTINGS}
    print(f"busy_ratio: {worst['governed']:.2f} fixed_busy_ratio: {worst['fixed']:.2f} "
          f"quiet_cost: {med['governed', 'quiet'] / med['fixed', 'quiet']:.3f}")


if __name__ == "__main__":
    main()
