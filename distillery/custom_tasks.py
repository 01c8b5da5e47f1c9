"""Tasks of your own: a labelled dataset from files (CSV, TSV, JSON Lines, Parquet) or from the Hugging Face Hub,
described under ``data.custom`` in params and listed in ``data.tasks`` beside the GLUE tasks.

A task of your own becomes a `distillery.glue.TaskSpec` (`register_tasks`), so every stage treats it as a GLUE task:
the trivial baseline and the teacher gate, augmentation, every recipe, the direct baselines, evaluation, the
report, the registry. Its prepared splits have the GLUE loaders' columns (`distillery.glue.loaders`):

    text_a, text_b (pair tasks), label (the label's id in `labels` order; a float for regression), idx

`idx` is the 0-based row of the file (test predictions are written against it). The label order is `labels` when
given, else the sorted labels of the training split (numerically when they are all integers); a Hub ClassLabel
keeps its own names and order. A split is read once and checked whole; the first problem is one `UserError` naming
the file and line (the Hub split and row): a missing column, an empty text, a missing label, a label the task does
not have, a regression label that is not a number.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Iterator, Mapping

import datasets

from distillery.errors import InputNotFoundError, UserError
from distillery.io import hub_dataset, hub_offline, resolve_path

#: formats of a task of your own, by file extension (.json is JSON Lines, as .jsonl)
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
#: our split name -> the prepared dataset's (the GLUE loaders' names)
SPLIT_NAMES = {"train": "train", "validation": "dev", "test": "test"}


class CustomTaskError(UserError, ValueError):
    """A file or Hub split of a task of your own that cannot be used; the message names it (and the line)."""


#: what each registered task of your own was registered from: a load of the same params keeps its spec
_REGISTERED: dict[str, tuple[Any, Path]] = {}


def register_tasks(custom: Mapping[str, Any], root: Path) -> None:
    """Register every task of ``data.custom`` (name -> `CustomTaskSection`); relative paths start at `root`. The
    spec is made when a stage first asks for it (it may read the training labels), once per description."""
    from distillery.glue.tasks import register_task

    for name, cfg in custom.items():
        if _REGISTERED.get(name) != (cfg, root):
            register_task(name, lambda name=name, cfg=cfg: task_spec(name, cfg, root))
            _REGISTERED[name] = (cfg, root)


def task_spec(name: str, cfg: Any, root: Path):
    """The `TaskSpec` of a task of your own: its label order, pair or single text, metric and main score."""
    from distillery.glue.tasks import TaskSpec

    regression = cfg.type == "regression"
    try:
        labels: tuple[str, ...] = () if regression else tuple(cfg.labels or training_labels(cfg, root))
    except InputNotFoundError as exc:  # the label order is read from the training split: say which key names it
        raise InputNotFoundError(f"data.custom.{name}.train: {exc}") from None
    if not regression and len(labels) < 2:
        raise CustomTaskError(f"data.custom.{name}: the training split has {len(labels)} distinct label(s) "
                              f"({', '.join(labels)}); a classification task needs two or more")
    main = cfg.main_metric
    if main == "f1" and len(labels) != 2:
        raise CustomTaskError(f"data.custom.{name}.metric: f1 is the binary F1 and this task has {len(labels)} labels "
                              f"({', '.join(labels)}); use macro_f1")
    metrics = ("pearson", "spearman") if main == "pearson_spearman" else tuple(dict.fromkeys(
        (main,) if regression else ("accuracy", main)))
    text = (cfg.text,) + ((cfg.text_pair,) if cfg.text_pair else ())
    return TaskSpec(name=name, glue_name=name, dirname=name, files={}, text_columns=text, label_column=cfg.label,
                    labels=labels, metrics=metrics, main_metric=main, selection_task=name)


# ------------------------------------------------------------------------------------------------ reading

def _records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) of every row of a file: `path:line` for text formats, `path: row n` for Parquet."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise CustomTaskError(f"{path}: unknown extension; use one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise InputNotFoundError(f"{path}: file not found")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            raise CustomTaskError(f"{path}: not a Parquet file ({exc})") from None
        for i, row in enumerate(table.to_pylist()):
            yield f"{path}: row {i + 1}", row
        return
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise CustomTaskError(f"{path}:{line}: byte 0x{exc.object[exc.start]:02x} is not UTF-8; re-save it as UTF-8")\
            from None
    if fmt == "jsonl":
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CustomTaskError(f"{path}:{n}: not a JSON object ({exc.msg}); the file is JSON Lines: one object "
                                      "per line") from None
            if not isinstance(row, dict):
                raise CustomTaskError(f"{path}:{n}: a JSON {type(row).__name__}, not an object")
            yield f"{path}:{n}", row
        return
    # TSV is read literally (a quote is a character, as in GLUE's files); CSV's quotes must close on their own line
    tsv = fmt == "tsv"
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if tsv else ",",
                            quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
    try:
        header = reader.fieldnames or []
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:
            raise CustomTaskError(f"{path}:1: column {twice[0]!r} appears {header.count(twice[0])} times in the header; "
                                  "name each column once")
        last = reader.line_num
        for row in reader:
            start, last = last + 1, reader.line_num
            if last > start:
                raise CustomTaskError(f"{path}:{start}: a quoted field runs over lines {start}-{last} (a stray '\"' "
                                      "opening a field?); close each quote on its line, or give the file as .jsonl")
            if None in row:
                raise CustomTaskError(f"{path}:{reader.line_num}: more fields than the header's {len(reader.fieldnames)}")
            yield f"{path}:{reader.line_num}", row
    except csv.Error as exc:
        raise CustomTaskError(f"{path}:{reader.line_num}: {exc}") from None


def _columns_check(source: str, row: Mapping[str, Any], cfg: Any, name: str, labelled: bool) -> None:
    wanted = [("text", cfg.text)] + ([("text_pair", cfg.text_pair)] if cfg.text_pair else []) + \
             ([("label", cfg.label)] if labelled else [])
    for key, col in wanted:
        if col not in row:
            raise CustomTaskError(f"{source}: no column {col!r} (data.custom.{name}.{key}); the columns are "
                                  f"{', '.join(map(repr, row))}")


def _label_text(value: Any, where: str = "") -> str | None:
    """A label cell as text; None when missing (empty, null, NaN); a list, mapping or other non-scalar is refused."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if not isinstance(value, (str, int, float, bool)):
        raise CustomTaskError(f"{where}: label {value!r} is a {type(value).__name__}, not one value (a class name or "
                              "a number)")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:  # 1.0 from JSON or Parquet is 1
        value = int(value)
    text = str(value).strip()
    return text or None


