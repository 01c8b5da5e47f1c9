"""One process of tests/test_distributed.py (run alone, or as a rank under torchrun):

    python tests/ddp_worker.py OUT                                            # one process
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/ddp_worker.py OUT

Augmentation (TinyBERT Algorithm 1 in shards, the shards split across the ranks), general distillation (TinyBERT
intermediate layers, a classifier student whose head no objective reads), then task distillation (the
prediction-layer grid with the teacher-logit cache), then fine-tuning, then MobileBERT's progressive knowledge
transfer, of micro BERTs on generated
data, with a global batch of 8 split across the processes. Dropout is off and every model is built from a fixed
seed, so one process and N processes see the same batches and the same models. Each process saves its own final
weights (student, projection, task student, fine-tuned model, transferred MobileBERT) to OUT/state-<world size>-rank<rank>.safetensors; the
library's outputs go to OUT/run-<world size>/. The test writes OUT/vocab.txt and OUT/glove.txt first. `body` is a stage body for the launcher test (tasks.launch).
"""

from __future__ import annotations

import sys
from pathlib import Path

GLOBAL_BATCH = 8
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
ARGS = dict(disable_tqdm=True, logging_steps=1, save_strategy="no", dataloader_num_workers=0, seed=0)
EVAL = dict(eval_strategy="epoch", load_best_model_at_end=False, per_device_eval_batch_size=16)


def body(p, item):
    """A stage body for `tasks.launch`: what each rank saw (rank 0's answer comes back)."""
    from distillery.errors import UserError
    from distillery.training.distributed import per_device_batch, rank, world_size

    from tasks.stage import SkipStage

    if item == "fail":
        raise UserError("a user error on every rank")
    if item == "skip":
        raise SkipStage("nothing to do for this item", "nothing to do")
    return {"rank": rank(), "world": world_size(), "per_device": per_device_batch(p.general_distillation.batch_size),
            "params": p.model_dump(mode="json")}


def main(out: Path) -> None:
    import torch
    import transformers
    from safetensors.torch import save_file

    from distillery.augment import AugmentConfig, augment_dataset
    from distillery.augment.glove import load_word_vectors
    from distillery.ib_teacher import convert_bert
    from distillery.layer_map import build_layer_map
    from distillery.shape import resolve_shape
    from distillery.training.distill import distill, make_projection
    from distillery.training.distributed import per_device_batch, rank, world_size
    from distillery.training.finetune import finetune
    from distillery.training.grid import prediction_grid
    from distillery.training.progressive_transfer import progressive_transfer, student_from_teacher
    from distillery.training.metrics import accuracy
    from distillery.training.spec import DistillSpec, Grid, TrainRun
    from helpers import bert_config, encoded, sentences

    MOBILE = resolve_shape({"preset": "mobilebert-tiny", "layers": 2, "hidden": 32, "heads": 2, "intermediate": 16,
                            "extra": {"intra_bottleneck_size": 8, "embedding_size": 32, **NO_DROPOUT}})
    torch.set_num_threads(1)
    world = world_size()
    run = out / f"run-{world}"
    tok = transformers.BertTokenizerFast(vocab=str(out / "vocab.txt"), do_lower_case=True)
    vocab = len(tok)

    def model(layers: int, seed: int, **kw):
        torch.manual_seed(seed)
        return transformers.BertForSequenceClassification(bert_config(vocab, layers, num_labels=2, **NO_DROPOUT, **kw))

    # augmentation: 10 sentences in shards of 3, shard i on rank i % N; rank 0 joins them
    torch.manual_seed(0)
    mlm = transformers.BertForMaskedLM(bert_config(vocab, 1, **NO_DROPOUT)).eval()
    texts, labels = sentences(10, seed=5)
    augment_dataset([{"text_a": t, "label": y} for t, y in zip(texts, labels)], "sst2", mlm, tok,
                    load_word_vectors(out / "glove.txt", use_cache=False), AugmentConfig(n_aug=3, seed=1, chunk_size=3),
                    run / "augmented.tsv", progress=False, shards=run / "augment-shards")

    train, dev = encoded(tok, 64, seed=1), encoded(tok, 32, seed=2)
    corpus = train.select_columns(["input_ids", "attention_mask", "token_type_ids"])
    batch = dict(per_device_train_batch_size=per_device_batch(GLOBAL_BATCH), num_train_epochs=1)

    # general distillation: student + projection wrapped by DDP, teacher replicated without gradients
    teacher = model(4, seed=1).eval()
    student = model(2, seed=2, hidden=24, inter=48)
    lm = build_layer_map("uniform", 2, 4)
    projection = make_projection(student, teacher, lm)
    state = {f"init.{k}": v.clone() for k, v in student.state_dict().items()}
    seen = torch.zeros(1, dtype=torch.int64)  # examples this process's student trained on: its share of the data
    hook = student.register_forward_hook(lambda m, a, kw, o: seen.add_(kw["input_ids"].shape[0]), with_kwargs=True)
    tinybert = {"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}
    general = distill(teacher, student, DistillSpec(tinybert, "intermediate", lm, projection=projection),
                      TrainRun(run / "general", corpus, tokenizer=tok, args={"learning_rate": 5e-3, **batch, **ARGS}))

    hook.remove()
    state["examples_seen"] = seen
    assert torch.distributed.is_initialized() == (world > 1)

    # task distillation: the prediction-layer grid (one run) from the general student, teacher logits cached once
    made = []

    def task_student():
        transformers.set_seed(3)  # the fresh classifier head: the same on every rank and in one process
        made.append(transformers.AutoModelForSequenceClassification.from_pretrained(str(general), num_labels=2))
        return made[-1]

    task = TrainRun(run / "grid", train, dev, tokenizer=tok, compute_metrics=accuracy, main_score="accuracy",
                    args={**EVAL, **ARGS})
    prediction_grid(teacher, task_student, DistillSpec({"prediction_loss": 1.0}, "prediction"), task,
                    Grid((3e-3,), (GLOBAL_BATCH,), epochs=1))

    # fine-tuning (the teacher and baseline stages' loop)
    tuned = model(2, seed=4)
    finetune(tuned, task.with_(output_dir=run / "finetune", args={"learning_rate": 3e-3, **batch}))

    # MobileBERT progressive knowledge transfer (one layer per stage, lower layers at 0.1x) from an IB teacher
    # converted from a micro BERT: the `knowledge_transfer` stage's loop, a new DDP wrapper per layer stage
    torch.manual_seed(6)
    ib = convert_bert(transformers.BertForMaskedLM(bert_config(vocab, 2, **NO_DROPOUT)), MOBILE).eval()
    mobile = student_from_teacher(MOBILE, ib, head="mlm")
    state.update({f"transfer-init.{k}": v.clone() for k, v in mobile.state_dict().items()})
    progressive_transfer(ib, mobile, DistillSpec({"feature_map_loss": 1.0, "attention_transfer_loss": 1.0}),
                         TrainRun(run / "transfer", corpus, tokenizer=tok,
                                  args={"per_device_train_batch_size": per_device_batch(GLOBAL_BATCH),
                                        "learning_rate": 5e-3, **ARGS}),
                         epochs=2)

    for prefix, module in (("general", student), ("projection", projection), ("task", made[0]),
                           ("finetune", tuned), ("transfer", mobile)):
        state.update({f"{prefix}.{k}": v for k, v in module.state_dict().items()})
    save_file({k: v.detach().cpu().clone() for k, v in state.items()},  # clone: tied weights share storage
              str(out / f"state-{world}-rank{rank()}.safetensors"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
