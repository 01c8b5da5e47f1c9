"""Steady training on a shared CPU: as many torch threads as there are free cores, re-checked while training runs.

PyTorch's CPU kernels run on GNU OpenMP, whose threads spin-wait between parallel regions. That is the right bet on
a quiet machine and the wrong one when another process computes on the same cores: a spinning thread holds a core
that the thread it waits for needs, and with one other CPU-bound process on 2 cores a training step ran 5-16x
slower (`python -m benchmarks.busy`). Making the threads sleep instead (``OMP_WAIT_POLICY=PASSIVE``) fixed the busy
case but cost 40% on a quiet machine, and a short spin count (``GOMP_SPINCOUNT``) traded one for the other.

What works both ways is fewer threads when cores are taken: `ThreadGovernor` reads the machine's CPU time
(``/proc/stat``, the cores this process may run on), subtracts this process's own, and sets
``torch.set_num_threads`` to the cores the others leave free, between the user's limit (the thread count torch had
when training started: ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` are respected) and 1. It looks at most once a
second, at the end of a training step (`FreeCores`, a Trainer callback every training loop installs). Where
``/proc/stat`` cannot be read (not Linux) it does nothing.

It is off unless ``DISTILLERY_FREE_CORES=1`` is set: the thread count changes a kernel's summation order (on 2 cores,
a BERT step's gradients on 1 thread differ from those on 2 in 22 of 41 tensors in fp32, 9 in bf16), so a run whose
thread count follows the load of other processes is not reproducible bit for bit; a Prefect server beside the
pipeline was load enough to change a student between two runs. With it off, training keeps the thread count it
started with, and two runs with the same inputs and seed give the same students.

Training and latency timings on a CPU also put glibc's allocator in a steady state (`steady_allocator`): freed memory
kept for reuse instead of each step faulting its activations' pages in afresh (`python -m benchmarks.precision`'s
step runs with it, as the pipeline's).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

STAT = Path("/proc/stat")
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest time is inside user)


def _busy_seconds(cpus: set[int]) -> float | None:
    """CPU seconds spent busy so far on `cpus`, all processes together; None where the kernel does not say."""
    try:
        lines = STAT.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            fields = rest.split()
            ticks += sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


class ThreadGovernor:
    """Keeps torch's intra-op thread count at the number of cores other processes leave free (see the module)."""

    def __init__(self, max_threads: int | None = None, every: float = 1.0) -> None:
        affinity = getattr(os, "sched_getaffinity", None)
        self.cpus = set(affinity(0)) if affinity is not None else set(range(os.cpu_count() or 1))
        self.max_threads = max_threads or torch.get_num_threads()
        self.every = every
        self._last: tuple[float, float, float] | None = None
        self.threads = torch.get_num_threads()

    def others(self) -> float | None:
        """Cores busy with other processes since the previous look (None on the first look or without /proc/stat)."""
        busy = _busy_seconds(self.cpus)
        if busy is None:
            return None
        now, own = time.monotonic(), time.process_time()
        last, self._last = self._last, (now, busy, own)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (busy - last[1]) - (own - last[2])) / (now - last[0])

    def tick(self) -> int:
        """Look again if `every` seconds have passed; set and return the thread count."""
        if self.max_threads <= 1 or (self._last is not None and time.monotonic() - self._last[0] < self.every):
            return self.threads
        others = self.others()
        if others is not None:
            free = math.floor(len(self.cpus) - others + 0.5)
            threads = max(1, min(self.max_threads, free))
            if threads != self.threads:
                torch.set_num_threads(threads)
                self.threads = threads
        return self.threads

    def restore(self) -> None:
        if self.threads != self.max_threads:
            torch.set_num_threads(self.max_threads)
            self.threads = self.max_threads


#: the environment switch that lets training follow the free cores (reproducible bit for bit only without it)
SWITCH = "DISTILLERY_FREE_CORES"


def follows_free_cores() -> bool:
    return os.environ.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


class FreeCores(TrainerCallback):
    """A `ThreadGovernor` over a Trainer's training steps where `SWITCH` is on; torch's thread count is restored when
    training ends."""

    def __init__(self) -> None:
        self.governor: ThreadGovernor | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.governor = ThreadGovernor() if args.device.type == "cpu" and follows_free_cores() else None

    def on_step_end(self, args, state, control, **kwargs):
        if self.governor is not None:
            self.governor.tick()

    def on_train_end(self, args, state, control, **kwargs):
        if self.governor is not None:
            self.governor.restore()


#: glibc mallopt parameters: M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (the largest it accepts on 64-bit: 32 MiB),
#: M_MMAP_MAX (0: no block by mmap, however large)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_STEADY = {_M_TRIM_THRESHOLD: 2**31 - 1, _M_MMAP_THRESHOLD: 32 * 2**20, _M_MMAP_MAX: 0}


def steady_allocator() -> bool:
    """Fix glibc malloc's trim and mmap thresholds: freed memory stays in the process for reuse and every block comes
    from its heap, so a training step or a forward pass stops faulting its activations' pages in afresh (by default
    glibc returns freed memory to the system and serves large blocks by mmap, by thresholds that move with the
    process's history; above 32 MiB always by mmap, as the 47 MB gradient of a BERT vocabulary's embeddings that
    every step allocates: 11,500 page faults a step). The steady state of a server that keeps its memory; the process
    keeps it. True where that was done (Linux with glibc), False elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    return all(mallopt(param, value) == 1 for param, value in _STEADY.items())
