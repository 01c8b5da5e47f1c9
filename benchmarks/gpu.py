"""The TinyBERT recipe on one GPU, each part against its floor, measured side by side in one run (issue 13).

Run: python -m benchmarks.gpu            (needs CUDA; without it prints why and exits 0)
     python -m benchmarks.gpu --device cpu --micro   (the same code at toy sizes: what the test suite runs)

(a) augmentation: the faithful batched path vs the per-position reference (one batch-1 MLM forward per word,
    as the official script), same sentences and BERT-base-shaped MLM (`benchmarks.augment`, on this device);
(b) one intermediate-layer distillation step vs its floor (teacher forward + student forward/backward + optimiser
    step), bf16 autocast, fused AdamW, BERT-base-shaped teacher, TinyBERT4 student, batch 256, sequence 128
    (`benchmarks.distill.step_benchmark`);
(c) general distillation throughput: sequences per second of (b)'s distillation step, and its model-FLOPs
    utilisation (teacher forward + 3 x student forward FLOPs, `distillery.efficiency.flops`, over the device's
    dense bf16 peak; `--peak-tflops` for a device not in `PEAK_TFLOPS`), and the GPU-hours the paper's general
    distillation would take at that rate (`paper_gpu_hours`);
(d) latency of the student vs the teacher at batch 1 and 32 (`distillery.efficiency.measure_latency`);
(e) the pipeline's own loop (`distillery.training.distill.distill`: the Trainer, its data loader over dataset rows,
    the collator, logging) against (b)'s bare step, both at the `gpu` preset's general-distillation shapes
    (all-MiniLM-L6-v2's 6 x 384 teacher, TinyBERT4): on the H200 (2026-11-27) the preset's stage ran at 2,916
    sequences/s with the Trainer's loader defaults, 5,552 with the pipeline's loader workers (`benchmarks.gpu_loop`,
    docs/benchmarks.md); `--profile` adds the loop's top operators, by host time and by device time.
Last line: `aug_speedup: <a> step_ratio: <b> gd_seq_per_s: <c> mfu: <c's utilisation> loop_ratio: <e>`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import transformers

from benchmarks import augment as augment_bench
from benchmarks.distill import (INTERMEDIATE, STUDENT, TEACHER, VOCAB, bert_config, step_benchmark, student_model,
                                teacher_model)
from distillery.efficiency import flops_per_example, measure_latency

#: Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets, by device-name fragment.
PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L4": 121.0}
#: The paper's general distillation: English Wikipedia, 2,500M words, 3 epochs at sequence 128 (TinyBERT Sec. 4.2);
#: 1.3 WordPiece tokens per word (an assumption: uncased BERT vocabulary on English prose). The official run is
#: reported at ~2,240 V100 GPU-hours for TinyBERT4 (../shared/reference/official-code.md).
PAPER_WORDS, PAPER_EPOCHS, TOKENS_PER_WORD, OFFICIAL_GPU_HOURS = 2_500e6, 3, 1.3, 2240
MICRO = dict(teacher_shape=(2, 32, 2, 64), student_shape=(1, 16, 2, 32), vocab=1000)
#: The `gpu` preset's general distillation: all-MiniLM-L6-v2's shape as teacher, TinyBERT4 as student (params/gpu.yaml).
PRESET = dict(teacher_shape=(6, 384, 12, 1536), student_shape=STUDENT, vocab=VOCAB)


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def step_flops(batch: int, seq: int, teacher_shape, student_shape, vocab: int) -> float:
    """FLOPs of one distillation step: the teacher's forward plus the student's forward and backward (2 x forward)."""
    t, s = bert_config(teacher_shape, vocab), bert_config(student_shape, vocab)  # configs only: no weights built
    return batch * (flops_per_example(t, seq) + 3 * flops_per_example(s, seq))


def paper_gpu_hours(seq_per_s: float, seq: int = 128) -> float:
    """GPU-hours of the paper's general distillation (`PAPER_WORDS` x `TOKENS_PER_WORD` tokens in sequences of `seq`,
    `PAPER_EPOCHS` epochs) at `seq_per_s` sequences per second."""
    return PAPER_WORDS * TOKENS_PER_WORD / seq * PAPER_EPOCHS / seq_per_s / 3600


def loop_step(steps: int, batch: int, seq: int, *, teacher_shape, student_shape, vocab: int,
              profile: bool = False, options: dict | None = None, trace: str | None = None) -> float:
    """Median seconds per optimisation step of `distill` (the pipeline's loop: `Trainer`, a data loader over
    `datasets` rows of token lists, the padding collator, loss-term logging; bf16 and fused AdamW where the pipeline
    turns them on) over `steps` steps of (b)'s distillation at `batch` x `seq`, on the Trainer's device.
    `options`: training options over the pipeline's (`benchmarks.gpu_loop` compares some); `trace`: a Chrome trace
    of the profiled run written there (with `profile`)."""
    import datasets
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from tokenizers import Tokenizer, models

    from distillery.layer_map import build_layer_map
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
    args = dict(per_device_train_batch_size=batch, max_steps=steps, learning_rate=1e-4, save_strategy="no",
                disable_tqdm=True, logging_steps=10, **(options or {}))
    with tempfile.TemporaryDirectory(prefix="gpu-bench-loop-") as out:
        run = TrainRun(out, rows, tokenizer=tok, callbacks=[clock], args=args, resume=False)
        if not profile:
            distill(teacher, student, spec, run)
        else:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA]
                                                            if torch.cuda.is_available() else [])
            with torch.profiler.profile(activities=acts) as prof:
                distill(teacher, student, spec, run)
            table = prof.key_averages()  # the host's view (data loader, Python, launches), then the device's
            for key in ("cpu_time_total", "self_cpu_time_total") + (("self_cuda_time_total",) if len(acts) > 1 else ()):
                print(f"sorted by {key}:\n{table.table(sort_by=key, row_limit=15)}", flush=True)
            if trace:
                prof.export_chrome_trace(trace)
    gaps = [b - a for a, b in zip(clock.ends, clock.ends[1:])][2:]  # after the first steps' warm-up
    return statistics.median(gaps)


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--micro", action="store_true", help="toy sizes (CPU test of the same code)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--sentences", type=int, default=200, help="augmentation sentences (SST-2 when shared)")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--loop-steps", type=int, default=60, help="(e): steps of the pipeline's loop")
    p.add_argument("--profile", action="store_true", help="(e): print the loop's top operators (torch.profiler)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu needs a CUDA device (torch.cuda.is_available() is False): nothing measured. "
              "`--device cpu --micro` runs the same code at toy sizes.")
        return None
    transformers.logging.set_verbosity_error()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    shapes = MICRO if args.micro else dict(teacher_shape=TEACHER, student_shape=STUDENT, vocab=VOCAB)
    batch, seq = (4, 16) if args.micro else (args.batch, args.seq)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"bf16 {bf16}, batch {batch}, sequence {seq}", flush=True)

    aug_argv = ["--device", args.device, "--sentences", str(4 if args.micro else args.sentences)]
    aug_argv += ["--chunk", "4", "--n-aug", "2"] if args.micro else []
    aug = augment_bench.main(aug_argv)

    floor, step = step_benchmark(2 if args.micro else args.reps, batch, seq, device=args.device, bf16=bf16, **shapes)
    seq_per_s = batch / step
    peak = peak_tflops(device, args.peak_tflops)
    achieved = step_flops(batch, seq, **shapes) / step
    mfu = achieved / (peak * 1e12) if peak else float("nan")
    print(f"(c) general distillation: {seq_per_s:.0f} sequences/s, {achieved / 1e12:.1f} TFLOP/s"
          + (f" of {peak:.0f} peak" if peak else " (peak unknown: --peak-tflops)"))
    print(f"    the paper's general distillation at this rate: {paper_gpu_hours(seq_per_s, seq):.1f} GPU-hours "
          f"(official code: ~{OFFICIAL_GPU_HOURS} V100 GPU-hours)")

    teacher = teacher_model(shapes["teacher_shape"], shapes["vocab"])
    student = student_model(shapes["student_shape"], shapes["vocab"]).eval()
    for b in (1, 32):
        res = measure_latency({"teacher": teacher, "student": student}, batch=b, seq_len=seq, reps=3 if args.micro else 20,
                              warmup=1 if args.micro else 5, reference="teacher", device=args.device)
        print(f"(d) latency batch {b}: teacher {res['teacher'].median_ms:.2f} ms, student {res['student'].median_ms:.2f} ms "
              f"({res['student'].speedup:.1f}x)")
    preset = MICRO if args.micro else PRESET
    _, bare = step_benchmark(2 if args.micro else args.reps, batch, seq, device=args.device, bf16=bf16, **preset)
    loop = loop_step(6 if args.micro else args.loop_steps, batch, seq, profile=args.profile, **preset)
    print(f"(e) the gpu preset's general distillation, batch {batch}: bare step {1000 * bare:.1f} ms "
          f"({batch / bare:.0f} sequences/s), the pipeline's loop {1000 * loop:.1f} ms "
          f"({batch / loop:.0f} sequences/s)")
    out = {"aug_speedup": aug, "step_ratio": step / floor, "gd_seq_per_s": seq_per_s, "mfu": mfu,
           "loop_ratio": loop / bare}
    print(f"aug_speedup: {aug:.1f} step_ratio: {step / floor:.3f} gd_seq_per_s: {seq_per_s:.0f} mfu: {mfu:.3f} "
          f"loop_ratio: {loop / bare:.2f}")
    return out


if __name__ == "__main__":
    main()
