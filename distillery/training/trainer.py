"""The Trainer tail every loop shares (fine-tuning, MLM, distillation): build the Hugging Face ``Trainer`` from a
``TrainRun``, train (resuming from the newest complete checkpoint under ``output_dir/checkpoints``), evaluate on dev
when there is one, and export ``output_dir/model`` with its ``train_log.csv`` (``distillery.training.saving``).
"""

from __future__ import annotations

import copy
import gc
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from transformers import PreTrainedModel, Trainer, TrainingArguments

from distillery import precision
from distillery.efficiency.ceiling import StepFlops, utilisation
from distillery.runtime import FreeCores, steady_allocator
from distillery.training import cpu_kernels, sparse_prediction, unpadding
from distillery.training.log import LOG_NAME, quiet_progress, rows_from_state, write_log
from distillery.training.metrics import trainer_metrics
from distillery.training.saving import last_checkpoint, save_final
from distillery.training.spec import TrainRun


def train_and_export(
    trainer_cls: type[Trainer],
    model: torch.nn.Module,
    run: TrainRun,
    targs: TrainingArguments,
    *,
    data_collator: Callable[[list[dict]], dict],
    evaluate: bool,
    export: PreTrainedModel | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Train ``model`` on ``run.train_dataset`` and write ``run.output_dir/model``; return that directory.

    ``evaluate``: give the Trainer ``run.eval_dataset`` (and ``run.compute_metrics`` with ``run.main_score``) and
    evaluate the final model, whose dev metrics go to ``metrics.json``. ``export``: the model saved (default the
    Trainer's model; the student for a ``Distiller``). ``extra(dir)`` writes more files into the export.
    ``run.param_groups``: the only parameters trained, each at its own learning-rate scale (``scaled_adamw``). On a
    CPU the model and its teacher run `distillery.training.cpu_kernels`' kernels while they train, and unpadded
    (`distillery.training.unpadding`) where nothing the training reads is padded; a masked LM trained directly
    predicts its labelled positions alone (`distillery.training.sparse_prediction`)."""
    teacher = getattr(model, "teacher", None)  # a Distiller's: it only infers
    for m, trains in ((model, True), (export, True), (teacher, False)):
        precision.fast_attention(m, targs.device, "bf16" if targs.bf16 else "fp32", training=trains)
    optimizer = scaled_adamw(run.param_groups, targs) if run.param_groups is not None else None
    metric_fn = run.compute_metrics if evaluate else None
    if getattr(metric_fn, "takes_logits", False) and targs.train_sampling_strategy == "group_by_length":
        # transformers 5 orders evaluation batches by length too: the input ids put span logits back in feature order
        targs = copy.copy(targs)
        targs.include_for_metrics = sorted({*targs.include_for_metrics, "inputs"})
    trainer = trainer_cls(
        model=model,
        args=targs,
        train_dataset=run.train_dataset,
        eval_dataset=run.eval_dataset if evaluate else None,
        data_collator=data_collator,
        processing_class=run.tokenizer,
        compute_metrics=trainer_metrics(metric_fn, run.main_score) if metric_fn is not None else None,
        callbacks=[*run.callbacks, FreeCores()],
        optimizers=(optimizer, None),
    )
    quiet_progress(trainer)
    counted = step_flops(model)
    trainer.floating_point_ops = counted  # the Trainer counts each step's FLOPs through this method
    if targs.device.type == "cpu":
        steady_allocator()  # no page faults afresh at every step (distillery.runtime)
    started = time.perf_counter()
    with _collect_only_new_objects(targs.device), ExitStack() as kernels:
        for m in (model, teacher):  # on a CPU: cheaper dropout, attention, bias
            kernels.enter_context(cpu_kernels.used(m, targs.device))
        if not unpadding.reads_padding(model):  # on a CPU: the layers on the real tokens alone, counted so
            counted.unpadded = any([kernels.enter_context(unpadding.used(m, targs.device)) for m in (model, teacher)])
        counted.sparse = kernels.enter_context(sparse_prediction.used(model))  # a masked LM's head where it is read
        trainer.train(resume_from_checkpoint=last_checkpoint(run.output_dir) if run.resume else None)
    seconds = time.perf_counter() - started
    metrics = trainer.evaluate() if evaluate else None
    rows = rows_from_state(trainer.state.log_history)
    ends = [r for r in rows if "train_runtime" in r]
    if ends:  # the run's end row: its FLOP/s against this machine's matmul ceiling
        ends[-1].update(utilisation(counted, seconds, bf16=targs.bf16, device=targs.device.type))

    def write(d: Path) -> None:
        write_log(d / LOG_NAME, rows)
        if extra is not None:
            extra(d)

    return save_final(run.output_dir, export if export is not None else trainer.model, run.tokenizer,
                      metrics=metrics, extra=write)


def step_flops(model: torch.nn.Module) -> StepFlops:
    """The FLOP counter of a run's steps: the student (a `Distiller`'s, else the model) and the teacher when its
    forward runs for a batch (`Distiller.runs_teacher`)."""
    student = getattr(model, "student", model)
    return StepFlops(student, getattr(model, "teacher", None), getattr(model, "runs_teacher", None))


@contextmanager
def _collect_only_new_objects(device: torch.device):
    """``Trainer.train`` begins with Accelerate's ``free_memory``: a full ``gc.collect()`` to give a device's memory
    back. On a CPU there is no device cache to give back, and the collection scans every object of the process (a
    pipeline process holds Prefect's, MLflow's and transformers' too), longer than a small run's training. There the
    objects alive before the run are frozen (``gc.freeze``) for its length, so the collection scans only the run's
    own; unfrozen after it, their cyclic garbage is collected as before. Runs in parallel threads share the process's
    one freeze: the first to end unfreezes it, which costs the others speed, never memory."""
    if device.type != "cpu":
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def scaled_adamw(param_groups: Sequence[Mapping[str, Any]], args: TrainingArguments) -> torch.optim.AdamW:
    """AdamW over `[{"params": [...], "lr_scale": s}, ...]`: each group at `s` x `args.learning_rate`, weight decay on
    matrices only (not on biases and normalisation vectors, like the Trainer's default), the arguments' betas/eps."""
    groups = []
    for g in param_groups:
        params = [p for p in g["params"] if p.requires_grad]
        lr = args.learning_rate * float(g.get("lr_scale", 1.0))
        for decay in (True, False):
            chosen = [p for p in params if (p.dim() >= 2) == decay]
            if chosen:
                groups.append({"params": chosen, "lr": lr, "weight_decay": args.weight_decay if decay else 0.0})
    if not groups:
        raise ValueError("param_groups: no trainable parameter")
    return torch.optim.AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                             eps=args.adam_epsilon, fused=args.optim == "adamw_torch_fused" or None)
