"""Where a run's code and data came from: the git commit of the checkout and what `dvc.lock` records.

MLflow tags of every top-level run (the pipeline's, a `dvc repro` stage's; tasks.tracking.run adds them):

- `git_commit` (HEAD of the project's git repository) and `git_dirty` ("true" when tracked files differ from it);
- `dvc.lock.sha256`: the hash of `dvc.lock` as the run started (every stage's deps, params and outs);
- `dvc.input.<path>.md5`: the md5 `dvc.lock` records for each data input of the pipeline: a dependency that no stage
  produces and that is not project code (code is identified by the commit), e.g. a GLUE directory or a corpus file.

Registered model versions carry `git_commit` and the md5s of their own inputs too (tasks.register).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Any

from tasks.env import ROOT

CODE_DIRS = ("distillery/", "tasks/", "flows/")


def _git(*args: str, root: Path = ROOT) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(root: Path = ROOT) -> str | None:
    return _git("rev-parse", "HEAD", root=root) or None


def git_dirty(root: Path = ROOT) -> bool | None:
    status = _git("status", "--porcelain", "--untracked-files=no", root=root)
    return None if status is None else bool(status)


def dvc_lock(root: Path = ROOT) -> dict[str, Any]:
    """The stages of `dvc.lock` ({} when there is none or it does not parse)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return {}
    import yaml

    try:
        return (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages") or {}
    except yaml.YAMLError:
        return {}


def lock_outs(root: Path = ROOT) -> dict[str, str]:
    """path -> md5 of every stage output `dvc.lock` records."""
    return {o["path"]: o["md5"] for s in dvc_lock(root).values() for o in (s.get("outs") or [])
            if o.get("path") and o.get("md5")}


def lock_inputs(root: Path = ROOT) -> dict[str, str]:
    """path -> md5 of the pipeline's data inputs in `dvc.lock`: deps that no stage produces and that are not code."""
    stages = dvc_lock(root)
    produced = {o.get("path") for s in stages.values() for o in (s.get("outs") or [])}
    inputs = {}
    for s in stages.values():
        for d in s.get("deps") or []:
            path = d.get("path")
            if path and d.get("md5") and path not in produced and not path.startswith(CODE_DIRS):
                inputs[path] = d["md5"]
    return inputs


def _key(path: str) -> str:
    return re.sub(r"[^\w.\-/ ]", "_", path)


def run_tags(root: Path = ROOT) -> dict[str, str]:
    """The provenance tags of a top-level MLflow run (see the module's docstring); absent facts are left out."""
    tags: dict[str, str] = {}
    if commit := git_commit(root):
        tags["git_commit"] = commit
        dirty = git_dirty(root)
        if dirty is not None:
            tags["git_dirty"] = str(dirty).lower()
    lock = root / "dvc.lock"
    if lock.is_file():
        tags["dvc.lock.sha256"] = hashlib.sha256(lock.read_bytes()).hexdigest()
        tags.update({f"dvc.input.{_key(path)}.md5": md5 for path, md5 in sorted(lock_inputs(root).items())})
    return tags
