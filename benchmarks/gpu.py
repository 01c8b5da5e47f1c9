"""The TinyBERT recipe on one GPU, each part against its floor, measured side by side in one run.

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
The pipeline's own training loop against this bare step: `benchmarks.gpu_loop`.
With `--compile` (the default on CUDA) (b) and (c) also run with the teacher's and student's forwards
`torch.compile`d, and compiled as the pipeline does (`compile: on`: the losses too);
`--shapes preset` puts the gpu preset's 6 x 384 teacher in the BERT-base one's place; `--profile DIR` writes each
step's hottest kernels to DIR/profile.txt. Beside the data sheet's peak, the device's own matmul ceiling at the step's
linear-layer shapes (`distillery.efficiency.ceiling`) and the step's share of it.
Last line: `aug_speedup: <a> step_ratio: <b> gd_seq_per_s: <c> mfu: <c's utilisation of the peak> ceiling_share: <of
the measured ceiling>`, then with compilation `compiled_mfu`, `compiled_ceiling_share` and `compile_speedup`.
"""

from __future__ import annotations

import argparse

import torch
import transformers

from benchmarks import augment as augment_bench
from benchmarks.distill import (STUDENT, TEACHER, VOCAB, bert_config, step_benchmark, student_model,
                                teacher_model)
from distillery.efficiency import flops_per_example, measure_latency
from distillery.efficiency.ceiling import layer_shapes, matmul_ceiling

#: Dense bf16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets, by device-name fragment.
PEAK_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L4": 121.0}
#: The paper's general distillation: English Wikipedia, 2,500M words, 3 epochs at sequence 128 (TinyBERT Sec. 4.2);
#: 1.3 WordPiece tokens per word (an assumption: uncased BERT vocabulary on English prose). The official run is
#: reported at ~2,240 V100 GPU-hours for TinyBERT4 (../shared/reference/official-code.md).
PAPER_WORDS, PAPER_EPOCHS, TOKENS_PER_WORD, OFFICIAL_GPU_HOURS = 2_500e6, 3, 1.3, 2240
#: the gpu preset's teacher (all-MiniLM-L6-v2's shape, params/gpu.yaml)
PRESET_TEACHER = (6, 384, 12, 1536)
MICRO = dict(teacher_shape=(2, 32, 2, 64), student_shape=(1, 16, 2, 32), vocab=1000)


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


