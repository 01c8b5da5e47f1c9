"""Fixtures shared by the tests (plain helpers: tests/helpers.py).

The whole-pipeline tests share two projects, each built once per test session:

- `prefect_project`: MICRO, one student per recipe, run by `python -m flows.pipeline` (the end-to-end checks: the
  summary, report and registry, the champion's predictions, the console, a re-run all cache hits, `dvc repro`
  after the flow, the ablation);
- `one_student_project`: RESUME, the TinyBERT student alone with resume points, built by `dvc repro` (the DVC
  round trip; tests/test_resume.py kills and resumes the stages of a copy).

A test that changes one of them works in `helpers.scratch(project)` (or on a copy when it needs no cache hit), so
the others find it as it was built.

The builds start on a background thread before the first test of a session that selected a test using them, one
after the other, so they overlap the tests that come first (a pipeline command keeps about one of two cores busy);
the first test that uses a project waits for it. The end of the session stops a build still running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from helpers import MICRO, RESUME, env_for, make_project


class Built(NamedTuple):
    project: Path
    console: subprocess.CompletedProcess  # what the command that built it printed
    seconds: float  # how long that command took


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one intra-op thread (and do not thrash a loaded 2-core machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------ session projects

Runner = Callable[..., subprocess.CompletedProcess]


def _build_prefect_project(project: Path, run: Runner) -> Built:
    """The micro pipeline, one student per recipe, from scratch by `python -m flows.pipeline` in a DVC project (the
    flow records its stages in dvc.lock)."""
    make_project(project, MICRO, dvc_yaml=False)
    run([sys.executable, "-m", "flows.dvc"], project)  # dvc.yaml for these params
    run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], project)
    t0 = time.perf_counter()
    first = run([sys.executable, "-m", "flows.pipeline"], project, timeout=900)
    return Built(project, first, time.perf_counter() - t0)


def _build_one_student_project(project: Path, run: Runner) -> Built:
    """The TinyBERT student alone (RESUME: resume points in every long stage), from scratch by `dvc repro`."""
    make_project(project, RESUME, dvc_yaml=False)
    run([sys.executable, "-m", "flows.dvc"], project)  # dvc.yaml for these params
    run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], project)
    t0 = time.perf_counter()
    built = run([sys.executable, "-m", "dvc", "repro"], project, timeout=1500)
    return Built(project, built, time.perf_counter() - t0)


BUILDS = {"prefect_project": _build_prefect_project, "one_student_project": _build_one_student_project}


class SessionProjects:
    """The session's shared projects: `start(names)` builds them in that order on a background thread, `get(name)`
    waits for one (or builds it here when it was not started), `stop()` kills a build still running."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self.tmp_path_factory = tmp_path_factory
        self.environ = dict(os.environ)  # the commands' environment: not what a test sets meanwhile
        self.scheduled: set[str] = set()
        self.done = {name: threading.Event() for name in BUILDS}
        self.results: dict[str, Built] = {}
        self.errors: dict[str, BaseException] = {}
        self.build_s: dict[str, float] = {}
        self.wait_s: dict[str, float] = {}  # how long the first test that needed it waited
        self.procs: list[subprocess.Popen] = []
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def _dir(self, name: str) -> Path:
        return self.tmp_path_factory.mktemp(name.replace("_", "-"))

    def start(self, names: list[str]) -> None:
        self.scheduled.update(names)
        dirs = {name: self._dir(name) for name in names}  # (the factory is not thread-safe)
        self.thread = threading.Thread(target=self._build_all, args=(dirs,), name="session-projects", daemon=True)
        self.thread.start()

    def _build_all(self, dirs: dict[str, Path]) -> None:
        for name, project in dirs.items():
            self._build(name, project)

    def _build(self, name: str, project: Path) -> None:
        t0 = time.perf_counter()
        try:
            if self.stopping:
                raise RuntimeError("the test session ended before this project was built")
            self.results[name] = BUILDS[name](project, self.run)
        except BaseException as exc:  # raised again in each test that needs the project
            self.errors[name] = exc
        finally:
            self.build_s[name] = time.perf_counter() - t0
            self.done[name].set()

    def get(self, name: str) -> Built:
        t0 = time.perf_counter()
        if name not in self.scheduled:  # not started in the background: build it now
            self.scheduled.add(name)
            self._build(name, self._dir(name))
        self.done[name].wait()
        self.wait_s.setdefault(name, time.perf_counter() - t0)
        if name in self.errors:
            raise self.errors[name]
        return self.results[name]

    def run(self, cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
        """helpers.run, in a process group that `stop()` can kill."""
        with self.lock:
            if self.stopping:
                raise RuntimeError("the test session ended")
            proc = subprocess.Popen(cmd, cwd=cwd, env=env_for(cwd, self.environ), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            self.procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            out, err = proc.communicate()
            raise AssertionError(f"{' '.join(cmd)} ran over {timeout} s:\n{out[-3000:]}\n{err[-6000:]}") from None
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{out[-3000:]}\n{err[-6000:]}"
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for proc in self.procs:
                _kill(proc)
        if self.thread is not None:
            self.thread.join(timeout=120)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


SESSION_PROJECTS = pytest.StashKey[SessionProjects]()


@pytest.fixture(scope="session", autouse=True)
def session_projects(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Starts building the shared projects that the session's selected tests use, in the order of their first use
    (not under pytest-xdist, whose workers run only some of the tests they collect: there each is built on first
    use)."""
    projects = SessionProjects(tmp_path_factory)
    request.config.stash[SESSION_PROJECTS] = projects
    if not hasattr(request.config, "workerinput"):
        names = []
        for item in request.session.items:
            names += [name for name in getattr(item, "fixturenames", ()) if name in BUILDS and name not in names]
        if names:
            projects.start(names)
    yield projects
    projects.stop()


@pytest.fixture(scope="session")
def prefect_project(session_projects: SessionProjects) -> Built:
    """The micro pipeline, one student per recipe, built by `python -m flows.pipeline` (see above). Read it; change it
    only inside `helpers.scratch`."""
    return session_projects.get("prefect_project")


@pytest.fixture(scope="session")
def one_student_project(session_projects: SessionProjects) -> Built:
    """The TinyBERT student alone with resume points, built by `dvc repro` (see above). Read it; change it only inside
    `helpers.scratch`, or on a copy."""
    return session_projects.get("one_student_project")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    projects = config.stash.get(SESSION_PROJECTS, None)
    if projects is None or not projects.build_s:
        return
    lines = [f"{name}: built in {seconds:.1f} s; the first test that used it waited {projects.wait_s.get(name, 0):.1f} s"
             for name, seconds in projects.build_s.items()]
    terminalreporter.write_sep("-", "session projects (tests/conftest.py)")
    for line in lines:
        terminalreporter.write_line(line)
