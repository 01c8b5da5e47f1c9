"""Atomic file and directory writes: write to a temporary sibling, then rename into place.

A crash leaves either the old output or none, never a half-written one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # mkstemp/mkdtemp create 0600/0700; outputs get the usual 0644/0755 instead


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path next to `path`; on success rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to `path`; on success replace `path` with it (a directory: callers
    replace only what they wrote; a file or link at `path` is refused, never replaced)."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        from distillery.errors import OutputExistsError

        raise OutputExistsError(f"{path} exists and is not a directory; it is left as it is")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_UMASK)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


#: Model references by scheme -> a function that makes the referenced model a local directory and returns it. The
#: library names no model registry: the pipeline registers ``models:/`` (its MLflow registry, tasks/registered.py).
REFERENCE_RESOLVERS: dict[str, Callable[[str], Path]] = {}


def read_state(path: str | os.PathLike, parse: Callable[[str], Any] = json.loads, *, kind: type = dict,
               say: Callable[[str], None] | None = None) -> Any | None:
    """A state file a run keeps for the next (e.g. ``metrics/changes.json``, ``dvc.lock``): its content parsed by
    `parse`, None when it is absent, or when it is damaged (not parseable, or not a `kind`): then it is set aside,
    renamed to ``<name>.damaged`` (``.damaged.1``, ... when taken; never deleted), `say` gets one line naming both,
    and the caller rebuilds it from the stages' own outputs."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        value = parse(path.read_text(encoding="utf-8"))
        if isinstance(value, kind):
            return value
    except Exception:  # noqa: BLE001 - any parser's error (json, yaml) means damaged
        pass
    aside = path.with_name(path.name + ".damaged")
    n = 0
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged.{n}")
    path.rename(aside)
    if say is not None:
        say(f"{path} was damaged (not readable as {kind.__name__}): set aside as {aside.name}, rebuilt from the outputs")
    return None


def resolve_path(path: str, root: Path) -> Path:
    """A params path: absolute, ~-expanded, or relative to the project root; a model reference with a registered
    scheme (``REFERENCE_RESOLVERS``, e.g. ``models:/teacher@champion``) is the local directory it resolves to."""
    for scheme, resolver in REFERENCE_RESOLVERS.items():
        if path.startswith(scheme):
            return resolver(path)
    p = Path(path).expanduser()
    return p if p.is_absolute() else (root / p).resolve()


def hub_offline() -> bool:
    """Whether the Hugging Face Hub is off for this process (HF_HUB_OFFLINE set to a true value)."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=None)
def hub_dataset(repo_id: str) -> str:
    """A Hub dataset at its current revision, as what `datasets.load_dataset` reads (once per process: one run, one
    revision): online (HF_HUB_OFFLINE=0), the local snapshot of the Hub's latest revision, downloaded into the Hugging
    Face cache; offline, the snapshot of the revision the cache holds. A local snapshot's content is then in the keys
    of the stages that read it, so a new revision re-runs them. `repo_id` itself when it is no Hub id, or offline and
    not cached (`load_dataset` then says why)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
        return snapshot_download(repo_id, repo_type="dataset", local_files_only=hub_offline())
    except (HFValidationError, LocalEntryNotFoundError):
        return repo_id
