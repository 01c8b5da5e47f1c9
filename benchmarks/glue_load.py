"""Building a GLUE split as a Dataset: typed Arrow table (what the loader does) vs Dataset.from_dict.

Runs on the real SST-2 train split (67,349 rows) when ../shared/data/glue is present. Interleaves the two
(ABAB...) and prints medians; the last line is the from_dict / arrow time ratio.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import datasets

from distillery.glue import get_task, load_split_file
from distillery.glue.loaders import _features, _rows_to_dataset

GLUE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glue"


def main(reps: int = 5) -> None:
    path = GLUE / "SST-2" / "train.tsv"
    if not path.is_file():
        print(f"skip: {path} not found")
        sys.exit(0)
    spec = get_task("sst2")
    ds = load_split_file(spec, path)
    rows = {c: ds[c][:] for c in ds.column_names}
    arrow, from_dict = [], []
    for _ in range(reps):
        t = time.perf_counter()
        a = _rows_to_dataset(spec, rows)
        arrow.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = datasets.Dataset.from_dict(rows, features=_features(spec))
        from_dict.append(time.perf_counter() - t)
        assert a.features == b.features and a[-1] == b[-1]
    t = time.perf_counter()
    load_split_file(spec, path)
    full = time.perf_counter() - t
    ma, mf = statistics.median(arrow), statistics.median(from_dict)
    print(f"rows={len(ds)} reps={reps}")
    print(f"arrow table: median {ma * 1e3:.1f} ms  {[round(x * 1e3, 1) for x in arrow]}")
    print(f"from_dict:   median {mf * 1e3:.1f} ms  {[round(x * 1e3, 1) for x in from_dict]}")
    print(f"full load_split_file (parse + arrow): {full * 1e3:.1f} ms")
    print(f"from_dict/arrow ratio: {mf / ma:.1f}")


if __name__ == "__main__":
    main()
