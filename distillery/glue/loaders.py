"""Load GLUE tasks from a local directory in the official download layout, or from the HF Hub.

Both loaders return a `datasets.DatasetDict` with splits "train" / "dev" / "test" (and "test_labeled"
for SST-2 when that extra file is present) and the columns

    text_a, text_b (pair tasks only), label, idx

`label` is the label id in the registry's order (`TaskSpec.labels`), a float score for STS-B; an unlabeled row
(test splits) has -1, or NaN for a regression target (which may be of any sign: `unlabeled_value`). `idx` is the file's index/id column when it has one, else the
0-based row number; test predictions are written against it.

Local files are read line by line, split on tabs with no quote handling (csv.QUOTE_NONE semantics:
GLUE sentences contain unbalanced `"`), a UTF-8 BOM is dropped (MRPC), a final line without newline
is accepted (CoLA dev), CR-only line endings are read as lines, and columns are found by header name (CoLA
train/dev have no header; their columns are `TaskSpec.noheader_columns`). Any row with the wrong number of
fields or a bad label, a file that is not UTF-8 and a split with no rows raise `GlueFileError` naming the
file (and line).

Augmented training files (TinyBERT data augmentation, `distillery.augment`) have the header
`text_a[\ttext_b]\tlabel\tsource_idx` and are written with csv quoting; `load_split_file` recognises
them by that header and reads them with the csv module.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from distillery.errors import InputNotFoundError, UserError
from distillery.glue.tasks import TaskSpec, get_task

if TYPE_CHECKING:
    import datasets

UNLABELED = -1
AUGMENTED_HEADER = "text_a"


def unlabeled_value(spec: "TaskSpec") -> int | float:
    """The label of a row without one: -1 for classes, NaN for a regression target (which may be of any sign)."""
    return math.nan if spec.is_regression else UNLABELED


def is_unlabeled(spec: "TaskSpec", value: Any) -> bool:
    """Whether a stored label is `unlabeled_value`'s (None too)."""
    if value is None:
        return True
    if spec.is_regression:
        return isinstance(value, float) and math.isnan(value)
    return value == UNLABELED


class GlueFileError(UserError, ValueError):
    """A malformed GLUE file: the message names the file and the 1-based line number."""


def _features(spec: TaskSpec, extra: Sequence[str] = ()) -> datasets.Features:
    import datasets  # lazy here and in encode/stats: ~0.8 s with pandas and pyarrow; the task registry needs none

    cols: dict = {"text_a": datasets.Value("string")}
    if spec.is_pair:
        cols["text_b"] = datasets.Value("string")
    cols["label"] = datasets.Value("float32") if spec.is_regression else datasets.Value("int64")
    cols["idx"] = datasets.Value("int64")
    for name in extra:
        cols[name] = datasets.Value("int64")
    return datasets.Features(cols)


def _read_text(path: Path) -> str:
    """A GLUE file as text: UTF-8, a BOM dropped (MRPC). UTF-16, NUL bytes or bytes that are not UTF-8 raise
    GlueFileError naming the file (and the line of the first bad byte)."""
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise GlueFileError(f"{path}: UTF-16 text (it starts with a UTF-16 byte-order mark); re-save it as UTF-8")
    if b"\x00" in data:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1
        raise GlueFileError(f"{path}:{line}: NUL bytes: not a UTF-8 text file (UTF-16 or binary?); re-save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise GlueFileError(f"{path}:{line}: byte 0x{exc.object[exc.start]:02x} is not UTF-8; re-save the file as UTF-8 "
                            "(e.g. iconv -f latin1 -t utf-8)") from None


def _read_lines(path: Path, text: str | None = None) -> list[str]:
    """Lines split on "\\n" only (a lone "\\r" or U+2028 inside a sentence is text), BOM and CR dropped.
    A file with "\\r" but no "\\n" at all has classic Mac (CR-only) line endings and is split on "\\r"."""
    text = _read_text(path) if text is None else text
    if "\n" not in text and "\r" in text:
        text = text.replace("\r", "\n")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # trailing newline; CoLA dev has none
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_label(spec: TaskSpec, raw: str, where: str, *, allow_id: bool = False) -> int | float:
    """A label field -> registry id (classification) or float score in [0, 5] (STS-B).

    allow_id also accepts a label id ("0".."C-1") where the name is not found (augmented files).
    """
    raw = raw.strip()
    if spec.is_regression:
        try:
            value = float(raw)
        except ValueError:
            raise GlueFileError(f"{where}: label {raw!r} is not a number") from None
        if not math.isfinite(value) or not 0.0 <= value <= 5.0:
            raise GlueFileError(f"{where}: score {raw!r} is outside [0, 5]")
        return value
    ids = spec._label_ids
    if raw in ids:
        return ids[raw]
    if allow_id and raw.isdigit() and int(raw) < len(spec.labels):
        return int(raw)
    raise GlueFileError(f"{where}: label {raw!r} is not one of {list(spec.labels)} ({spec.name})")


