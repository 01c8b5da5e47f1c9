"""One run at a time per project: a second run waits for the first (saying for whom) or stops with one line; a killed
holder's lock is free at once; the lock nests inside one process and in the holder's children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tasks.lock import ENV, LOCK_NAME, ProjectBusyError, project_lock

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time; sys.path.insert(0, {root!r}); from pathlib import Path; from tasks.lock import project_lock\n"
        "with project_lock(Path({project!r})):\n    print('held', flush=True)\n    time.sleep(60)\n")


def _holder(project: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT), project=str(project))],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_stops_or_waits_and_a_killed_holders_lock_is_free_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    proc = _holder(tmp_path)
    try:
        with pytest.raises(ProjectBusyError, match=rf"pid {proc.pid} \(.*\), started .* is running in this project"):
            with project_lock(tmp_path, wait=False):
                pass
        said, entered = [], threading.Event()

        def second():
            with project_lock(tmp_path, say=said.append):
                entered.set()
        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.5)
        assert not entered.is_set()  # waiting
        assert len(said) == 1 and said[0].startswith(f"waiting for pid {proc.pid} ")
        os.kill(proc.pid, signal.SIGKILL)  # the holder dies without a word: its lock goes with it
        t.join(10)
        assert entered.is_set()
    finally:
        proc.kill()
        proc.wait()
    assert (tmp_path / LOCK_NAME).read_text() == ""  # released: no holder named


def test_the_lock_nests_in_one_process_and_in_the_holders_children(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with project_lock(tmp_path):
        with project_lock(tmp_path, wait=False):  # a flow inside a flow
            assert os.environ[ENV] == str(os.getpid())
        child = subprocess.run([sys.executable, "-c", HOLD.format(root=str(ROOT), project=str(tmp_path))
                                .replace("time.sleep(60)", "pass")], capture_output=True, text=True, timeout=60)
        assert child.stdout.strip() == "held", child.stderr  # the holder's child does not wait for its parent
    assert ENV not in os.environ
    with project_lock(tmp_path, wait=False):  # free again
        pass


def test_a_stage_run_with_no_wait_stops_with_one_line_while_another_run_holds_the_project(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    proc = _holder(ROOT)
    try:
        env = {k: v for k, v in os.environ.items() if k != ENV}
        out = subprocess.run([sys.executable, "-m", "flows.stage", "report", "--no-wait"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"pid {proc.pid}" in errors[0] and "one run at a time" in errors[0], out.stderr
