"""Where the pipeline's training loop spends a step, and what the loader and the per-step checks cost.

This runs the pipeline's own loop (`loop_step`: `distill` through the Trainer, its data loader over
`datasets` rows, the padding collator) at the `gpu` preset's general-distillation shapes (batch 256 x 128, bf16)
under a few training options side by side, the bare step beside it (synchronised every step), then one profiled
run: the host's hottest Python functions (cProfile) and a Chrome trace of the device's work (`--out`). What its runs
found (the loader's workers and no per-step loss check, `distillery.training.args.loader_options`) is in
docs/benchmarks.md, "The training loop on the GPU".

Run: python -m benchmarks.gpu_loop [--out DIR]          (CUDA; `--device cpu --micro` runs the same code, toy sizes)
Last line: `bare_ms: <b> before_ms: <the Trainer's defaults> pipeline_ms: <p> speedup: <before / p>
loop_ratio: <p / b>`.
"""

from __future__ import annotations

import cProfile
import gzip
import io
import os
import platform
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from benchmarks import gpu
from benchmarks.distill import INTERMEDIATE, STUDENT, VOCAB, step_benchmark, student_model, teacher_model

#: The `gpu` preset's general distillation: all-MiniLM-L6-v2's shape as teacher, TinyBERT4 as student (params/gpu.yaml).
PRESET = dict(teacher_shape=gpu.PRESET_TEACHER, student_shape=STUDENT, vocab=VOCAB)
#: The Trainer's own loader and loss check (the pipeline's loop before `distillery.training.args.loader_options`).
TRAINER_DEFAULTS = {"dataloader_num_workers": 0, "dataloader_persistent_workers": False,
                    "dataloader_prefetch_factor": None, "logging_nan_inf_filter": True}
#: Training options over the pipeline's, each measured against the pipeline's own loop.
VARIANTS: dict[str, dict] = {
    "trainer_defaults": TRAINER_DEFAULTS,
    "pipeline": {"compile": "auto"},
    "no_workers": {k: v for k, v in TRAINER_DEFAULTS.items() if k != "logging_nan_inf_filter"},
    "nan_check": {"logging_nan_inf_filter": True},
    "no_pin_memory": {"dataloader_pin_memory": False},
    "eager": {"compile": "off"},  # the pipeline's loop without torch.compile (distillery.training.compiled)
}


def loop_step(steps: int, batch: int, seq: int, *, teacher_shape, student_shape, vocab: int,
              profile: bool = False, options: dict | None = None, trace: str | None = None) -> float:
    """Median seconds per optimisation step of `distill` (the pipeline's loop: `Trainer`, a data loader over
    `datasets` rows of token lists, the padding collator, loss-term logging; bf16 and fused AdamW where the pipeline
    turns them on) over `steps` steps of the bare step's distillation (`benchmarks.distill.step_benchmark`: TinyBERT's
    intermediate losses) at `batch` x `seq`, on the Trainer's device.
    `options`: training options over the pipeline's (`VARIANTS`); `trace`: a Chrome trace
    of the profiled run written there (with `profile`)."""
    import datasets
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from tokenizers import Tokenizer, models

    from distillery.layer_map import build_layer_map
    from distillery.training import compiled
    from distillery.training.distill import distill
    from distillery.training.spec import DistillSpec, TrainRun

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    vocab_map = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, vocab)}}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab_map, unk_token="[UNK]")),
                                  pad_token="[PAD]", unk_token="[UNK]")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (steps * batch, seq), generator=g).tolist()
    rows = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * seq] * len(ids)})
    teacher, student = teacher_model(teacher_shape, vocab), student_model(student_shape, vocab)
    clock = Clock()
    spec = DistillSpec(INTERMEDIATE, "intermediate", build_layer_map("uniform", student_shape[0], teacher_shape[0]))
    options = dict(options or {})
    setting = options.pop("compile", "off")  # the pipeline's switch (not a training argument); off unless a variant
    # sets it, so the loader variants compare with the eager runs before it
    args = dict(per_device_train_batch_size=batch, max_steps=steps, learning_rate=1e-4, save_strategy="no",
                disable_tqdm=True, logging_steps=10, **options)
    with tempfile.TemporaryDirectory(prefix="gpu-bench-loop-") as out:
        run = TrainRun(out, rows, tokenizer=tok, callbacks=[clock], args=args, resume=False)
        if not profile:
            with compiled.use(setting):
                distill(teacher, student, spec, run)
        else:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                            if torch.cuda.is_available() else [])
            with torch.profiler.profile(activities=acts) as prof, compiled.use(setting):
                distill(teacher, student, spec, run)
            table = prof.key_averages()  # the host's view (data loader, Python, launches), then the device's
            for key in ("cpu_time_total", "self_cpu_time_total") + (("self_cuda_time_total",) if len(acts) > 1 else ()):
                print(f"sorted by {key}:\n{table.table(sort_by=key, row_limit=15)}", flush=True)
            if trace:
                prof.export_chrome_trace(trace)
    gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:])][2:]  # after the first steps' warm-up
    return statistics.median(gaps)


def host_profile(steps: int, batch: int, seq: int, shapes: dict, top: int = 30) -> str:
    """cProfile of the pipeline's loop: the `top` functions by their own time (where the host waits or works; loader
    workers are other processes, out of its view)."""
    prof = cProfile.Profile()
    prof.enable()
    loop_step(steps, batch, seq, **shapes)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    p = gpu.gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--out", type=Path, default=None, help="write host_profile.txt and trace.json.gz here")
    args = p.parse_args(argv)
    if (device := gpu.device_or_none(args, "benchmarks.gpu_loop")) is None:
        return None
    shapes = gpu.MICRO if args.micro else PRESET
    batch, seq, steps = (4, 16, 6) if args.micro else (args.batch, args.seq, args.steps)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device_name}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {os.cpu_count()} cores, kernel {platform.release()}, "
          f"batch {batch} x {seq}, {steps} steps", flush=True)
    bare = step_benchmark(2 if args.micro else 10, batch, seq, device=args.device, bf16=bf16, **shapes)["step"]
    times = {}
    for name, options in VARIANTS.items():
        times[name] = loop_step(steps, batch, seq, options=options, **shapes)
        print(f"{name:>16}: {1000 * times[name]:7.1f} ms a step ({batch / times[name]:6.0f} sequences/s) {options}",
              flush=True)
    report = host_profile(steps, batch, seq, shapes)
    print(report[:6000], flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "host_profile.txt").write_text(report)
        trace = args.out / "trace.json"
        loop_step(min(steps, 12), batch, seq, profile=True, trace=str(trace), **shapes)
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