def _is_header(spec: TaskSpec, fields: list[str]) -> bool:
    return all(c in fields for c in spec.text_columns)


def _rows_to_dataset(spec: TaskSpec, rows: dict[str, list], extra: Sequence[str] = ()) -> datasets.Dataset:
    """Columns -> Dataset through a typed Arrow table (Dataset.from_dict encodes row by row: ~10x slower)."""
    import datasets
    import pyarrow as pa

    features = _features(spec, extra)
    table = pa.table({name: pa.array(rows[name], type=feat.pa_type) for name, feat in features.items()})
    return datasets.Dataset(table)


def _read_augmented(spec: TaskSpec, path: Path, text: str) -> datasets.Dataset:
    """An augmented train file: header text_a[,text_b],label,source_idx; csv quoting (quote-safe)."""
    expected = ["text_a"] + (["text_b"] if spec.is_pair else []) + ["label", "source_idx"]
    rows: dict[str, list] = {c: [] for c in ["text_a", "text_b", "label", "idx", "source_idx"]
                             if c != "text_b" or spec.is_pair}
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header != expected:
            raise GlueFileError(f"{path}:1: augmented header {header} != expected {expected} for {spec.name}")
        for n, fields in enumerate(reader):
            where = f"{path}:{reader.line_num}"
            if len(fields) != len(expected):
                raise GlueFileError(f"{where}: expected {len(expected)} fields {expected}, got {len(fields)}")
            rec = dict(zip(expected, fields))
            rows["text_a"].append(rec["text_a"])
            if spec.is_pair:
                rows["text_b"].append(rec["text_b"])
            rows["label"].append(parse_label(spec, rec["label"], where, allow_id=True))
            try:
                rows["source_idx"].append(int(rec["source_idx"]))
            except ValueError:
                raise GlueFileError(f"{where}: source_idx {rec['source_idx']!r} is not an integer") from None
            rows["idx"].append(n)
    if not rows["idx"]:
        raise GlueFileError(f"{path}: empty split: the augmented file has a header and no rows; re-run augmentation")
    return _rows_to_dataset(spec, rows, extra=("source_idx",))


def load_split_file(task: str | TaskSpec, path: str | os.PathLike) -> datasets.Dataset:
    """Read one split file of `task`'s format (labeled or test layout, or an augmented file)."""
    spec = get_task(task)
    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(f"{spec.name}: no such file {path}")
    text = _read_text(path)
    head = text.split("\n", 1)[0]
    if head.split("\t", 1)[0].strip() == AUGMENTED_HEADER:
        return _read_augmented(spec, path, text)
    lines = _read_lines(path, text)
    if not lines:
        raise GlueFileError(f"{path}: empty file")
    first = lines[0].split("\t")
    if _is_header(spec, first):
        columns, body, start = first, lines[1:], 2
    elif spec.noheader_columns is not None:
        columns, body, start = list(spec.noheader_columns), lines, 1
    else:
        raise GlueFileError(
            f"{path}:1: header {first} lacks the text columns {list(spec.text_columns)} of {spec.name}")
    pos = {c: i for i, c in enumerate(columns)}
    labeled = spec.label_column is not None and spec.label_column in pos
    index_col = next((c for c in spec.index_columns if c in pos), None)
    rows: dict[str, list] = {"text_a": [], "label": [], "idx": []}
    if spec.is_pair:
        rows["text_b"] = []
    text_keys = ["text_a", "text_b"][: len(spec.text_columns)]
    for n, line in enumerate(body):
        where = f"{path}:{start + n}"
        fields = line.split("\t")
        if len(fields) != len(columns):
            raise GlueFileError(
                f"{where}: expected {len(columns)} tab-separated fields ({', '.join(columns)}), got {len(fields)}")
        for key, col in zip(text_keys, spec.text_columns):
            rows[key].append(fields[pos[col]])
        rows["label"].append(parse_label(spec, fields[pos[spec.label_column]], where) if labeled
                             else unlabeled_value(spec))
        if index_col is None:
            rows["idx"].append(n)
        else:
            try:
                rows["idx"].append(int(fields[pos[index_col]]))
            except ValueError:
                raise GlueFileError(f"{where}: {index_col} {fields[pos[index_col]]!r} is not an integer") from None
    if not rows["idx"]:
        raise GlueFileError(f"{path}: empty split: the file has a header and no examples; every split needs at "
                            "least one row")
    return _rows_to_dataset(spec, rows)


def task_dir(task: str | TaskSpec, data_dir: str | os.PathLike) -> Path:
    """`<data_dir>/<TaskSpec.dirname>`."""
    return Path(data_dir) / get_task(task).dirname