def _rows(source: str, records: Iterator[tuple[str, dict]], cfg: Any, name: str, split: str) -> list[tuple[str, dict]]:
    out = []
    for where, row in records:
        if not out:
            _columns_check(source, row, cfg, name, labelled=split != "test" or cfg.label in row)
        out.append((where, row))
    if not out:
        raise CustomTaskError(f"{source}: the {split} split of {name} has no rows")
    return out


def _split_records(cfg: Any, split: str, root: Path) -> tuple[str, Iterator[tuple[str, dict]], list[str] | None]:
    """(what it is, its rows, the Hub's label names when the label column is a ClassLabel)."""
    if cfg.hub:
        return _hub_records(cfg, split)
    path = resolve_path(getattr(cfg, split), root)
    return str(path), _records(path), None


def _hub_records(cfg: Any, split: str) -> tuple[str, Iterator[tuple[str, dict]], list[str] | None]:
    hub_split = cfg.splits[split]
    where = f"{cfg.hub}{'/' + cfg.config if cfg.config else ''}[{hub_split}]"
    try:
        ds = datasets.load_dataset(hub_dataset(cfg.hub), cfg.config, split=hub_split)
    except ValueError as exc:  # an unknown split
        raise CustomTaskError(f"{where}: {exc}") from None
    except (FileNotFoundError, ConnectionError, OSError) as exc:
        hint = (" (the Hub is offline here: HF_HUB_OFFLINE; run once with HF_HUB_OFFLINE=0 to download it)"
                if hub_offline() else "")
        raise CustomTaskError(f"{where}: the Hub dataset cannot be loaded{hint}: {exc}") from None
    feature = ds.features.get(cfg.label)
    names = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None

    def rows() -> Iterator[tuple[str, dict]]:
        for i, row in enumerate(ds):
            if names is not None and isinstance(row.get(cfg.label), int) and row[cfg.label] >= 0:
                row = {**row, cfg.label: names[row[cfg.label]]}
            yield f"{where} row {i + 1}", row

    return where, rows(), names


