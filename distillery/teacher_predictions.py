"""A teacher known only by its predictions (``teacher.predictions.<task>``): a file of per-row class probabilities,
logits or regression scores, e.g. from a large model or an LLM you can only query.

The file (CSV, TSV, JSON Lines or Parquet, read as a task of your own is) has one row per text and:

* its key: ``text`` (and ``text_pair`` for a pair task), the row's text exactly; or ``split`` (``train``, ``dev``,
  ``unlabeled``) and ``idx``, the prepared task's row id;
* its values: a column per label name of the task (e.g. ``0`` and ``1`` for SST-2), holding probabilities that sum to
  1 (``values: probabilities``) or logits (``values: logits``); a regression task: ``score``.

Every training, unlabelled and dev row of the task must have one; rows of other texts are ignored, and a text given
twice with different values is refused. Probabilities become logits as their logarithm (softmax gives them back), so
every prediction-level objective reads them as it reads a runnable teacher's logits
(`distillery.training.logits_cache`'s ``teacher_logits`` column). The teacher's dev score is computed from the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from distillery.errors import UserError

#: how far from 1 a row of probabilities may sum
TOLERANCE = 1e-3
#: the training rows' soft targets in a predicted teacher's directory (no model weights beside them)
SOFT_TARGETS = "soft_targets.safetensors"
#: an ensemble's members and their dev metrics, beside its soft targets
MEMBERS = "members.json"
SPLITS = ("train", "dev", "unlabeled")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_LOG_TINY = float(np.log(np.finfo(np.float32).tiny))  # the logit of a probability of 0


class PredictionsError(UserError, ValueError):
    """A predictions file that cannot be read as the task's teacher; the message names the key and the file and line."""


@dataclass(frozen=True)
class Predictions:
    """A predictions file read whole: key -> logits (C,) or score (1,), float32, and where each key was read."""

    path: Path
    by_key: dict[tuple, np.ndarray]
    lines: dict[tuple, str]
    keyed_by: Literal["text", "idx"]
    key: str  # the params key, for messages


def value_columns(spec) -> list[str]:
    """The columns holding a row's values: the task's label names, or ``score`` for regression."""
    return ["score"] if spec.is_regression else [str(label) for label in spec.labels]


def read(path: Path, spec, values: Literal["probabilities", "logits"] = "probabilities",
         key: str = "teacher.predictions") -> Predictions:
    """Read and check the file whole for the task `spec` (`distillery.glue.TaskSpec`): one `PredictionsError` naming
    `key`, the file and line for a missing column, a value that is not a finite number a float32 holds, probabilities
    outside [0, 1] or not summing to 1, or a key given twice with different values."""
    from distillery.custom_tasks import _records

    columns = value_columns(spec)
    by_key: dict[tuple, np.ndarray] = {}
    lines: dict[tuple, str] = {}
    keyed_by = None
    try:
        for where, row in _records(Path(path)):
            if keyed_by is None:
                keyed_by = "idx" if "idx" in row else "text"
            k = _row_key(row, keyed_by, spec, where, key)
            missing = [c for c in columns if c not in row]
            if missing:
                raise PredictionsError(f"{key}: {where}: no column {missing[0]!r}; the file needs "
                                       f"{', '.join(map(repr, columns))} ({_what(spec, values)}), its columns are "
                                       f"{', '.join(map(repr, row))}")
            v = np.array([_number(row[c], where, c, key) for c in columns], dtype=np.float64)
            out = _as_logits(v, spec, values, where, key)
            if k in by_key and not np.array_equal(by_key[k], out):
                raise PredictionsError(f"{key}: {where}: {_describe(k)} has other values at {lines[k]}; give each row "
                                       "one prediction")
            by_key.setdefault(k, out)
            lines.setdefault(k, where)
    except PredictionsError:
        raise
    except UserError as exc:  # the reader's own one line (format, encoding, quoting), under this key
        raise PredictionsError(f"{key}: {exc}") from None
    if not by_key:
        raise PredictionsError(f"{key}: {path}: no rows")
    return Predictions(Path(path), by_key, lines, keyed_by, key)


