"""Final exports and resume points shared by the training loops.

Layout of an `output_dir` written by `train_mlm`, `finetune` or `distill`:

    output_dir/checkpoints/checkpoint-N/   Trainer checkpoints (resume points; may be deleted)
    output_dir/model/                      the final model: config.json, model.safetensors, tokenizer files,
                                           train_log.csv, and for distillation distill_state.safetensors
                                           (projections; never inside model.safetensors)

`output_dir/model` is written atomically (`distillery.io.atomic_dir`): it is complete or absent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from transformers import PreTrainedModel
from transformers.trainer_utils import get_last_checkpoint

from distillery.io import atomic_dir, write_json

CHECKPOINTS = "checkpoints"
MODEL = "model"


def checkpoint_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS


def model_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / MODEL


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest `checkpoint-N` under `output_dir/checkpoints`, or None (fresh start)."""
    ckpt = checkpoint_dir(output_dir)
    if not ckpt.is_dir():
        return None
    return get_last_checkpoint(str(ckpt))


def save_final(
    output_dir: str | os.PathLike,
    model: PreTrainedModel,
    tokenizer=None,
    *,
    metrics: dict | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write `output_dir/model` atomically: `save_pretrained` (safetensors) + tokenizer + `extra(tmp_dir)`."""
    final = model_dir(output_dir)
    with atomic_dir(final) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if metrics is not None:
            write_json(tmp / "metrics.json", metrics)
        if extra is not None:
            extra(tmp)
    return final
