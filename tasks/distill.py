"""Distillation stages (placeholder until the training API lands)."""
from tasks.stage import Stage
GENERAL_DISTILLATION = Stage("general_distillation", None, deps=lambda p, i: [], outs=lambda p, i: [], params=lambda p, i: {})
TASK_DISTILLATION = Stage("task_distillation", None, deps=lambda p, i: [], outs=lambda p, i: [], params=lambda p, i: {})
