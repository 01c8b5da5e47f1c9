"""Write two tasks of your own from the shared GLUE files, as a user's own data would look: MRPC as a JSON Lines pair
task with string labels and other column names, STS-B as a CSV regression task. `params/custom.yaml` reads them:

    python docs/examples/custom_tasks.py            # writes data/custom/{paraphrase,similarity}/{train,dev}.*
    python -m flows.pipeline --preset custom
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GLUE = ROOT / ".." / "shared" / "data" / "glue"


def main() -> int:
    from distillery.glue import load_local

    if not GLUE.is_dir():
        print(f"error: {GLUE} not found (the shared GLUE files)", file=sys.stderr)
        return 1
    mrpc = load_local("mrpc", GLUE, splits=["train", "dev"])
    out = ROOT / "data" / "custom" / "paraphrase"
    out.mkdir(parents=True, exist_ok=True)
    for split, ds in mrpc.items():
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for row in ds:
                f.write(json.dumps({"first": row["text_a"], "second": row["text_b"],
                                    "verdict": ["different", "same"][row["label"]]}) + "\n")
    stsb = load_local("stsb", GLUE, splits=["train", "dev"])
    out = ROOT / "data" / "custom" / "similarity"
    out.mkdir(parents=True, exist_ok=True)
    for split, ds in stsb.items():
        with (out / f"{split}.csv").open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["sentence_one", "sentence_two", "similarity"])
            w.writerows([row["text_a"], row["text_b"], f"{row['label']:.3f}"] for row in ds)
    print(f"wrote {ROOT / 'data' / 'custom'}: paraphrase/{{train,dev}}.jsonl, similarity/{{train,dev}}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
