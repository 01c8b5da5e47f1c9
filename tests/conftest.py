"""Fixtures shared by the tests (plain helpers: tests/helpers.py).

The whole-pipeline tests share two projects, each built once per test session:

- `prefect_project`: MICRO, one student per recipe, run by `python -m flows.pipeline` (the end-to-end checks: the
  summary, report and registry, the champion's predictions, the console, a re-run all cache hits, `dvc repro`
  after the flow, the ablation);
- `one_student_project`: RESUME, the TinyBERT student alone with resume points, built by `dvc repro` (the DVC
  round trip; tests/test_resume.py kills and resumes the stages of a copy).

A test that changes one of them works in `helpers.scratch(project)` (or on a copy when it needs no cache hit), so
the others find it as it was built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from helpers import MICRO, RESUME, make_project, run

# An xdist worker shares the cores with the other workers and with the pipelines they start (which `helpers.env_for`
# puts on one intra-op thread): its own tiny models on one thread too, set before torch is imported, so two OpenMP
# threads of one worker do not wait on each other at every operation while the cores are busy. A test that needs more
# sets them itself (tests/test_runtime.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# The suite's stage runs share this checkout's root (and its lock, tasks.lock) as its tests share fixtures: they are
# one run of the suite, not two users of one project, so the stages they start as subprocesses are this process's
# children to the lock. tests/test_lock.py unsets it to test the lock itself.
os.environ.setdefault("DISTILLERY_PROJECT_LOCK", str(os.getpid()))


class Built(NamedTuple):
    project: Path
    console: subprocess.CompletedProcess  # what the command that built it printed
    seconds: float  # how long that command took


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n`, `--dist loadgroup`), the tests that share a session- or module-scoped fixture of this
    suite run on one worker, so the fixture (a whole pipeline run, a server stack) is built once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for name in info.names_closure:
            defs = info.name2fixturedefs.get(name)
            if defs and defs[-1].scope in ("session", "package", "module") and defs[-1].baseid:
                item.add_marker(pytest.mark.xdist_group(f"{name}@{defs[-1].baseid}"))
                break


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers more than the cores. Much of this suite's worker time waits (on pipeline commands,
    servers, a cron's minute boundary): the worker that holds the scale-out stack barely uses its core at all, and
    another spends its time waiting on the commands it started; the spare workers fill the cores meanwhile."""
    import os

    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1) + 2


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one intra-op thread (and do not thrash a loaded 2-core machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def prefect_project(tmp_path_factory) -> Built:
    """The micro pipeline, one student per recipe, from scratch by `python -m flows.pipeline` in a DVC project (the
    flow records its stages in dvc.lock). Read it; change it only inside `helpers.scratch`."""
    project = make_project(tmp_path_factory.mktemp("pipeline"), MICRO)
    run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], project)
    t0 = time.perf_counter()
    first = run([sys.executable, "-m", "flows.pipeline"], project, ephemeral=True)  # as a newcomer's first run
    return Built(project, first, time.perf_counter() - t0)


@pytest.fixture(scope="session")
def one_student_project(tmp_path_factory) -> Built:
    """The TinyBERT student alone (RESUME: resume points in every long stage), from scratch by `dvc repro`. Read it;
    change it only inside `helpers.scratch`, or on a copy."""
    project = make_project(tmp_path_factory.mktemp("one-student"), RESUME)
    run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], project)
    t0 = time.perf_counter()
    built = run([sys.executable, "-m", "dvc", "repro"], project, timeout=1500)
    return Built(project, built, time.perf_counter() - t0)
