"""Augment a whole training set into a TSV file (TinyBERT Algorithm 1 applied to every example)."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path
from typing import Iterable, Mapping

from tqdm.auto import tqdm

from distillery.augment.algorithm import AugmentConfig, Augmenter
from distillery.augment.glove import WordVectors
from distillery.augment.io import write_augmented
from distillery.io import atomic_path
from distillery.training.distributed import is_main, rank, wait_for_everyone, world_size

__all__ = ["augment_dataset", "augment_file"]


def augment_dataset(
    rows: Iterable[Mapping], task: str | None, mlm_model, tokenizer, vectors: WordVectors | None,
    config: AugmentConfig | None, out_path: str | os.PathLike, *, progress: bool = True,
    shards: str | os.PathLike | None = None,
) -> Path:
    """Augment `rows` (dicts or a `datasets.Dataset` with text_a[, text_b], label, idx) into `out_path`.

    Pair tasks are recognised by a non-null ``text_b`` in the first row. Rows are streamed in chunks and
    the file appears atomically when complete. With `shards` (a directory), every ``config.chunk_size`` examples
    are written there as a shard file (atomically) as they complete, and shards already there are reused, not
    recomputed: an interrupted run resumes at its first missing shard. The caller guarantees that the shards were
    made from the same rows, models and config (the pipeline: the stage key); they are removed at the end.
    Each sentence draws from its own generator (`sentence_rng`), so the output does not depend on the sharding.
    Under a launcher (torchrun) with `shards`, rank r of N augments shards r, r + N, ... and rank 0 joins them
    (without `shards`, rank 0 augments alone); every rank returns once the file is written. Returns `out_path`.
    """
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        raise ValueError(f"augment: no examples to augment for {out_path}")
    pair = first.get("text_b") is not None
    total = len(rows) if hasattr(rows, "__len__") else None
    augmenter = Augmenter(mlm_model, tokenizer, vectors, config or AugmentConfig())
    source = itertools.chain([first], iterator)
    if progress:
        source = tqdm(source, total=total, desc=f"augment {task or ''}".strip(), unit="ex")
    if shards is None:
        if is_main():
            write_augmented(augmenter.augment_rows(source, task), out_path, pair=pair)
        wait_for_everyone()
        return Path(out_path)
    shards, size, parts, n, r = Path(shards), augmenter.config.chunk_size, [], world_size(), rank()
    while chunk := list(itertools.islice(source, size)):
        part = shards / f"part-{len(parts):06d}.tsv"
        if len(parts) % n == r and not part.is_file():
            write_augmented(augmenter.augment_rows(chunk, task, start=len(parts) * size), part, pair=pair)
        parts.append(part)
    wait_for_everyone()
    if is_main():
        with atomic_path(out_path) as tmp, open(tmp, "wb") as out:
            for i, part in enumerate(parts):
                with open(part, "rb") as f:
                    if i:
                        f.readline()  # the header, written once
                    shutil.copyfileobj(f, out)
        shutil.rmtree(shards, ignore_errors=True)
    wait_for_everyone()
    return Path(out_path)


def augment_file(
    task: str, input_path: str | os.PathLike, mlm_model, tokenizer, vectors: WordVectors | None,
    config: AugmentConfig | None, out_path: str | os.PathLike, *, max_examples: int | None = None,
    progress: bool = True,
) -> Path:
    """Augment one GLUE split file of `task` (read with `distillery.glue.load_split_file`)."""
    from distillery.glue.loaders import load_split_file

    ds = load_split_file(task, input_path)
    if max_examples is not None:
        ds = ds.select(range(min(max_examples, len(ds))))
    return augment_dataset(ds, task, mlm_model, tokenizer, vectors, config, out_path, progress=progress)
