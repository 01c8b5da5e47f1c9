"""Task-stage model selection over a learning-rate x batch-size grid (`distillery.training.spec.Grid`), best run on
the dev main score.

TinyBERT step 2 (paper section 4.2: lr in {1e-5, 2e-5, 3e-5}, batch in {16, 32}, 3 epochs) distils the
prediction layer (a `DistillSpec`): teacher logits are computed once and shared by every run (`logits_cache`)
unless `Grid.cache_teacher_logits` is off. MiniLM, DistilBERT and MobileBERT fine-tune their general student on gold
labels over the same kind of grid (no spec, no teacher).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from transformers import PreTrainedModel

from distillery.io import write_json
from distillery.objectives.registry import TERMS
from distillery.training.args import training_arguments
from distillery.training.distill import OPTIONS as DISTILL_OPTIONS, distill
from distillery.training.distributed import is_main, main_process_first, per_device_batch
from distillery.training.finetune import OPTIONS as FINETUNE_OPTIONS, finetune
from distillery.training.logits_cache import cache_teacher_logits
from distillery.training.saving import checkpoint_dir
from distillery.training.spec import DistillSpec, Grid, TrainRun


@dataclass
class GridResult:
    best_dir: Path
    best: dict[str, Any]
    results: list[dict[str, Any]]


def prediction_grid(
    teacher: PreTrainedModel | None,
    student: Callable[[], PreTrainedModel],
    spec: DistillSpec | None,
    run: TrainRun,
    grid: Grid,
) -> GridResult:
    """Train one run per (learning rate, batch size) of `grid`; return the best run on dev + all results.

    `spec`: the prediction-layer distillation of every run (teacher logits computed once and shared when
    `grid.cache_teacher_logits` and no term reads the teacher's internals); None fine-tunes on the gold labels (no
    teacher). `student` is a factory of the starting student, a fresh copy with the task's head at each call (a saved
    directory alone does not say which head); every run starts from it. `run` needs `eval_dataset` and
    `compute_metrics`; each run writes `run.output_dir/lr<lr>-bs<bs>/model`, and `run.output_dir/grid.json` lists
    all results. A batch size is the global batch: under a launcher each of N processes trains on batch / N
    examples per step. `run.args` are every run's TrainingArguments options (warm-up 0.1 of the steps unless they
    say); each run's `TrainingArguments` are built here, with its learning rate, batch size and epochs.
    """
    if run.eval_dataset is None or run.compute_metrics is None:
        raise ValueError("prediction_grid selects on dev: the run needs eval_dataset and compute_metrics")
    output_dir = run.output_dir
    train = run.train_dataset
    run_teacher: PreTrainedModel | None = teacher
    # a term that reads the teacher's internals (BERT-PKD's patient loss) needs its forward anyway: no cache then
    if spec is not None and grid.cache_teacher_logits and not any(TERMS[n].features for n in spec.active):
        # under a launcher rank 0 computes and writes the cache once; the other ranks then read the same file
        with main_process_first():
            train = cache_teacher_logits(
                teacher, train, grid.cache_dir if grid.cache_dir is not None else output_dir / "teacher_logits",
                tokenizer=run.tokenizer, progress=not run.args.get("disable_tqdm", False),
            )
        run_teacher = None  # every run reads the cached column
    shared = {**(FINETUNE_OPTIONS if spec is None else DISTILL_OPTIONS), "warmup_steps": 0.1, **run.args}
    results = []
    for lr in grid.learning_rates:
        for bs in grid.batch_sizes:
            name = f"lr{lr:g}-bs{bs}"
            args = training_arguments(checkpoint_dir(output_dir / name), {
                **shared, "learning_rate": lr, "per_device_train_batch_size": per_device_batch(bs),
                "num_train_epochs": grid.epochs}, select=True)
            one = run.with_(output_dir=output_dir / name, train_dataset=train, args=args)
            if spec is None:
                model_dir = finetune(student(), one)
            else:
                model_dir = distill(run_teacher, student(), spec, one)
            metrics = json.loads((model_dir / "metrics.json").read_text())
            results.append({"name": name, "learning_rate": lr, "batch_size": bs, "model_dir": str(model_dir),
                            "main": metrics["eval_main"], "metrics": metrics})
    best = max(results, key=lambda r: r["main"])
    if is_main():
        write_json(output_dir / "grid.json", {"best": best["name"], "results": results})
    return GridResult(best_dir=Path(best["model_dir"]), best=best, results=results)
