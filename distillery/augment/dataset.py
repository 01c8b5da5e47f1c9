"""Augment a whole training set into a TSV file (TinyBERT Algorithm 1 applied to every example)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Iterable, Mapping

from tqdm.auto import tqdm

from distillery.augment.algorithm import AugmentConfig, Augmenter
from distillery.augment.glove import WordVectors
from distillery.augment.io import write_augmented

__all__ = ["augment_dataset", "augment_file"]


def augment_dataset(
    rows: Iterable[Mapping], task: str | None, mlm_model, tokenizer, vectors: WordVectors | None,
    config: AugmentConfig | None, out_path: str | os.PathLike, *, progress: bool = True,
) -> Path:
    """Augment `rows` (dicts or a `datasets.Dataset` with text_a[, text_b], label, idx) into `out_path`.

    Pair tasks are recognised by a non-null ``text_b`` in the first row. Rows are streamed in chunks and
    the file appears atomically when complete. Returns `out_path`.
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
    write_augmented(augmenter.augment_rows(source, task), out_path, pair=pair)
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