def training_labels(cfg: Any, root: Path) -> list[str]:
    """The label order when params give none: a Hub ClassLabel's names, else the distinct labels of the training
    split, sorted (as numbers when they all are integers)."""
    source, records, names = _split_records(cfg, "train", root)
    if names is not None:
        return names
    first: dict[str, str] = {}
    for where, row in records:
        if (text := _label_text(row.get(cfg.label), where)) is not None:
            first.setdefault(text, where)
    seen = set(first)
    by_number: dict[float, str] = {}
    for text in sorted(seen, key=lambda t: first[t]):
        if (number := _number(text)) is None:
            continue
        if number in by_number:  # 1 and 1.0: one class or two? the file must say it one way
            raise CustomTaskError(f"{first[text]}: label {text!r} is label {by_number[number]!r} "
                                  f"({first[by_number[number]]}) spelled another way; spell each label one way")
        by_number[number] = text
    if all(t.lstrip("-").isdigit() for t in seen):
        return sorted(seen, key=int)
    return sorted(seen)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


#: the largest magnitude a float32 label column holds (the datasets' and the models' dtype)
FLOAT32_MAX = 3.4028234663852886e38


def load_split(name: str, cfg: Any, split: str, root: Path) -> datasets.Dataset:
    """One split (`train`, `validation`, `test`) of a task of your own in the GLUE loaders' columns, checked whole."""
    from distillery.glue.loaders import _rows_to_dataset, unlabeled_value
    from distillery.glue.tasks import get_task

    spec = get_task(name)
    source, records, _ = _split_records(cfg, split, root)
    rows = _rows(source, records, cfg, name, split)
    labelled = split != "test" or cfg.label in rows[0][1]
    ids = spec.label2id
    out: dict[str, list] = {"text_a": [], "label": [], "idx": []}
    if spec.is_pair:
        out["text_b"] = []
    columns = [("text_a", cfg.text)] + ([("text_b", cfg.text_pair)] if spec.is_pair else [])
    for i, (where, row) in enumerate(rows):
        for key, col in columns:
            value = row.get(col)
            if value is None or (isinstance(value, str) and not value.strip()):
                raise CustomTaskError(f"{where}: an empty text in column {col!r}")
            if not isinstance(value, str):
                raise CustomTaskError(f"{where}: column {col!r} holds {value!r}, not a text")
            out[key].append(value)
        out["idx"].append(i)
        if not labelled:
            out["label"].append(unlabeled_value(spec))
            continue
        label = _label_text(row.get(cfg.label), where)
        if label is None:
            if split == "test":
                out["label"].append(unlabeled_value(spec))
                continue
            raise CustomTaskError(f"{where}: no label in column {cfg.label!r}")
        if spec.is_regression:
            try:
                value = float(label)
            except ValueError:
                raise CustomTaskError(f"{where}: label {label!r} is not a number (data.custom.{name}.type: "
                                      "regression)") from None
            if not math.isfinite(value):
                raise CustomTaskError(f"{where}: label {label!r} is not a finite number")
            if abs(value) > FLOAT32_MAX:
                raise CustomTaskError(f"{where}: label {label!r} is beyond what a float32 holds (|x| <= 3.4e38); "
                                      "rescale the targets")
            out["label"].append(value)
        elif label in ids:
            out["label"].append(ids[label])
        elif (number := _number(label)) is not None and (same := [k for k in ids if _number(k) == number]):
            raise CustomTaskError(f"{where}: label {label!r} is label {same[0]!r} spelled another way; spell each "
                                  "label one way")
        else:
            origin = f"data.custom.{name}.labels" if cfg.labels else "the labels of the training split"
            raise CustomTaskError(f"{where}: label {label!r} is not one of {list(spec.labels)} ({origin})")
    return _rows_to_dataset(spec, out)


def load(name: str, cfg: Any, root: Path) -> datasets.DatasetDict:
    """Every split of a task of your own: {"train", "dev"[, "test"]} (the GLUE loaders' split names)."""
    splits = [s for s in SPLIT_NAMES if (cfg.splits.get(s) if cfg.hub else getattr(cfg, s)) is not None]
    return datasets.DatasetDict({SPLIT_NAMES[s]: load_split(name, cfg, s, root) for s in splits})


def inputs(cfg: Any, root: Path) -> list[Path]:
    """The files of a task of your own (its stage's inputs: a changed file is a changed input); none for the Hub."""
    return [] if cfg.hub else [resolve_path(getattr(cfg, s), root) for s in SPLIT_NAMES if getattr(cfg, s)]
