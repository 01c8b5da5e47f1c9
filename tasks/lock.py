"""One run at a time per project: the pipeline, a stage run (`flows.stage`, and so every stage `dvc repro` runs) and
the ablation flow hold the project's lock while they work. Two runs in one workspace would train the same student
twice, register it twice and time each other's latency under load; DVC's own rule is one stage at a time per
workspace. A second run waits, saying for whom, or with ``wait=False`` stops with one line.

The lock is an advisory `flock` on `.distillery.lock` at the project root: the kernel drops it when its process
dies, so the lock of a killed run (kill -9, a crash) is free at once, whatever the file still says. The file holds the
holder's pid, command and start time, for the waiting line. Inside one process the lock nests (a flow calling a flow);
a child process the holder starts (a launcher's ranks, a subprocess stage) finds the holder's pid in
`DISTILLERY_PROJECT_LOCK` and does not wait for its own parent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from distillery.errors import UserError

from tasks.env import ROOT

LOCK_NAME = ".distillery.lock"
ENV = "DISTILLERY_PROJECT_LOCK"
_held = {"depth": 0}


class ProjectBusyError(UserError, RuntimeError):
    """Another run holds the project (and the caller would not wait)."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another run"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info['pid']} ({info.get('command', '?')}), started {started}"


@contextmanager
def project_lock(root: Path | None = None, *, wait: bool = True,
                 say: Callable[[str], None] = lambda line: print(line, flush=True)) -> Iterator[None]:
    """Hold the project's lock for the block (module docstring). ``wait`` False: raise `ProjectBusyError` naming the
    holder instead of waiting. Where `fcntl` is missing (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux or macOS
        yield
        return
    parent = os.environ.get(ENV)
    if _held["depth"] or (parent and parent != str(os.getpid()) and alive(int(parent))):
        _held["depth"] += 1
        try:
            yield
        finally:
            _held["depth"] -= 1
        return
    path = Path(root or ROOT) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                raise ProjectBusyError(f"{path.parent}: {holder} is running in this project; one run at a time per "
                                       "project (run again when it has finished, or without --no-wait to wait)") from None
            say(f"waiting for {holder} to finish: one run at a time per project ({path})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv) or sys.executable,
                                  "started": time.time()}).encode(), 0)
        previous = os.environ.get(ENV)
        os.environ[ENV] = str(os.getpid())
        _held["depth"] = 1
        try:
            yield
        finally:
            _held["depth"] = 0
            if previous is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = previous
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    """Whether process `pid` exists (someone else's live process included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
