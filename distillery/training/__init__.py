"""Training loops built on the Hugging Face Trainer: MLM pre-training, fine-tuning, distillation."""

from distillery.training.args import TrainArgsError, training_arguments
from distillery.training.finetune import finetune
from distillery.training.log import LossHistory, read_log
from distillery.training.metrics import glue_metrics, trainer_metrics
from distillery.training.mlm import tokenize_texts, train_mlm
from distillery.training.saving import last_checkpoint, model_dir

__all__ = [
    "TrainArgsError", "training_arguments", "finetune", "LossHistory", "read_log", "glue_metrics",
    "trainer_metrics", "tokenize_texts", "train_mlm", "last_checkpoint", "model_dir",
]
