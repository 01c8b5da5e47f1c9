"""Training loops built on the Hugging Face Trainer: MLM pre-training, fine-tuning, distillation.

Each loop takes a `TrainRun` (data, output, Trainer settings); distillation also a `DistillSpec` (loss terms, layer
map, options); the task-stage grid a `Grid` (`distillery.training.spec`).

The names below load their module on first use (PEP 562): importing a light submodule (e.g. `saving`) does not load
transformers' modeling code, so a pipeline command that finds its stage fresh starts in about half the time.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule that defines it
_MODULES = {
    "TrainArgsError": "args", "training_arguments": "args", "DistillationCollator": "distill",
    "DistillationTrainer": "distill", "Distiller": "distill", "distill": "distill", "make_projection": "distill",
    "STATE_NAME": "distill_state", "load_projection": "distill_state", "save_projection": "distill_state",
    "finetune": "finetune", "GridResult": "grid", "prediction_grid": "grid", "LossHistory": "log",
    "read_log": "log", "cache_teacher_logits": "logits_cache", "compute_teacher_logits": "logits_cache",
    "glue_metrics": "metrics", "trainer_metrics": "metrics", "tokenize_texts": "mlm", "train_mlm": "mlm",
    "last_checkpoint": "saving", "model_dir": "saving", "DistillSpec": "spec", "Grid": "spec", "TrainRun": "spec",
    "train_and_export": "trainer",
}

__all__ = list(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    globals()[name] = value
    return value
