"""The stage abstraction shared by the Prefect flow and the DVC stages.

A stage declares, for a given item (a task, a student, a student-task pair or nothing), its inputs, its
outputs and the params that matter. From those, one content-addressed cache key is derived:

    key = sha256(stage, item, code version, the params that matter, fingerprints of every input)

The Prefect flow uses it as the task cache key; DVC reaches the same decision from `dvc.yaml` (same deps,
same params, same outs). A key also misses when an output is gone or was last written under another key,
so a cache hit never returns a path whose content belongs to different params.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from tasks.env import ROOT

from distillery.config import Params
from distillery.io import write_text

STAMPS = ROOT / ".prefect" / "stamps"


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Params, str | None], dict[str, Any]]
    deps: Callable[[Params, str | None], list[Path]]
    outs: Callable[[Params, str | None], list[Path]]
    params: Callable[[Params, str | None], dict[str, Any]]
    code: tuple[str, ...] = field(default=())  # the source files/packages whose content is the stage's code version


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes, memoised by (path, size, mtime): a stage's key is needed several times
    per run (freshness check, Prefect cache key, stamp) and must not re-read model weights each time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest(path: Path) -> str:
    st = path.stat()
    return _file_digest(str(path.resolve()), st.st_size, st.st_mtime_ns)


def fingerprint(path: str | Path) -> str:
    """Content hash of a file or directory (relative names + bytes); 'missing' when absent."""
    path = Path(path)
    if path.is_file():
        return _digest(path)
    if not path.is_dir():
        return "missing"
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            h.update(str(p.relative_to(path)).encode())
            h.update(_digest(p).encode())
    return h.hexdigest()


def _source(entry: str) -> Path:
    """'distillery/...' resolves inside the imported library (wherever it is installed), else the project."""
    import distillery

    if entry == "distillery" or entry.startswith("distillery/"):
        return Path(distillery.__file__).parent / entry[len("distillery/"):]
    return ROOT / entry


@lru_cache(maxsize=None)
def code_version(code: tuple[str, ...]) -> str:
    """Hash of a stage's source files (and the torch/transformers versions): editing one stage's code
    reruns that stage and what depends on its outputs, not the whole pipeline."""
    import torch
    import transformers

    h = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}".encode())
    for entry in code:
        path = _source(entry)
        if not path.exists():
            raise FileNotFoundError(f"stage code {entry!r} not found at {path}")
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f"{entry}/{f.relative_to(path) if path.is_dir() else ''}".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def stage_key(stage: Stage, params: Params, item: str | None) -> str:
    payload = {
        "stage": stage.name,
        "item": item,
        "code": code_version(stage.code),
        "params": stage.params(params, item),
        "deps": {str(p): fingerprint(p) for p in stage.deps(params, item)},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _stamp_path(stage: Stage, item: str | None) -> Path:
    return STAMPS / f"{stage.name}@{item or '-'}"


def is_fresh(stage: Stage, params: Params, item: str | None) -> bool:
    """True when every output exists and was last written under this key (so a cache hit is valid)."""
    key = stage_key(stage, params, item)
    stamp = _stamp_path(stage, item)
    outputs_ok = all(Path(o).exists() for o in stage.outs(params, item))
    return outputs_ok and stamp.is_file() and stamp.read_text().strip() == key


def run_stage(stage: Stage, params: Params, item: str | None) -> dict[str, Any]:
    """Run a stage body and stamp its outputs with the key that made them."""
    key = stage_key(stage, params, item)
    result = stage.run(params, item)
    write_text(_stamp_path(stage, item), key + "\n")
    return result


def split_item(item: str) -> tuple[str, str]:
    """A student-task item "student:task" -> (student, task)."""
    student, task = item.split(":", 1)
    return student, task