def available_splits(task: str | TaskSpec, data_dir: str | os.PathLike) -> list[str]:
    """The splits of `task` whose files exist under `data_dir`. A split's path that exists but is not a file (a
    directory, a broken link) raises GlueFileError naming it: skipping it would silently drop the split."""
    spec = get_task(task)
    d = task_dir(spec, data_dir)
    for split, name in spec.files.items():
        path = d / name
        if (path.exists() or path.is_symlink()) and not path.is_file():
            kind = "a directory" if path.is_dir() else "a broken link" if not path.exists() else "not a regular file"
            raise GlueFileError(f"{path}: the {split} split of {spec.name} is {kind}, not a file; put the TSV file "
                                "there or remove it")
    return [s for s, f in spec.files.items() if (d / f).is_file()]


def load_local(task: str | TaskSpec, data_dir: str | os.PathLike,
               splits: Iterable[str] | None = None) -> datasets.DatasetDict:
    """Load `task` from `<data_dir>/<Task>/` in the GLUE download layout.

    splits=None loads every split whose file exists (at least one must); naming a split whose file is
    missing raises FileNotFoundError.
    """
    import datasets

    spec = get_task(task)
    d = task_dir(spec, data_dir)
    if not d.is_dir():
        raise InputNotFoundError(f"{spec.name}: task directory {d} not found (data dir {data_dir})")
    if splits is None:
        wanted = available_splits(spec, data_dir)
        if not wanted:
            raise InputNotFoundError(f"{spec.name}: none of {sorted(spec.files.values())} found in {d}")
    else:
        wanted = list(splits)
        for s in wanted:
            if s not in spec.files:
                raise ValueError(f"{spec.name}: unknown split {s!r}; splits: {list(spec.files)}")
    return datasets.DatasetDict({s: load_split_file(spec, d / spec.files[s]) for s in wanted})


#: The GLUE dataset on the Hugging Face Hub.
HUB_ID = "nyu-mll/glue"


def load_hub(task: str | TaskSpec, cache_dir: str | os.PathLike | None = None,
             splits: Iterable[str] | None = None, path: str = HUB_ID) -> datasets.DatasetDict:
    """Load `task` from the Hugging Face Hub GLUE dataset, mapped into the local loader's schema.

    Hub splits are renamed (validation -> dev; MNLI validation_matched -> dev, ...), text columns to
    text_a/text_b, and classification label ids are mapped into the registry's order by label *name*
    (e.g. Hub MNLI entailment=0 -> registry id 1). Hub test labels (-1) stay -1.
    """
    import datasets

    spec = get_task(task)
    if spec.hub_config is None:
        raise ValueError(f"{spec.name}: not on the Hugging Face Hub (a generated task); use load_local")
    from distillery.io import hub_dataset

    raw = datasets.load_dataset(hub_dataset(path), spec.hub_config,
                                cache_dir=None if cache_dir is None else str(cache_dir))
    wanted = list(spec.hub_splits) if splits is None else list(splits)
    out = {}
    for split in wanted:
        if split not in spec.hub_splits:
            raise ValueError(f"{spec.name}: unknown split {split!r}; splits: {list(spec.hub_splits)}")
        hub_split = spec.hub_splits[split]
        if hub_split not in raw:
            raise KeyError(f"{spec.name}: Hub dataset {path}/{spec.hub_config} has no split {hub_split!r} "
                           f"(has {list(raw)})")
        out[split] = _from_hub_split(spec, raw[hub_split], f"{path}/{spec.hub_config}[{hub_split}]")
    return datasets.DatasetDict(out)


def _from_hub_split(spec: TaskSpec, ds: datasets.Dataset, where: str) -> datasets.Dataset:
    missing = [c for c in (*spec.hub_text_columns, "label", "idx") if c not in ds.column_names]
    if missing:
        raise KeyError(f"{where}: missing columns {missing} (has {ds.column_names})")
    labels = ds["label"][:]
    if spec.is_regression:  # GLUE's scores lie in [0, 5]: the Hub's -1 marks a test row
        mapped = [math.nan if v is None or v < 0 else float(v) for v in labels]
    else:
        feature = ds.features["label"]
        names = getattr(feature, "names", None)
        if not names:
            raise ValueError(f"{where}: label is not a ClassLabel with names; cannot map by name")
        unknown = [n for n in names if n not in spec.hub_label_names]
        if unknown:
            raise ValueError(f"{where}: Hub label names {unknown} not in {list(spec.hub_label_names)}")
        hub_to_ours = {i: spec.hub_label_names.index(n) for i, n in enumerate(names)}
        mapped = [UNLABELED if v is None or v < 0 else hub_to_ours[int(v)] for v in labels]
    rows: dict[str, list] = {"text_a": ds[spec.hub_text_columns[0]][:]}
    if spec.is_pair:
        rows["text_b"] = ds[spec.hub_text_columns[1]][:]
    rows["label"] = mapped
    rows["idx"] = [int(i) for i in ds["idx"][:]]
    return _rows_to_dataset(spec, rows)
