"""Distillation throughput on CPU, all measured side by side in one run.

BERT-base-shaped teacher (12/768/12/3072, vocab 30522, random weights) and a TinyBERT4 student
(4/312/12/1200), batch 32, sequence 64:

(a) floor: teacher forward under no_grad + student forward + backward + optimiser step (no capture, no loss
    terms beyond the student's own head);
(b) one intermediate-layer distillation step through the `Distiller` module (what the Trainer optimises): capture of the mapped layers, attention + hidden + embedding losses with the
    learnable projection, backward, optimiser step;
(c) prediction-layer distillation over the paper's grid (3 lrs x 2 batch sizes x 3 epochs) with teacher
    logits computed on the fly; (d) the same grid with teacher logits cached once.

(a)/(b) are interleaved (ABAB...) and medians taken. Last line: `step_ratio: <b/a> cache_speedup: <c/d>`.
Run: python -m benchmarks.distill [--reps 5] [--examples 256] [--skip-grid]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import datasets
import torch
import transformers

from distillery.layer_map import build_layer_map
from distillery.models import student_config
from distillery.shape import Dims
from distillery.training.compiled import compile_step, use as use_compile
from distillery.training.distill import Distiller, make_projection
from distillery.training.grid import prediction_grid
from distillery.training.metrics import accuracy
from distillery.training.spec import DistillSpec, Grid, TrainRun

VOCAB = 30522
#: TinyBERT's intermediate stage (eqs. 7-9) and prediction stage (eq. 10), paper weights
INTERMEDIATE = {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}
PREDICTION = {"prediction_loss": 1.0}
#: TinyBERT Sec. 4.2, step 2: lr x batch size
PAPER_LRS, PAPER_BATCH_SIZES = (1e-5, 2e-5, 3e-5), (16, 32)


#: (layers, hidden, heads, intermediate): TinyBERT Table 1's teacher and student
TEACHER, STUDENT = (12, 768, 12, 3072), (4, 312, 12, 1200)


def bert_config(shape: tuple[int, int, int, int], vocab: int = VOCAB) -> transformers.BertConfig:
    return student_config(Dims(*shape), vocab, num_labels=2)


def _bert(shape: tuple[int, int, int, int], vocab: int) -> transformers.BertForSequenceClassification:
    return transformers.BertForSequenceClassification(bert_config(shape, vocab))


def teacher_model(shape=TEACHER, vocab: int = VOCAB) -> transformers.BertForSequenceClassification:
    return _bert(shape, vocab).eval()


def student_model(shape=STUDENT, vocab: int = VOCAB) -> transformers.BertForSequenceClassification:
    return _bert(shape, vocab)


def batch(n: int, seq: int, seed: int = 0, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(1000, vocab // 2), vocab, (n, seq), generator=g)
    mask = torch.ones(n, seq, dtype=torch.long)
    lengths = torch.randint(seq // 2, seq + 1, (n,), generator=g)
    for i, length in enumerate(lengths.tolist()):
        mask[i, length:] = 0
        ids[i, length:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.randint(0, 2, (n,), generator=g)}


def step_benchmark(reps: int, bsz: int, seq: int, *, device: str = "cpu", bf16: bool = False, compiled: bool = False,
                   profile: str | None = None, teacher_shape=TEACHER, student_shape=STUDENT,
                   vocab: int = VOCAB) -> dict[str, float]:
    """Median seconds of (a) the floor step and (b) one intermediate-layer distillation step, interleaved, by name
    ("floor", "step"); on a GPU under bf16 autocast when `bf16` (fused AdamW there), synchronised around every timed
    step. `compiled`: also "forwards", (b) with the teacher's and the student's forwards `torch.compile`d (copies of
    the same weights; the losses eager), and "compiled", the pipeline's compiled step (`compiled.compile_step`: the
    losses too). `profile`: a directory that gets `profile.txt`, each variant's hottest kernels
    over 3 profiled steps and their device time a step beside the step's wall time."""
    dev = torch.device(device)
    teacher, student = teacher_model(teacher_shape, vocab).to(dev), student_model(student_shape, vocab).to(dev)
    lm = build_layer_map("uniform", student_shape[0], teacher_shape[0])
    spec = DistillSpec(INTERMEDIATE, "intermediate", lm)
    b = {k: v.to(dev) for k, v in batch(bsz, seq, vocab=vocab).items()}

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16)

    def make_step(distiller: Distiller) -> Callable[[], None]:
        opt = torch.optim.AdamW([p for p in distiller.parameters() if p.requires_grad], lr=1e-4,
                                fused=dev.type == "cuda")
        distiller.train()

        def distil_step() -> None:
            with autocast():
                total = distiller(**b).loss
            total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return distil_step

    distiller = Distiller(student, teacher, spec, make_projection(student, teacher, lm).to(dev))
    fns = {"step": make_step(distiller)}
    if compiled:  # copies of the same weights: forwards compiled, losses eager; then the pipeline's compiled step
        t2, s2 = copy.deepcopy(teacher), copy.deepcopy(student)
        t2.compile()
        s2.compile()
        fns["forwards"] = make_step(Distiller(s2, t2, spec, copy.deepcopy(distiller.projection)))
        whole = Distiller(copy.deepcopy(student), copy.deepcopy(teacher), spec, copy.deepcopy(distiller.projection))
        with use_compile("on"):
            compile_step(whole)
        fns["compiled"] = make_step(whole)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=1e-4, fused=dev.type == "cuda")

    def floor() -> None:
        with autocast():
            with torch.no_grad():
                teacher(**{k: v for k, v in b.items() if k != "labels"})
            loss = student(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    fns = {"floor": floor, **fns}

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for name, fn in list(fns.items()):  # warm-up (and compilation)
        try:
            fn(), fn()
        except Exception as e:  # noqa: BLE001 - a variant that cannot run is reported and left out
            if name not in ("forwards", "compiled"):
                raise
            print(f"    {name} step left out: {type(e).__name__}: {str(e)[:500]}", flush=True)
            del fns[name]
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(reps):
        for name in list(fns) if i % 2 == 0 else list(fns)[::-1]:
            sync()
            t0 = time.perf_counter()
            fns[name]()
            sync()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    labels = {"floor": "(a) floor step", "step": "(b) intermediate distillation step",
              "forwards": "    the same, teacher's and student's forwards compiled",
              "compiled": "    the same, forwards and losses compiled (compile: on)"}
    for name, ts in times.items():
        print(f"{labels[name]}: median {med[name]:.4f}s  runs {[round(x, 4) for x in ts]}", flush=True)
    if profile:
        try:
            profile_kernels(fns, Path(profile) / "profile.txt", med, dev, sync)
        except Exception as e:  # noqa: BLE001 - the profile is an extra: the timings above stand without it
            print(f"    profile failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return med


def profile_kernels(fns: dict[str, Callable[[], None]], path: Path, med: dict[str, float], dev: torch.device,
                    sync: Callable[[], None], steps: int = 3) -> None:
    """Append each variant's hottest operators over `steps` profiled steps to `path` (device time on a GPU), with
    the device time a step beside the variant's median wall time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    key = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for name, fn in fns.items():
            sync()
            with profile(activities=acts) as prof:
                for _ in range(steps):
                    fn()
                sync()
            avg = prof.key_averages()
            kernels = [e for e in avg if e.device_type == (DeviceType.CUDA if dev.type == "cuda" else DeviceType.CPU)]
            busy = sum(getattr(e, key, 0) for e in kernels) / steps / 1e3  # device kernels only (no op counted twice)
            f.write(f"## {name}: wall {1e3 * med[name]:.2f} ms a step, {key} {busy:.2f} ms a step\n")
            f.write(avg.table(sort_by=key, row_limit=30, max_name_column_width=70) + "\n\n")
            print(f"    profile {name}: {key} {busy:.2f} ms a step of {1e3 * med[name]:.2f} ms wall", flush=True)


def grid_benchmark(examples: int, seq: int, tmp: Path, epochs: float) -> tuple[float, float]:
    teacher = teacher_model()
    torch.manual_seed(0)
    init = student_model()
    init.save_pretrained(tmp / "student")
    b = batch(examples + 64, seq, seed=1)
    rows = {k: v.tolist() for k, v in b.items()}
    full = datasets.Dataset.from_dict({**rows, "idx": list(range(examples + 64))})
    train, dev = full.select(range(examples)), full.select(range(examples, examples + 64))
    run = TrainRun(tmp / "grid-fly", train, dev, compute_metrics=accuracy, main_score="accuracy",
                   args=dict(save_strategy="no", eval_strategy="no", load_best_model_at_end=False, disable_tqdm=True,
                             logging_steps=50, per_device_eval_batch_size=64))
    spec = DistillSpec(PREDICTION, "prediction")
    t0 = time.perf_counter()
    prediction_grid(teacher, tmp / "student", spec, run,
                    Grid(PAPER_LRS, PAPER_BATCH_SIZES, epochs, cache_teacher_logits=False))
    c = time.perf_counter() - t0
    t0 = time.perf_counter()
    prediction_grid(teacher, tmp / "student", spec, run.with_(output_dir=tmp / "grid-cache"),
                    Grid(PAPER_LRS, PAPER_BATCH_SIZES, epochs, cache_dir=tmp / "cache"))
    d = time.perf_counter() - t0
    print(f"(c) grid, teacher on the fly: {c:.1f}s   (d) grid, teacher logits cached once: {d:.1f}s "
          f"({examples} examples, 3 lrs x 2 batch sizes x {epochs:g} epochs)")
    return c, d


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions of (a) and (b)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--examples", type=int, default=256, help="training examples for the grid")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--skip-grid", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch}, seq {args.seq}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t = step_benchmark(args.reps, args.batch, args.seq)
        a, b = t["floor"], t["step"]
        c, dd = (float("nan"), float("nan")) if args.skip_grid else grid_benchmark(args.examples, args.seq, tmp, args.epochs)
    print(f"step_ratio: {b / a:.3f} cache_speedup: {c / dd:.2f}")


if __name__ == "__main__":
    main()
