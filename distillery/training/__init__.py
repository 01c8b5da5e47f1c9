"""Training loops built on the Hugging Face Trainer: MLM pre-training, fine-tuning, distillation.

Each loop takes a `TrainRun` (data, output, Trainer settings); distillation also a `DistillSpec` (loss terms, layer
map, options); the task-stage grid a `Grid` (`distillery.training.spec`).
"""

from distillery.training.args import TrainArgsError, training_arguments
from distillery.training.distill import DistillationCollator, DistillationTrainer, Distiller, distill, make_projection
from distillery.training.distill_state import STATE_NAME, load_projection, save_projection
from distillery.training.finetune import finetune
from distillery.training.grid import GridResult, prediction_grid
from distillery.training.log import LossHistory, read_log
from distillery.training.logits_cache import cache_teacher_logits, compute_teacher_logits
from distillery.training.metrics import glue_metrics, trainer_metrics
from distillery.training.mlm import tokenize_texts, train_mlm
from distillery.training.saving import last_checkpoint, model_dir
from distillery.training.spec import DistillSpec, Grid, TrainRun
from distillery.training.trainer import train_and_export

__all__ = [
    "TrainArgsError", "training_arguments", "DistillationCollator", "DistillationTrainer", "Distiller", "distill",
    "make_projection", "STATE_NAME", "load_projection", "save_projection", "finetune", "GridResult",
    "prediction_grid", "LossHistory", "read_log", "cache_teacher_logits", "compute_teacher_logits",
    "glue_metrics", "trainer_metrics", "tokenize_texts", "train_mlm", "last_checkpoint", "model_dir",
    "DistillSpec", "Grid", "TrainRun", "train_and_export",
]
