"""Teacher-logits cache for prediction-layer distillation (TinyBERT step 2, eq. 10).

The teacher (eval mode, no dropout, no gradients) is run ONCE per example; its logits are stored in
`<cache_dir>/teacher_logits-<fingerprint>.safetensors` keyed by example index, where the fingerprint covers
the teacher (config + weights) and the dataset's model inputs. The logits are attached as a `teacher_logits`
column that `DistillationTrainer` reads instead of running the teacher, across epochs and across the whole
learning-rate x batch-size grid. (Valid only for an eval-mode teacher: the official train-mode teacher's
dropout makes its logits change per epoch.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import datasets
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import DataCollatorWithPadding, PreTrainedModel, default_data_collator

from distillery import precision
from distillery.io import atomic_path
from distillery.training import cpu_kernels, unpadding
from distillery.training.args import dataloader_kwargs

INPUT_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")
COLUMN = "teacher_logits"


def teacher_fingerprint(teacher: PreTrainedModel) -> str:
    """SHA-256 of the teacher's config (less the directory it was loaded from: a moved project keeps its cache) and
    every parameter/buffer (name, dtype, shape, bytes)."""
    h = hashlib.sha256()
    config = json.loads(teacher.config.to_json_string(use_diff=False))
    config.pop("_name_or_path", None)
    h.update(json.dumps(config, sort_keys=True).encode())
    for name, tensor in sorted(teacher.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def dataset_fingerprint(dataset: datasets.Dataset, columns=INPUT_COLUMNS) -> str:
    """SHA-256 of the model-input columns present (ids and masks, row by row) and the example indices."""
    cols = [c for c in columns if c in dataset.column_names]
    if "input_ids" not in cols:
        raise KeyError(f"dataset has no 'input_ids' column (columns: {dataset.column_names})")
    h = hashlib.sha256(json.dumps(cols).encode())
    for batch in dataset.select_columns(cols + (["idx"] if "idx" in dataset.column_names else [])).iter(4096):
        for c in sorted(batch):
            for row in batch[c]:
                arr = np.asarray(row, dtype=np.int64)
                h.update(np.int64(arr.size).tobytes())
                h.update(arr.tobytes())
    return h.hexdigest()


def example_index(dataset: datasets.Dataset) -> torch.Tensor:
    """The key of each row: its `idx` column when present, else its position."""
    if "idx" in dataset.column_names:
        return torch.tensor(dataset["idx"], dtype=torch.int64)
    return torch.arange(len(dataset), dtype=torch.int64)


@torch.no_grad()
def compute_teacher_logits(
    teacher: PreTrainedModel,
    dataset: datasets.Dataset,
    *,
    batch_size: int = 64,
    tokenizer=None,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> torch.Tensor:
    """Teacher logits (N, C) in dataset order: one eval-mode, no-grad forward per example, at the precision in force
    (`distillery.precision`). The global random state is left as it was (a loader draws from it): a student built
    after it starts alike whether the logits were computed, read from the cache or given (`teacher_predictions`)."""
    was_training = teacher.training
    teacher.eval()
    device = torch.device(device) if device is not None else next(teacher.parameters()).device
    keys = [c for c in INPUT_COLUMNS if c in dataset.column_names]
    import inspect

    accepted = set(inspect.signature(teacher.forward).parameters)
    keys = [k for k in keys if k in accepted]
    collate = DataCollatorWithPadding(tokenizer) if tokenizer is not None else default_data_collator
    loader = DataLoader(dataset.select_columns(keys), batch_size=batch_size, shuffle=False, collate_fn=collate,
                        **dataloader_kwargs(device))
    out = []
    try:
        with precision.forwards(teacher, device), cpu_kernels.used(teacher, device), \
                unpadding.inferring(teacher, device), \
                torch.random.fork_rng(devices=[]):
            for batch in tqdm(loader, desc="teacher logits", disable=not progress):
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k in accepted}
                out.append(teacher(**batch).logits.float())  # on the device: no wait for it each batch
    finally:
        teacher.train(was_training)
    return torch.cat(out).cpu() if out else torch.empty(0)


def cache_teacher_logits(
    teacher: PreTrainedModel,
    dataset: datasets.Dataset,
    cache_dir: str | os.PathLike,
    *,
    batch_size: int = 64,
    tokenizer=None,
    teacher_id: str | None = None,
    progress: bool = True,
) -> datasets.Dataset:
    """Return `dataset` with a `teacher_logits` column, computing the logits only when not cached yet.

    `teacher_id` replaces the weight hash in the fingerprint when the caller already has a content key for
    the teacher (e.g. a DVC hash of its directory). A cache file whose example keys do not match the dataset
    raises ValueError naming the file.
    """
    tid = teacher_id if teacher_id is not None else teacher_fingerprint(teacher)
    computed_in = precision.current(next(teacher.parameters()).device)  # bf16 logits are other logits
    key = hashlib.sha256(f"{tid}:{dataset_fingerprint(dataset)}:{computed_in}".encode()).hexdigest()[:24]
    path = Path(cache_dir) / f"teacher_logits-{key}.safetensors"
    index = example_index(dataset)
    if path.is_file():
        stored = load_file(str(path))
        if not torch.equal(stored["idx"], index):
            raise ValueError(f"{path}: cached example indices do not match the dataset (stale or foreign cache)")
        logits = stored["logits"]
    else:
        logits = compute_teacher_logits(teacher, dataset, batch_size=batch_size, tokenizer=tokenizer, progress=progress)
        with atomic_path(path) as tmp:
            save_file({"logits": logits.contiguous(), "idx": index}, str(tmp), metadata={"fingerprint": key})
    return with_logits(dataset, logits.tolist())


def with_logits(dataset: datasets.Dataset, logits: list) -> datasets.Dataset:
    """`dataset` with its ``teacher_logits`` column (row by row, in its order) set to `logits`."""
    if COLUMN in dataset.column_names:
        dataset = dataset.remove_columns(COLUMN)
    return dataset.add_column(COLUMN, logits)
