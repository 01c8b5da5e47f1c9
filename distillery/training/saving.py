"""Final exports and resume points shared by the training loops.

Layout of an `output_dir` written by `train_mlm`, `finetune` or `distill`:

    output_dir/checkpoints/checkpoint-N/   Trainer checkpoints (resume points; may be deleted)
    output_dir/model/                      the final model: config.json, model.safetensors, tokenizer files,
                                           train_log.csv, and for distillation distill_state.safetensors
                                           (projections; never inside model.safetensors)

`output_dir/model` is written atomically (`distillery.io.atomic_dir`): it is complete or absent. Under a
launcher (`distillery.training.distributed`) rank 0 writes it and cleans checkpoints; the other ranks wait.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from distillery.io import atomic_dir, write_json
from distillery.training.distributed import is_main, main_process_first, wait_for_everyone

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CHECKPOINTS = "checkpoints"
MODEL = "model"


def checkpoint_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS


def model_dir(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / MODEL


def checkpoint_complete(path: str | os.PathLike) -> bool:
    """Whether a Trainer checkpoint was written to the end: its state parses, every safetensors file's header
    matches its size, every torch pickle is a whole zip archive. A process killed while saving leaves one that
    is not."""
    import json
    import zipfile

    from safetensors import safe_open

    path = Path(path)
    try:
        json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        for f in path.glob("*.safetensors"):
            with safe_open(str(f), framework="pt"):
                pass
    except Exception:  # OSError, a JSON error, or safetensors' own error on a truncated file
        return False
    return all(zipfile.is_zipfile(f) for f in (*path.glob("*.pt"), *path.glob("*.pth"), *path.glob("*.bin")))


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest complete `checkpoint-N` under `output_dir/checkpoints`, or None (fresh start). Incomplete
    checkpoints newer than it (a kill while saving) are deleted so that the Trainer never resumes or rotates
    into them."""
    import shutil

    ckpt = checkpoint_dir(output_dir)
    with main_process_first():  # rank 0 removes incomplete checkpoints; the others then see what it kept
        from transformers.trainer_utils import get_last_checkpoint  # transformers' Trainer modules load on use

        while ckpt.is_dir() and (newest := get_last_checkpoint(str(ckpt))) is not None:
            if checkpoint_complete(newest):
                return newest
            shutil.rmtree(newest)
    return None


def save_final(
    output_dir: str | os.PathLike,
    model: PreTrainedModel,
    tokenizer=None,
    *,
    metrics: dict | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write `output_dir/model` atomically: `save_pretrained` (safetensors) + tokenizer + `extra(tmp_dir)`. Under a
    launcher, rank 0 writes it and every rank returns once it is written."""
    final = model_dir(output_dir)
    if is_main():
        with atomic_dir(final) as tmp:
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            if metrics is not None:
                write_json(tmp / "metrics.json", metrics)
            if extra is not None:
                extra(tmp)
    wait_for_everyone()
    return final
