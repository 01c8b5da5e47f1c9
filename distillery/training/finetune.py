"""Fine-tuning a teacher or a student on a sequence classification / regression task (BERT section 4.1).

Datasets arrive encoded (`input_ids`, `attention_mask`, optional `token_type_ids`, `labels`; see
`distillery.glue.encode`). The best checkpoint on the dev main score is kept (evaluated every epoch by
default) and exported to `output_dir/model`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import datasets
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments

from distillery.training.args import collator_for, train_arguments
from distillery.training.log import LOG_NAME, quiet_progress, rows_from_state, write_log
from distillery.training.metrics import MetricFn, trainer_metrics
from distillery.training.saving import last_checkpoint, save_final


def finetune(
    model: PreTrainedModel,
    train_dataset: datasets.Dataset,
    eval_dataset: datasets.Dataset | None,
    output_dir: str | os.PathLike,
    *,
    compute_metrics: MetricFn | None = None,
    main_score: Callable[[dict], float] | str | None = None,
    tokenizer=None,
    args: Mapping[str, Any] | TrainingArguments | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    resume: bool = True,
    **overrides: Any,
) -> Path:
    """Fine-tune `model` (a `*ForSequenceClassification`; `num_labels=1` means regression/MSE).

    `compute_metrics(predictions, labels) -> dict` receives class ids (or scores for regression);
    `main_score` picks the selection metric (a key, or a function of the metrics dict). With an eval set the
    best checkpoint on the main score is restored before export. Returns `output_dir/model`, which also holds
    `train_log.csv` and `metrics.json` (the dev metrics of the exported model).
    """
    if eval_dataset is not None and compute_metrics is None:
        raise ValueError("an eval_dataset needs compute_metrics(predictions, labels) to select the best model")
    # A sequence classifier's loss is its batch mean, which ignores the Trainer's token count; with
    # `average_tokens_across_devices` the Trainer would still multiply it by the number of processes, so under DDP
    # every gradient would be N times one process's (measured: clipping then trains a different model).
    targs = train_arguments(output_dir, args, eval_dataset is not None,
                            **{"average_tokens_across_devices": False, **overrides})
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator_for(tokenizer),
        processing_class=tokenizer,
        compute_metrics=trainer_metrics(compute_metrics, main_score) if compute_metrics else None,
        callbacks=list(callbacks),
    )
    quiet_progress(trainer)
    trainer.train(resume_from_checkpoint=last_checkpoint(output_dir) if resume else None)
    metrics = trainer.evaluate() if eval_dataset is not None else None
    rows = rows_from_state(trainer.state.log_history)
    return save_final(output_dir, trainer.model, tokenizer, metrics=metrics, extra=lambda d: write_log(d / LOG_NAME, rows))
