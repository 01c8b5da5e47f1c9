"""Unlabelled in-domain text as distillation data (``data.unlabeled``).

The prepared task gets an ``unlabeled`` split beside ``train`` and ``dev``: rows in the GLUE loaders' columns whose
label is `distillery.glue.loaders.unlabeled_value` (-1 for classes, NaN for a regression score). The teacher labels
them where a distillation step reads soft targets (its logits, cached by content: `distillery.training.logits_cache`);
a loss that needs the gold label sees the labelled rows only (`distillery.objectives._common.gold_rows`);
fine-tuning and the direct baseline never read them.

* ``rest``: the training rows that ``data.max_train_examples`` leaves out (the same seeded shuffle that picks the
  subset; they keep their own ``idx``);
* a file (CSV, TSV, JSON Lines, Parquet, read as a task of your own is): its text columns only, those of the task of
  your own (``text``, ``text_pair``) or else ``text`` (and ``text_pair`` for a pair task); ``idx`` is -(row number), so
  that no unlabelled row shares a key with a training row.

``max_unlabeled_examples`` keeps the first rows of either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distillery.errors import UserError

SPLIT = "unlabeled"


class UnlabeledError(UserError, ValueError):
    """Unlabelled rows that cannot be used; the message names the params key, or the file and line."""


def rest_rows(train, task: str, n: int | None, seed: int, cap: int | None, key: str = "data.unlabeled"):
    """The training rows of `task` that a seeded subset of `n` leaves out (`tasks.data` picks the subset with the
    same shuffle), labels removed, at most `cap`."""
    if n is None or len(train) <= n:
        raise UnlabeledError(f"{key}: rest: the training split has {len(train)} rows and max_train_examples keeps "
                             f"{n if n is not None else 'all'} of them: no row is left; lower max_train_examples, "
                             "or give a file")
    rest = train.shuffle(seed=seed).select(range(n, len(train)))
    if cap is not None:
        rest = rest.select(range(min(cap, len(rest))))
    from distillery.glue.loaders import unlabeled_value
    from distillery.glue.tasks import get_task

    marker = [unlabeled_value(get_task(task))] * len(rest)
    return rest.remove_columns("label").add_column("label", marker).cast(rest.features)


def read_file(path: Path, task: str, custom: Any | None, cap: int | None):
    """The text rows of a file of unlabelled text for `task` (`custom`: its `data.custom` section, whose text columns
    the file has), checked whole: one `UnlabeledError` naming the file and line for a missing column or an empty
    text."""
    from distillery.custom_tasks import _records
    from distillery.glue.loaders import _rows_to_dataset, unlabeled_value
    from distillery.glue.tasks import get_task

    spec = get_task(task)
    text = custom.text if custom is not None else "text"
    pair = (custom.text_pair if custom is not None else "text_pair") if spec.is_pair else None
    columns = [("text_a", text)] + ([("text_b", pair)] if pair else [])
    out: dict[str, list] = {"text_a": [], "label": [], "idx": [], **({"text_b": []} if pair else {})}
    for i, (where, row) in enumerate(_records(path)):
        if cap is not None and i >= cap:
            break
        for name, col in columns:
            value = row.get(col)
            if col not in row:
                raise UnlabeledError(f"{where}: no column {col!r} (the unlabelled rows of {task} need "
                                     f"{' and '.join(repr(c) for _, c in columns)}); the columns are "
                                     f"{', '.join(map(repr, row))}")
            if not isinstance(value, str) or not value.strip():
                raise UnlabeledError(f"{where}: column {col!r} holds {value!r}, not a text")
            out[name].append(value)
        out["label"].append(unlabeled_value(spec))
        out["idx"].append(-(i + 1))
    if not out["idx"]:
        raise UnlabeledError(f"{path}: no rows")
    return _rows_to_dataset(spec, out)
