"""Fine-tuning a teacher or a student on a sequence classification / regression task (BERT section 4.1).

Datasets arrive encoded (`input_ids`, `attention_mask`, optional `token_type_ids`, `labels`; see
`distillery.glue.encode`). The best checkpoint on the dev main score is kept (evaluated every epoch by
default) and exported to `output_dir/model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, Trainer

from distillery.training.args import collator_for
from distillery.training.spec import TrainRun
from distillery.training.trainer import train_and_export

#: The loop's own TrainingArguments options, under the run's. A sequence classifier's loss is its batch mean, which
#: ignores the Trainer's token count; with `average_tokens_across_devices` the Trainer would still multiply it by the
#: number of processes, so under DDP every gradient would be N times one process's (measured: clipping then trains a
#: different model).
OPTIONS: dict[str, Any] = {"average_tokens_across_devices": False}


def finetune(model: PreTrainedModel, run: TrainRun) -> Path:
    """Fine-tune `model` (a `*ForSequenceClassification`; `num_labels=1` means regression/MSE) on `run`.

    `run.compute_metrics(predictions, labels) -> dict` receives class ids (or scores for regression);
    `run.main_score` picks the selection metric (a key, or a function of the metrics dict). With an eval set the
    best checkpoint on the main score is restored before export. Returns `run.output_dir/model`, which also holds
    `train_log.csv` and `metrics.json` (the dev metrics of the exported model).
    """
    has_eval = run.eval_dataset is not None
    if has_eval and run.compute_metrics is None:
        raise ValueError("an eval_dataset needs compute_metrics(predictions, labels) to select the best model")
    targs = run.training_arguments(OPTIONS, select=has_eval)
    return train_and_export(Trainer, model, run, targs, data_collator=collator_for(run.tokenizer), evaluate=has_eval)
