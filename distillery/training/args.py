"""Training arguments: the one function that turns a plain dict of options into `transformers.TrainingArguments`.

Every loop in `distillery.training` builds on the Hugging Face `Trainer`, so mixed precision, gradient
accumulation, distributed training and checkpoint resume come from there, not from this project. The precision is
`distillery.precision`'s (bf16 autocast where the device is fast at it, when the pipeline says so; TF32 on Ampere
GPUs); a caller's own ``bf16`` option wins.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import torch
from transformers import DataCollatorWithPadding, TrainingArguments, default_data_collator

from distillery import precision
from distillery.training.distributed import cpu_only, launched

#: Defaults that differ from `TrainingArguments`' own: no experiment trackers (the pipeline logs to MLflow
#: itself from `train_log.csv`), a bounded number of checkpoints, frequent logging for loss curves, no check of
#: every step's loss for NaN/inf (the check reads the loss on the host: on a GPU a wait for the device each step;
#: a NaN loss shows in the log instead of being replaced by the running mean). The data loader's are
#: `loader_options`'.
DEFAULTS: dict[str, Any] = {
    "report_to": "none",
    "save_total_limit": 2,
    "logging_steps": 10,
    "save_strategy": "steps",
    "save_steps": 500,
    "seed": 42,
    "disable_tqdm": False,
    "logging_nan_inf_filter": False,
}

#: Loader processes per GPU process, at most (see `loader_options`).
LOADER_WORKERS = 4


def loader_options(gpu: bool) -> dict[str, Any]:
    """The data loader where a GPU trains: batches read and padded by worker processes (persistent, 4 batches ahead
    each) and pinned, so that the device never waits for the host (the padding collator's host time per batch is a large
    share of a GPU step: `python -m benchmarks.gpu_loop`, docs/benchmarks.md). Up to `LOADER_WORKERS` per process on the
    machine (`LOCAL_WORLD_SIZE` under a launcher), one core left to each process. On a CPU the loader stays in the
    training process: workers would take the cores the model computes on."""
    if not gpu:
        return {"dataloader_pin_memory": False}
    procs = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    workers = max(0, min(LOADER_WORKERS, (os.cpu_count() or 1) // procs - 1))
    options: dict[str, Any] = {"dataloader_pin_memory": True, "dataloader_num_workers": workers}
    if workers:
        options.update(dataloader_persistent_workers=True, dataloader_prefetch_factor=4)
    return options


def dataloader_kwargs(device: str | torch.device) -> dict[str, Any]:
    """`loader_options` as `torch.utils.data.DataLoader` arguments, for a loop outside the Trainer (the teacher-logits
    pass) on `device`."""
    gpu = torch.device(device).type == "cuda"
    return {k.removeprefix("dataloader_"): v for k, v in loader_options(gpu).items()}


_FIELDS = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}


class TrainArgsError(ValueError):
    """An unknown or impossible training option."""


def training_arguments(
    output_dir: str | os.PathLike,
    options: Mapping[str, Any] | None = None,
    *,
    select: bool = False,
    **overrides: Any,
) -> TrainingArguments:
    """The `TrainingArguments` of every training loop, built here and nowhere else: the project's `DEFAULTS` and
    precision, then (with ``select``: the loop has a dev set) best-model selection on the dev main score, evaluating
    and saving every epoch, or both every `save_steps` when the caller saves by steps; then `options`, then keyword
    `overrides`. An unknown key raises `TrainArgsError` naming the key, before any training starts.
    """
    chosen = {**(options or {}), **overrides}
    values: dict[str, Any] = {**DEFAULTS, **precision.trainer_options()}
    if select:
        from distillery.training.metrics import MAIN

        values.update({"eval_strategy": "epoch", "save_strategy": "epoch", "load_best_model_at_end": True,
                       "metric_for_best_model": MAIN, "greater_is_better": True})
        if chosen.get("eval_strategy") == "steps" and "save_strategy" not in chosen:
            chosen["save_strategy"] = "steps"
        if chosen.get("save_strategy", values["save_strategy"]) == "steps" and "eval_strategy" not in chosen:
            # a checkpoint every N steps is evaluated too: the best checkpoint is chosen among those saved
            chosen["eval_strategy"] = "steps"
            chosen.setdefault("eval_steps", chosen.get("save_steps", DEFAULTS["save_steps"]))
    values.update(chosen)
    if launched() and cpu_only():
        values.setdefault("use_cpu", True)  # N CPU processes under a launcher: one DDP group (gloo), not N runs
    loader = loader_options(torch.cuda.is_available() and not values.get("use_cpu"))
    if "dataloader_num_workers" in values:  # the caller chose the workers: the rest of the loader is theirs too
        loader = {"dataloader_pin_memory": loader["dataloader_pin_memory"]}
    for key, value in loader.items():
        values.setdefault(key, value)
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise TrainArgsError(f"unknown training option(s) {unknown}; see transformers.TrainingArguments")
    values["output_dir"] = str(output_dir)
    if values.get("eval_strategy", "no") == "no" and values.get("load_best_model_at_end"):
        raise TrainArgsError("load_best_model_at_end=True needs an eval_strategy other than 'no'")
    return TrainingArguments(**values)


def collator_for(tokenizer):
    """Dynamic padding when a tokenizer is known; otherwise examples must already have equal length."""
    return DataCollatorWithPadding(tokenizer) if tokenizer is not None else default_data_collator
