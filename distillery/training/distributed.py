"""Data-parallel training on several processes (`torchrun`, `accelerate launch`): who writes, who waits.

Under a launcher every process runs the same training loop. The Trainer wraps its model in
DistributedDataParallel: for distillation that model is the `Distiller`, so the student AND its projections are
wrapped, broadcast from rank 0 at the start and all-reduced every step; the teacher is held outside the module tree
(`requires_grad=False`, never optimised), so each rank keeps its own identical, gradient-free replica. The Trainer's
default `find_unused_parameters=True` for a model that is not a `PreTrainedModel` covers the student parameters an
objective never reads (a classifier head during intermediate-layer distillation, the layers after the last mapped
one).

What the Trainer does not cover, the loops do through this module: rank 0 alone writes the exported model, logs and
result files while the others wait for it (`save_final`), a cache is computed by rank 0 and read by the others
(`main_process_first`), and a batch size in params is the global batch, split evenly across processes
(`per_device_batch`), so that N processes train on exactly the batches one process would.

With no launcher (`WORLD_SIZE` unset or 1) every function here is a no-op and nothing distributed is imported.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


def launched() -> bool:
    """Whether this process is one of several started by a launcher (torchrun sets WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def cpu_only() -> bool:
    """No GPU: accelerate (and so the Trainer) runs several processes as one data-parallel group on CPUs only when
    told `cpu=True` (`TrainingArguments.use_cpu`); otherwise each process would train alone."""
    import torch

    return not torch.cuda.is_available()


def _state(**kwargs):
    # accelerate's PartialState: the process group the Trainer uses (created here on first use when no
    # TrainingArguments made it yet). Not kept: TrainingArguments resets and rebuilds the shared state.
    from accelerate import PartialState

    return PartialState(cpu=cpu_only(), **kwargs)


def start(backend: str | None = None) -> None:
    """Join the process group now (`backend` None: NCCL on GPUs, gloo on CPUs); the Trainer then uses it."""
    if launched():
        _state(**({"backend": backend} if backend else {}))


def world_size() -> int:
    return _state().num_processes if launched() else 1


def rank() -> int:
    return _state().process_index if launched() else 0


def is_main() -> bool:
    """Rank 0 (the only process when not launched): the one that writes outputs."""
    return rank() == 0


def wait_for_everyone() -> None:
    """A barrier across processes (no-op when not launched)."""
    if launched():
        _state().wait_for_everyone()


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. computes and writes a cache), then the others (which find it written)."""
    if not launched():
        yield
        return
    with _state().main_process_first():
        yield


def per_device_batch(global_batch: int) -> int:
    """The per-process batch of a global batch: `global_batch / world_size`, which must divide evenly."""
    n = world_size()
    if global_batch % n:
        raise ValueError(f"batch size {global_batch} is the global batch of {n} processes: make it a multiple of {n}")
    return global_batch // n
