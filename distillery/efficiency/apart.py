"""Timing in a process of its own: `time_apart` runs `distillery.efficiency.latency.time_sessions` on saved models in
a fresh Python process (``python -m distillery.efficiency.apart SPEC OUT``) and hands back its tables.

A long-lived process is a poor place to time small models side by side: inside the pipeline's flow process, which
also holds a Prefect server, MLflow and their threads, the speedups of the same demo models moved from one run of the
flow to the next (PyTorch's slower in one run while ONNX Runtime's was faster) though each run's paired rounds agreed
with each other; timed in a process that loads the models and does nothing else, they agreed run to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from distillery.efficiency.latency import LatencyResult, time_sessions


def time_apart(described: Mapping[str, Mapping[str, Any]], *, batches: Sequence[int],
               **options: Any) -> dict[int, dict[str, LatencyResult]]:
    """`time_sessions` of the described models at each batch size of ``batches``, in a fresh process with this one's
    thread count: {batch: {name: LatencyResult}}. ``described``: name -> ``{"torch": model directory, "head": its
    head}`` (`distillery.models.load_model`; names with the same directory and head share one module, as a model
    timed in fp32 and bf16 does) or ``{"onnx": file, "vocab_size": n}`` (an int8 `OnnxModel`, new sessions as
    `time_sessions` draws them). ``options``: `time_sessions`' (``reference``, ``reps``, ``seq_len``, ``device``,
    ``precisions``...), JSON values. Raises RuntimeError with the child's last output when it fails."""
    import distillery

    spec = {"models": {n: dict(d) for n, d in described.items()}, "batches": [int(b) for b in batches],
            "threads": torch.get_num_threads(), "options": options}
    library = str(Path(distillery.__file__).resolve().parents[1])  # the child imports this very library
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (library, os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="distillery-timing-") as tmp:
        spec_file, out_file = Path(tmp) / "spec.json", Path(tmp) / "tables.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        proc = subprocess.run([sys.executable, "-m", "distillery.efficiency.apart", str(spec_file), str(out_file)],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0 or not out_file.is_file():
            raise RuntimeError(f"the timing process exited with status {proc.returncode}:\n"
                               f"{(proc.stdout + proc.stderr)[-3000:]}")
        tables = json.loads(out_file.read_text(encoding="utf-8"))
    return {int(b): {n: _result(r) for n, r in table.items()} for b, table in tables.items()}


def _result(row: Mapping[str, Any]) -> LatencyResult:
    return LatencyResult(**{**row, "samples_ms": tuple(row["samples_ms"]), "ratios": tuple(row["ratios"])})


def _load(described: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    from distillery.efficiency.export import OnnxModel
    from distillery.models import load_model

    models: dict[str, Any] = {}
    loaded: dict[tuple[str, str], Any] = {}
    for name, d in described.items():
        if "onnx" in d:
            models[name] = OnnxModel(d["onnx"], vocab_size=d.get("vocab_size"))
            continue
        key = (str(d["torch"]), d.get("head", "base"))
        if key not in loaded:
            loaded[key] = load_model(key[0], head=key[1]).eval()
        models[name] = loaded[key]
    return models


def main(argv: list[str] | None = None) -> int:
    from dataclasses import asdict

    spec_file, out_file = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    torch.set_num_threads(spec["threads"])
    models = _load(spec["models"])
    tables = {str(b): {n: asdict(r) for n, r in time_sessions(models, batch=b, **spec["options"]).items()}
              for b in spec["batches"]}
    Path(out_file).write_text(json.dumps(tables), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