def _what(spec, values: str) -> str:
    return "its regression score" if spec.is_regression else f"a row's {values} per label name"


def _row_key(row: dict[str, Any], keyed_by: str, spec, where: str, key: str) -> tuple:
    if keyed_by == "idx":
        split, idx = row.get("split"), row.get("idx")
        if split not in SPLITS:
            raise PredictionsError(f"{key}: {where}: split {split!r}: a file keyed by idx names each row's split, one "
                                   f"of {', '.join(SPLITS)}")
        try:
            number = float(idx)
        except (TypeError, ValueError):
            number = math.nan
        if not number.is_integer():
            raise PredictionsError(f"{key}: {where}: idx {idx!r} is not a row id (an integer)")
        return ("idx", split, int(number))
    cols = ["text"] + (["text_pair"] if spec.is_pair else [])
    for c in cols:
        if not isinstance(row.get(c), str):
            raise PredictionsError(f"{key}: {where}: no text in column {c!r}; key each row by "
                                   f"{' and '.join(map(repr, cols))} (the row's text), or by 'split' and 'idx'")
    return ("text", *(row[c] for c in cols))


def _number(value: Any, where: str, column: str, key: str) -> float:
    try:
        x = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or abs(x) > _FLOAT32_MAX:
        raise PredictionsError(f"{key}: {where}: column {column!r} holds {value!r}, not a finite number a float32 holds")
    return x


def _as_logits(v: np.ndarray, spec, values: str, where: str, key: str) -> np.ndarray:
    if spec.is_regression or values == "logits":
        return v.astype(np.float32)
    if (v < 0).any() or (v > 1).any() or abs(v.sum() - 1) > TOLERANCE:
        raise PredictionsError(f"{key}: {where}: probabilities {v.tolist()} are not in [0, 1] summing to 1 (within "
                               f"{TOLERANCE:g}); give probabilities, or logits with values: logits")
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(v), _LOG_TINY).astype(np.float32)


def _describe(k: tuple) -> str:
    if k[0] == "idx":
        return f"the {k[1]} row idx {k[2]}"
    return "the text " + " / ".join(repr(t[:60]) for t in k[1:])


def logits_for(predictions: Predictions, rows, split: str) -> np.ndarray:
    """The predictions of the prepared `rows` (a `datasets.Dataset` with ``text_a`` [, ``text_b``] and ``idx``) of
    `split`, in their order, (N, C) float32; one `PredictionsError` naming the first row the file does not cover and
    how many it misses."""
    if predictions.keyed_by == "idx":
        keys = [("idx", split, int(i)) for i in rows["idx"][:]]
    else:
        pair = "text_b" in rows.column_names
        texts = zip(rows["text_a"][:], rows["text_b"][:]) if pair else ((t,) for t in rows["text_a"][:])
        keys = [("text", *t) for t in texts]
    missing = [i for i, k in enumerate(keys) if k not in predictions.by_key]
    if missing:
        first = keys[missing[0]]
        raise PredictionsError(f"{predictions.key}: {predictions.path}: no prediction for the {split} row "
                               f"{int(rows['idx'][missing[0]])} ({_describe(first)}); {len(missing)} of the task's "
                               f"{len(keys)} {split} rows have none: the file covers every training, unlabelled and "
                               "dev row")
    out = np.stack([predictions.by_key[k] for k in keys]) if keys else np.zeros((0, 1), np.float32)
    return out.astype(np.float32)


def save_soft_targets(directory: Path, idx: np.ndarray, logits: np.ndarray, meta: dict[str, str]) -> None:
    """The training rows' soft targets (keyed by their ``idx``) in a predicted teacher's directory."""
    import torch
    from safetensors.torch import save_file

    if len(set(idx.tolist())) != len(idx):
        raise ValueError("soft targets need distinct row ids")
    save_file({"idx": torch.from_numpy(np.asarray(idx, dtype=np.int64)),
               "logits": torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))},
              str(Path(directory) / SOFT_TARGETS), metadata=meta)


