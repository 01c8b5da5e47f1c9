"""Where the pipeline's training loop spends a step, and what the loader and the per-step checks cost (issue 36).

On one H200 (2026-11-27) every training loop of the `gpu` preset ran at 10-15 steps a second whatever its model.
This runs the pipeline's own loop (`benchmarks.gpu.loop_step`: `distill` through the Trainer, its data loader over
`datasets` rows, the padding collator) at the `gpu` preset's general-distillation shapes (batch 256 x 128, bf16)
under a few training options side by side, the bare step beside it (synchronised every step), then one profiled
run: the host's hottest Python functions (cProfile) and a Chrome trace of the device's work (`--out`).
Its first run named the cause: with the Trainer's defaults a step took 78.2 ms against the bare step's 46.8 ms, the
padding collator alone ~27 ms of host time a batch (`tokenization_utils_base.flatten`) and the loss's NaN check a
wait for the device every step; with loader workers and no check 40.7 ms (`distillery.training.args.loader_options`,
now the pipeline's default on a GPU; docs/benchmarks.md).

Run: python -m benchmarks.gpu_loop [--out DIR]          (CUDA; `--device cpu --micro` runs the same code, toy sizes)
Last line: `bare_ms: <b> before_ms: <the Trainer's defaults> pipeline_ms: <p> speedup: <before / p> loop_ratio: <p / b>`.
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import os
import platform
import pstats
import shutil
from pathlib import Path

import torch
import transformers

from benchmarks import gpu
from benchmarks.distill import step_benchmark

#: The Trainer's own loader and loss check (the pipeline's loop before `distillery.training.args.loader_options`).
TRAINER_DEFAULTS = {"dataloader_num_workers": 0, "dataloader_persistent_workers": False,
                    "dataloader_prefetch_factor": None, "logging_nan_inf_filter": True}
#: Training options over the pipeline's, each measured against the pipeline's own loop.
VARIANTS: dict[str, dict] = {
    "trainer_defaults": TRAINER_DEFAULTS,
    "pipeline": {},
    "no_workers": {k: v for k, v in TRAINER_DEFAULTS.items() if k != "logging_nan_inf_filter"},
    "nan_check": {"logging_nan_inf_filter": True},
    "no_pin_memory": {"dataloader_pin_memory": False},
}


def host_profile(steps: int, batch: int, seq: int, shapes: dict, top: int = 30) -> str:
    """cProfile of the pipeline's loop: the `top` functions by their own time (where the host waits or works; loader
    workers are other processes, out of its view)."""
    prof = cProfile.Profile()
    prof.enable()
    gpu.loop_step(steps, batch, seq, **shapes)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--micro", action="store_true", help="toy sizes (CPU test of the same code)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--out", type=Path, default=None, help="write host_profile.txt and trace.json.gz here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu_loop needs a CUDA device (torch.cuda.is_available() is False): nothing measured. "
              "`--device cpu --micro` runs the same code at toy sizes.")
        return None
    transformers.logging.set_verbosity_error()
    shapes = gpu.MICRO if args.micro else gpu.PRESET
    batch, seq, steps = (4, 16, 6) if args.micro else (args.batch, args.seq, args.steps)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {os.cpu_count()} cores, kernel {platform.release()}, "
          f"batch {batch} x {seq}, {steps} steps", flush=True)
    _, bare = step_benchmark(2 if args.micro else 10, batch, seq, device=args.device, bf16=bf16, **shapes)
    times = {}
    for name, options in VARIANTS.items():
        times[name] = gpu.loop_step(steps, batch, seq, options=options, **shapes)
        print(f"{name:>16}: {1000 * times[name]:7.1f} ms a step ({batch / times[name]:6.0f} sequences/s) {options}",
              flush=True)
    report = host_profile(steps, batch, seq, shapes)
    print(report[:6000], flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_profile.txt").write_text(report)
        trace = args.out / "trace.json"
        gpu.loop_step(min(steps, 12), batch, seq, profile=True, trace=str(trace), **shapes)
        with trace.open("rb") as src, gzip.open(trace.with_suffix(".json.gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
    before, now = times["trainer_defaults"], times["pipeline"]
    line = {"bare_ms": 1000 * bare, "before_ms": 1000 * before, "pipeline_ms": 1000 * now, "speedup": before / now,
            "loop_ratio": now / bare}
    print(f"bare_ms: {line['bare_ms']:.1f} before_ms: {line['before_ms']:.1f} pipeline_ms: {line['pipeline_ms']:.1f} "
          f"speedup: {line['speedup']:.2f} loop_ratio: {line['loop_ratio']:.2f}")
    return line


if __name__ == "__main__":
    main()
