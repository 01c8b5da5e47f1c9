"""Task-stage model selection over a learning-rate x batch-size grid, best run on the dev main score.

TinyBERT step 2 (paper section 4.2: lr in {1e-5, 2e-5, 3e-5}, batch in {16, 32}, 3 epochs) distils the
prediction layer (`mode="distill"`): teacher logits are computed once and shared by every run (`logits_cache`)
unless `cache=False`. MiniLM and DistilBERT fine-tune their general student on gold labels over the same kind
of grid (`mode="finetune"`, no teacher).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import datasets
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from distillery.io import write_json
from distillery.training.distill import distill
from distillery.training.distributed import is_main, main_process_first, per_device_batch
from distillery.training.finetune import finetune
from distillery.training.logits_cache import cache_teacher_logits
from distillery.training.metrics import MetricFn

PAPER_LRS = (1e-5, 2e-5, 3e-5)
PAPER_BATCH_SIZES = (16, 32)
PAPER_EPOCHS = 3


@dataclass
class GridResult:
    best_dir: Path
    best: dict[str, Any]
    results: list[dict[str, Any]]


def _fresh(student: Callable[[], PreTrainedModel] | str | os.PathLike) -> PreTrainedModel:
    if callable(student):
        return student()
    path = Path(student)
    if not path.is_dir():
        raise FileNotFoundError(f"student directory not found: {path}")
    return AutoModelForSequenceClassification.from_pretrained(str(path))


def prediction_grid(
    teacher: PreTrainedModel | None,
    student: Callable[[], PreTrainedModel] | str | os.PathLike,
    train_dataset: datasets.Dataset,
    eval_dataset: datasets.Dataset,
    output_dir: str | os.PathLike,
    *,
    compute_metrics: MetricFn,
    main_score: Callable[[dict], float] | str | None = None,
    learning_rates: Sequence[float] = PAPER_LRS,
    batch_sizes: Sequence[int] = PAPER_BATCH_SIZES,
    epochs: float = PAPER_EPOCHS,
    cache: bool = True,
    cache_dir: str | os.PathLike | None = None,
    tokenizer=None,
    mode: str = "distill",
    **distill_kwargs: Any,
) -> GridResult:
    """Run prediction-layer distillation for every (lr, batch size); return the best run on dev + all results.

    `student` is the step-1 student (a directory, or a factory returning a fresh copy); every run starts from
    it. Each run writes `output_dir/lr<lr>-bs<bs>/model`; `output_dir/grid.json` lists all results. A batch size is
    the global batch: under a launcher each of N processes trains on batch / N examples per step.
    Other keyword arguments go to `distill` (temperature, regression_target, TrainingArguments overrides...),
    or to `finetune` (TrainingArguments overrides) with `mode="finetune"`.
    """
    if not learning_rates or not batch_sizes:
        raise ValueError("prediction_grid needs at least one learning rate and one batch size")
    if mode not in ("distill", "finetune"):
        raise ValueError(f"mode must be 'distill' or 'finetune', got {mode!r}")
    output_dir = Path(output_dir)
    train = train_dataset
    run_teacher: PreTrainedModel | None = teacher
    if cache and mode == "distill":
        # under a launcher rank 0 computes and writes the cache once; the other ranks then read the same file
        with main_process_first():
            train = cache_teacher_logits(
                teacher, train_dataset, cache_dir if cache_dir is not None else output_dir / "teacher_logits",
                tokenizer=tokenizer, progress=not distill_kwargs.get("disable_tqdm", False),
            )
        run_teacher = None  # every run reads the cached column
    distill_kwargs.setdefault("warmup_steps", 0.1)
    results = []
    for lr in learning_rates:
        for bs in batch_sizes:
            name = f"lr{lr:g}-bs{bs}"
            run = dict(compute_metrics=compute_metrics, main_score=main_score, tokenizer=tokenizer, learning_rate=lr,
                       per_device_train_batch_size=per_device_batch(bs), num_train_epochs=epochs, **distill_kwargs)
            if mode == "finetune":
                model_dir = finetune(_fresh(student), train, eval_dataset, output_dir / name, **run)
            else:
                model_dir = distill(run_teacher, _fresh(student), train, eval_dataset, output_dir / name,
                                    stage="prediction", **run)
            metrics = json.loads((model_dir / "metrics.json").read_text())
            results.append({"name": name, "learning_rate": lr, "batch_size": bs, "model_dir": str(model_dir),
                            "main": metrics["eval_main"], "metrics": metrics})
    best = max(results, key=lambda r: r["main"])
    if is_main():
        write_json(output_dir / "grid.json", {"best": best["name"], "results": results})
    return GridResult(best_dir=Path(best["model_dir"]), best=best, results=results)
