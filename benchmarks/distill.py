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
import statistics
import tempfile
import time
from pathlib import Path

import datasets
import torch
import transformers

from distillery.layer_map import build_layer_map
from distillery.models import student_config
from distillery.shape import Dims
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


def step_benchmark(reps: int, bsz: int, seq: int, *, device: str = "cpu", bf16: bool = False,
                   teacher_shape=TEACHER, student_shape=STUDENT, vocab: int = VOCAB) -> tuple[float, float]:
    """Median seconds of (a) the floor step and (b) one intermediate-layer distillation step, interleaved; on a GPU
    under bf16 autocast when `bf16` (fused AdamW there), synchronised around every timed step."""
    dev = torch.device(device)
    teacher, student = teacher_model(teacher_shape, vocab).to(dev), student_model(student_shape, vocab).to(dev)
    lm = build_layer_map("uniform", student_shape[0], teacher_shape[0])
    spec = DistillSpec(INTERMEDIATE, "intermediate", lm)
    proj = make_projection(student, teacher, lm).to(dev)
    distiller = Distiller(student, teacher, spec, proj).train()
    opt = torch.optim.AdamW([p for p in distiller.parameters() if p.requires_grad], lr=1e-4, fused=dev.type == "cuda")
    b = {k: v.to(dev) for k, v in batch(bsz, seq, vocab=vocab).items()}
    student.train()

    def autocast():
        return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16)

    def floor() -> None:
        with autocast():
            with torch.no_grad():
                teacher(**{k: v for k, v in b.items() if k != "labels"})
            loss = student(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def distil_step() -> None:
        with autocast():
            total = distiller(**b).loss
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    floor(), distil_step()  # warm-up
    ta, tb = [], []
    for i in range(reps):
        for fn, acc in ((floor, ta), (distil_step, tb)) if i % 2 == 0 else ((distil_step, tb), (floor, ta)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            acc.append(time.perf_counter() - t0)
    a, b_ = statistics.median(ta), statistics.median(tb)
    print(f"(a) floor step: median {a:.3f}s  runs {[round(x, 3) for x in ta]}")
    print(f"(b) intermediate distillation step: median {b_:.3f}s  runs {[round(x, 3) for x in tb]}")
    return a, b_


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
        a, b = step_benchmark(args.reps, args.batch, args.seq)
        c, dd = (float("nan"), float("nan")) if args.skip_grid else grid_benchmark(args.examples, args.seq, tmp, args.epochs)
    print(f"step_ratio: {b / a:.3f} cache_speedup: {c / dd:.2f}")


if __name__ == "__main__":
    main()
