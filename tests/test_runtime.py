"""The thread governor: torch's thread count follows the cores other processes leave free."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from distillery import runtime
from distillery.runtime import FreeCores, ThreadGovernor


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Machine:
    """A machine whose other processes use `others` cores: what /proc/stat and the clocks would say."""

    def __init__(self, monkeypatch, cpus: int) -> None:
        self.t, self.busy, self.own, self.others = 100.0, 0.0, 0.0, 0.0
        monkeypatch.setattr(runtime, "_busy_seconds", lambda _cpus: self.busy)
        monkeypatch.setattr(runtime.time, "monotonic", lambda: self.t)
        monkeypatch.setattr(runtime.time, "process_time", lambda: self.own)
        monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _pid: set(range(cpus)), raising=False)

    def advance(self, seconds: float, own_cores: float) -> None:
        self.t += seconds
        self.own += own_cores * seconds
        self.busy += (own_cores + self.others) * seconds


def _steps_beside_one_busy_core(machine: Machine):
    """A FreeCores callback over two training steps on 2 threads, another process taking one core between them."""
    torch.set_num_threads(2)
    args = type("Args", (), {"device": torch.device("cpu")})()
    cb = FreeCores()
    cb.on_train_begin(args, None, None)
    cb.on_step_end(args, None, None)
    machine.others = 1.0
    machine.advance(2.0, own_cores=1)
    cb.on_step_end(args, None, None)
    return cb, args


def test_threads_stay_as_they_were_unless_the_switch_is_on(monkeypatch, threads):
    """Off by default: the thread count decides a kernel's summation order, so following the load would make two runs
    differ (distillery.runtime)."""
    machine = Machine(monkeypatch, cpus=4)
    monkeypatch.delenv(runtime.SWITCH, raising=False)
    cb, args = _steps_beside_one_busy_core(machine)
    assert torch.get_num_threads() == 2 and cb.governor is None


def test_threads_follow_free_cores(monkeypatch, threads):
    machine = Machine(monkeypatch, cpus=4)
    monkeypatch.setenv(runtime.SWITCH, "1")
    torch.set_num_threads(4)
    gov = ThreadGovernor(every=1.0)
    assert gov.tick() == 4  # first look: nothing to compare with
    machine.advance(1.0, own_cores=4)
    assert gov.tick() == 4  # quiet machine: every core
    machine.others = 1.0  # one CPU-bound process appears
    machine.advance(0.5, own_cores=3)
    assert gov.tick() == 4  # looked less than `every` ago
    machine.advance(1.0, own_cores=3)
    assert gov.tick() == 3 and torch.get_num_threads() == 3
    machine.others = 2.6
    machine.advance(1.0, own_cores=1.4)
    assert gov.tick() == 1  # 1.4 cores left: one thread
    machine.others = 9.0
    machine.advance(1.0, own_cores=0.1)
    assert gov.tick() == 1  # never below one
    machine.others = 0.2  # light background load: the cores are back
    machine.advance(1.0, own_cores=1)
    assert gov.tick() == 4 and torch.get_num_threads() == 4


def test_user_limit_is_kept(monkeypatch, threads):
    machine = Machine(monkeypatch, cpus=8)
    torch.set_num_threads(2)  # e.g. OMP_NUM_THREADS=2
    gov = ThreadGovernor(every=0.0)
    gov.tick()
    machine.advance(1.0, own_cores=2)
    assert gov.tick() == 2  # 8 free cores, but the user said 2
    torch.set_num_threads(1)
    one = ThreadGovernor(every=0.0)
    machine.advance(1.0, own_cores=1)
    assert one.tick() == 1 and one._last is None  # nothing to govern: /proc/stat is not even read


def test_no_proc_stat_no_change(monkeypatch, threads):
    monkeypatch.setattr(runtime, "STAT", runtime.Path("/nonexistent/stat"))
    torch.set_num_threads(2)
    gov = ThreadGovernor(every=0.0)
    assert gov.tick() == 2 and gov.tick() == 2


def test_callback_restores_threads(monkeypatch, threads):
    machine = Machine(monkeypatch, cpus=2)
    monkeypatch.setenv(runtime.SWITCH, "1")
    cb, args = _steps_beside_one_busy_core(machine)
    assert torch.get_num_threads() == 1
    cb.on_train_end(args, None, None)
    assert torch.get_num_threads() == 2


@pytest.mark.skipif(not runtime.STAT.exists(), reason="needs Linux /proc/stat")
def test_sees_a_real_cpu_bound_process():
    """Measured, not mocked: a spinning process shows as about one core of others' time, ours is not counted. The
    machine may be busy with other work (another test worker): the hog is seen on top of what others did before it,
    and this process spinning adds nothing to others' time."""
    gov = ThreadGovernor(max_threads=2)
    gov.others()
    time.sleep(1.5)
    before = gov.others()  # the rest of the machine, before the hog
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        gov.others()
        time.sleep(1.5)
        idle = gov.others()  # the hog, this process sleeping
        x = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:  # this process busy too: not counted as others'
            x += 1
        busy = gov.others()
    finally:
        hog.kill()
        hog.wait()
    assert None not in (before, idle, busy)
    assert idle >= before + 0.5 or idle >= len(gov.cpus) - 0.5  # the hog's core (or every core busy already)
    assert busy <= idle + 0.5  # our own spinning core is not others' time