def gpu_parser(description: str) -> argparse.ArgumentParser:
    """The GPU benchmarks' common arguments: `--device` (cuda), `--micro`, `--batch` 256, `--seq` 128."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda")
    p.add_argument("--micro", action="store_true", help="toy sizes (CPU test of the same code)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    return p


def device_or_none(args: argparse.Namespace, benchmark: str) -> torch.device | None:
    """`args.device`, or None after saying why where CUDA is asked for and absent (the benchmark measures nothing)."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"{benchmark} needs a CUDA device (torch.cuda.is_available() is False): nothing measured. "
              "`--device cpu --micro` runs the same code at toy sizes.")
        return None
    transformers.logging.set_verbosity_error()
    return device


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    p = gpu_parser(__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--sentences", type=int, default=400, help="augmentation sentences (SST-2 when shared)")
    p.add_argument("--peak-tflops", type=float, default=None)
    p.add_argument("--shapes", choices=("paper", "preset"), default="paper",
                   help="paper: BERT-base teacher, TinyBERT4 (default); preset: the gpu preset's 6 x 384 teacher")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="also the step with teacher and student torch.compile'd (default: on CUDA)")
    p.add_argument("--no-aug", dest="aug", action="store_false", help="skip (a)")
    p.add_argument("--aug-batch", type=int, default=2048, help="(a)'s masked copies per MLM forward")
    p.add_argument("--aug-chunk", type=int, default=200, help="(a)'s sentences batched together")
    p.add_argument("--profile", default=None, help="a directory for profile.txt (each step's hottest kernels)")
    args = p.parse_args(argv)
    if (device := device_or_none(args, "benchmarks.gpu")) is None:
        return None
    if device.type == "cuda":
        torch.backends.fp32_precision = "tf32"  # as a Trainer sets it (distillery.precision.trainer_options)
    if args.compile is None:
        args.compile = device.type == "cuda"
    teacher_shape = PRESET_TEACHER if args.shapes == "preset" else TEACHER
    shapes = MICRO if args.micro else dict(teacher_shape=teacher_shape, student_shape=STUDENT, vocab=VOCAB)
    batch, seq = (4, 16) if args.micro else (args.batch, args.seq)
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"bf16 {bf16}, batch {batch}, sequence {seq}", flush=True)

    aug_argv = ["--device", args.device, "--sentences", str(4 if args.micro else args.sentences)]
    aug_argv += ["--chunk", "4", "--n-aug", "2", "--tiny"] if args.micro else ["--chunk", str(args.aug_chunk),
                                                                     "--batch-size", str(args.aug_batch)]
    aug = augment_bench.main(aug_argv) if args.aug else float("nan")

    times = step_benchmark(2 if args.micro else args.reps, batch, seq, device=args.device, bf16=bf16,
                           compiled=args.compile, profile=args.profile, **shapes)
    floor, step = times["floor"], times["step"]
    peak = peak_tflops(device, args.peak_tflops)
    flops = step_flops(batch, seq, **shapes)
    mfu = {name: flops / t / (peak * 1e12) if peak else float("nan") for name, t in times.items()}
    (tl, th, _, ti), (sl, sh, _, si) = shapes["teacher_shape"], shapes["student_shape"]
    ceiling = matmul_ceiling(layer_shapes(th, ti, batch * seq, training=False) * tl + layer_shapes(sh, si, batch * seq) * sl,
                             dtype="bfloat16" if bf16 else "float32", device=args.device).flops_per_s
    print(f"    this device's matmul ceiling at the step's linear-layer shapes: {ceiling / 1e12:.3g} TFLOP/s")
    steps = [n for n in ("step", "forwards", "compiled") if n in times]
    variant = {"step": "", "forwards": ", forwards compiled", "compiled": ", compiled"}
    for name in steps:
        print(f"(c) general distillation{variant[name]}: {batch / times[name]:.0f} "
              f"sequences/s, {flops / times[name] / 1e12:.3g} TFLOP/s"
              + (f" of {peak:.0f} peak: MFU {mfu[name]:.3f}" if peak else " (peak unknown: --peak-tflops)"))
    best = min(steps, key=times.get)
    seq_per_s = batch / times[best]
    print(f"    the paper's general distillation at the faster rate ({best}): {paper_gpu_hours(seq_per_s, seq):.1f} "
          f"GPU-hours (official code: ~{OFFICIAL_GPU_HOURS} V100 GPU-hours)")

    teacher = teacher_model(shapes["teacher_shape"], shapes["vocab"])
    student = student_model(shapes["student_shape"], shapes["vocab"]).eval()
    for b in (1, 32):
        res = measure_latency({"teacher": teacher, "student": student}, batch=b, seq_len=seq, reps=3 if args.micro else 20,
                              warmup=1 if args.micro else 5, reference="teacher", device=args.device)
        print(f"(d) latency batch {b}: teacher {res['teacher'].median_ms:.2f} ms, student {res['student'].median_ms:.2f} ms "
              f"({res['student'].speedup:.1f}x)")
    out = {"aug_speedup": aug, "step_ratio": step / floor, "gd_seq_per_s": seq_per_s, "mfu": mfu["step"],
           "ceiling_share": flops / step / ceiling}
    if "compiled" in times:
        out.update(compiled_mfu=mfu["compiled"], compiled_ceiling_share=flops / times["compiled"] / ceiling,
                   compile_speedup=step / times["compiled"])
    print(" ".join(f"{k}: {v:.3f}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
