"""`torch.compile` of the models a distillation step runs, where it pays.

``compile`` in params is ``auto`` (the default), ``on`` or ``off``. With it on, `distill` compiles the teacher's and
the student's forwards in place (`torch.nn.Module.compile`: the modules, their weights and what they save are
unchanged; the capture hooks run inside) and the loss terms (`Distiller.objectives`, forward and backward: the fp32
casts of what autocast captured fuse into the losses' reductions). Inductor fuses
each layer's elementwise work (bias, GELU, dropout, LayerNorm, the casts of bf16 autocast) into a few kernels and
issues far fewer launches, which is what bounds a GPU's step at these models' widths.

``auto`` compiles on a CUDA device the runs that do not evaluate as they train: general distillation, whose corpus
batches nearly all pad to the same length, and which runs longest. A task run (fine-tuning grid, intermediate and
prediction steps) has batches of many lengths and an evaluation between epochs; each new shape and the switch to
evaluation recompile (seconds to tens of seconds each on a GPU host), more than a GLUE-sized run's steps gain back.
On a CPU ``auto`` is off: compiling costs minutes of each run and the step did not get faster. `benchmarks.gpu` and
the pipeline's runs that decided this are rows of docs/results.md. Compiled kernels change the rounding of some sums,
so a compiled run is not bit-identical to an eager one (tests/test_compiled.py holds the two to float32 rounding).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch
from torch import nn

from distillery.precision import device_type

SETTINGS: tuple[str, ...] = ("auto", "on", "off")
_SETTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("distillery_compile", default=None)


def enabled(device: str | torch.device | None = None, evaluates: bool = False) -> bool:
    """Whether the setting in force (`use`; ``auto`` without one) compiles a run on `device`; ``auto`` compiles on
    a CUDA device a run that does not evaluate as it trains (`evaluates`)."""
    setting = _SETTING.get() or "auto"
    return device_type(device) == "cuda" and not evaluates if setting == "auto" else setting == "on"


@contextlib.contextmanager
def use(setting: str) -> Iterator[None]:
    """Make `setting` the compile setting of everything inside (this thread / task context)."""
    if setting not in SETTINGS:
        raise ValueError(f"compile: expected one of {', '.join(SETTINGS)}, got {setting!r}")
    token = _SETTING.set(setting)
    try:
        yield
    finally:
        _SETTING.reset(token)


def compile_step(distiller: nn.Module, device: str | torch.device | None = None, evaluates: bool = False) -> bool:
    """Where `enabled` for this run: compile the teacher's and the student's forwards in place and the distiller's
    objectives (`Distiller.compile_objectives`); whether it did. What was compiled before is left as it is."""
    if not enabled(device, evaluates):
        return False
    for model in (distiller.teacher, distiller.student):
        if model is not None and getattr(model, "_compiled_call_impl", None) is None:
            model.compile()
    distiller.compile_objectives()
    return True