def is_predicted(directory: Path) -> bool:
    """Whether a teacher directory holds a teacher's predictions (`SOFT_TARGETS`) instead of a model."""
    return (Path(directory) / SOFT_TARGETS).is_file() and not (Path(directory) / "config.json").is_file()


def load_soft_targets(directory: Path) -> dict[int, Any]:
    """idx -> logits (a float32 tensor) of a predicted teacher's training rows."""
    from safetensors.torch import load_file

    stored = load_file(str(Path(directory) / SOFT_TARGETS))
    return dict(zip(stored["idx"].tolist(), stored["logits"]))


def with_soft_targets(train, targets: dict[int, Any]):
    """`train` (encoded, with ``idx``) with the ``teacher_logits`` column a runnable teacher's cache would give it."""
    from distillery.training.logits_cache import with_logits

    if "idx" not in train.column_names:
        raise ValueError("the training rows need their idx to find their soft targets")
    missing = [i for i in train["idx"][:] if i not in targets]
    if missing:
        raise ValueError(f"no soft target for training row {missing[0]} ({len(missing)} rows): the teacher's "
                         "predictions were read for other rows (re-run the teacher stage)")
    return with_logits(train, [targets[i].tolist() for i in train["idx"][:]])


# ------------------------------------------------------------------------------------------------ writing one

def write(model_dir: Path, task: str, data, out: Path, max_length: int,
          values: Literal["probabilities", "logits"] = "probabilities") -> int:
    """A saved classifier's predictions of every row of the prepared task `data` (train, unlabelled, dev) as a JSON
    Lines file keyed by split and idx, in the format `read` reads; the number of rows written. Its logits are those the
    pipeline's logits cache computes (`distillery.training.logits_cache.compute_teacher_logits`)."""
    import json

    import torch

    from distillery.glue.tasks import get_task
    from distillery.io import atomic_path

    spec = get_task(task)
    columns = value_columns(spec)
    n = 0
    with atomic_path(Path(out)) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for split, logits in model_logits(model_dir, task, data, max_length).items():
            if values == "probabilities" and not spec.is_regression:
                logits = torch.softmax(logits.double(), -1)
            for idx, row in zip(data[split]["idx"][:], logits.tolist()):
                f.write(json.dumps({"split": split, "idx": int(idx), **dict(zip(columns, row))}) + "\n")
                n += 1
    return n


def model_logits(model_dir: Path, task: str, data, max_length: int) -> dict[str, Any]:
    """split -> (N, C) logits of a saved classifier on every row of the prepared task `data` (train, unlabelled, dev),
    each text tokenised by the model's own tokenizer, as the pipeline's logits cache computes them."""
    import datasets
    from transformers import AutoTokenizer

    from distillery.models import load_model
    from distillery.task_kinds import task_kind
    from distillery.training.logits_cache import compute_teacher_logits

    kind = task_kind(task)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_model(model_dir, head=kind.head)
    out = {}
    for split in (s for s in SPLITS if s in data):
        encoded = kind.encode(datasets.DatasetDict({split: data[split]}), tokenizer, max_length)[split]
        out[split] = compute_teacher_logits(model, encoded, tokenizer=tokenizer, progress=False)
    return out


def mean(members: list[tuple[dict[str, Any], float]], spec) -> dict[str, np.ndarray]:
    """An ensemble's logits per split from its members' (split -> (N, C) logits, weight): the log of the weighted mean
    of their probabilities (regression: the weighted mean of their scores)."""
    import torch

    total = sum(w for _, w in members)
    out = {}
    for split in members[0][0]:
        parts = [torch.as_tensor(np.asarray(logits[split]), dtype=torch.float64) for logits, _ in members]
        if spec.is_regression:
            out[split] = (sum(w * x for x, (_, w) in zip(parts, members)) / total).float().numpy()
        else:
            probs = sum(w * torch.softmax(x, -1) for x, (_, w) in zip(parts, members)) / total
            out[split] = probs.log().clamp_min(_LOG_TINY).float().numpy()
    return out
