"""MLM pre-training and fine-tuning loops: they train, resume, select the best checkpoint, export cleanly."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from distillery.training import args as targs_mod
from distillery.training.finetune import finetune
from distillery.training.log import read_log
from distillery.training.metrics import accuracy
from distillery.training.mlm import masked_lm_loss, tokenize_texts, train_mlm
from distillery.training.saving import last_checkpoint
from distillery.training.spec import TrainRun

from helpers import FAST, bert_config, classifier, encoded, sentences, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)


def test_unknown_training_option_is_named(tmp_path):
    with pytest.raises(targs_mod.TrainArgsError, match="learnin_rate"):
        targs_mod.training_arguments(tmp_path, {"learnin_rate": 1e-3})


def test_tokenize_texts_pack_fills_blocks(tmp_path):
    tok = tokenizer(tmp_path)
    texts, _ = sentences(20, seed=1)
    ds = tokenize_texts(texts, tok, max_length=12, pack=True)
    lengths = [len(x) for x in ds["input_ids"]]
    assert all(n == 12 for n in lengths[:-1]) and lengths[-1] <= 12
    assert all(x[0] == tok.cls_token_id and x[-1] == tok.sep_token_id for x in ds["input_ids"])
    with pytest.raises(ValueError, match="no non-empty"):
        tokenize_texts(["", "  "], tok)


def test_train_mlm_lowers_loss_and_resumes(tmp_path):
    tok = tokenizer(tmp_path)
    texts, _ = sentences(64, seed=2)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(bert_config(tok.vocab_size, 2))
    out = tmp_path / "mlm"
    opts = dict(FAST, per_device_train_batch_size=16, learning_rate=3e-3, save_strategy="steps", save_steps=8,
                logging_steps=1)
    final = train_mlm(model, TrainRun(out, texts, tokenizer=tok, args={**opts, "max_steps": 8}), mlm_probability=0.3)
    log = read_log(final / "train_log.csv")
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 8
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert last_checkpoint(out).endswith("checkpoint-8")
    # resume: continue the same run to 12 steps from checkpoint-8; the log keeps all 12 steps
    model2 = transformers.BertForMaskedLM(bert_config(tok.vocab_size, 2))
    final = train_mlm(model2, TrainRun(out, texts, tokenizer=tok, args={**opts, "max_steps": 12}), mlm_probability=0.3)
    steps = [int(r["step"]) for r in read_log(final / "train_log.csv") if "loss" in r]
    assert steps == list(range(1, 13))
    reloaded = transformers.AutoModelForMaskedLM.from_pretrained(final)
    assert torch.equal(reloaded.bert.embeddings.word_embeddings.weight, model2.bert.embeddings.word_embeddings.weight)
    assert (final / "model.safetensors").is_file()
    assert transformers.AutoTokenizer.from_pretrained(final)("the cat")["input_ids"] == tok("the cat")["input_ids"]


def test_masked_lm_loss_sends_its_batches_to_the_model_device(tmp_path, monkeypatch):
    """A model trained on a GPU is measured there (the IB teacher's MLM loss once fed it CPU batches: a device
    mismatch on a lent H200, 2026-11-27). Here the model says its device is `meta`, and moving a tensor there is
    recorded and left on the CPU."""
    tok = tokenizer(tmp_path)
    texts, _ = sentences(10, seed=4)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(bert_config(tok.vocab_size, 1))
    cpu_loss = masked_lm_loss(model, tok, texts, max_length=16, batch_size=4)
    moved, to = [], torch.Tensor.to

    def spy(self, *args, **kwargs):
        if args and args[0] == torch.device("meta"):
            moved.append(self.shape)
            return self
        return to(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("meta")))
    monkeypatch.setattr(torch.Tensor, "to", spy)
    assert masked_lm_loss(model, tok, texts, max_length=16, batch_size=4) == pytest.approx(cpu_loss)
    assert len(moved) == 3 * 4  # input_ids, attention_mask, token_type_ids and labels of each of 3 batches


def test_train_mlm_adds_head_to_headless_checkpoint(tmp_path):
    tok = tokenizer(tmp_path)
    torch.manual_seed(0)
    base = transformers.BertModel(bert_config(tok.vocab_size, 1))
    base.save_pretrained(tmp_path / "encoder")
    texts, _ = sentences(16, seed=3)
    final = train_mlm(tmp_path / "encoder", TrainRun(tmp_path / "out", texts, tokenizer=tok,
                                                     args={"max_steps": 2, "per_device_train_batch_size": 8, **FAST}))
    model = transformers.AutoModelForMaskedLM.from_pretrained(final)
    assert isinstance(model, transformers.BertForMaskedLM)
    with pytest.raises(FileNotFoundError, match="missing"):
        train_mlm(tmp_path / "missing", TrainRun(tmp_path / "o2", texts, tokenizer=tok, args={"max_steps": 1, **FAST}))


def test_finetune_keeps_best_checkpoint(tmp_path):
    tok = tokenizer(tmp_path)
    train, dev = encoded(tok, 256, seed=4), encoded(tok, 96, seed=5)
    model = classifier(tok.vocab_size, 2)
    final = finetune(model, TrainRun(tmp_path / "ft", train, dev, tokenizer=tok, compute_metrics=accuracy,
                                     main_score="accuracy", args=dict(num_train_epochs=4, learning_rate=3e-3,
                                                                      per_device_train_batch_size=16, **FAST)))
    metrics = json.loads((final / "metrics.json").read_text())
    evals = [r for r in read_log(final / "train_log.csv") if "eval_main" in r]
    assert sorted({r["epoch"] for r in evals}) == [1.0, 2.0, 3.0, 4.0]
    assert metrics["eval_main"] == pytest.approx(max(r["eval_main"] for r in evals))
    assert metrics["eval_accuracy"] > 0.9
    end = next(r for r in read_log(final / "train_log.csv") if "train_runtime" in r)  # its FLOP/s against the
    # machine's matmul ceiling
    assert end["train_tflops"] > 0 and end["ceiling_tflops"] > 0 and 0 < end["mfu"] < 1
    assert 0 < end["padded_share"] < 1  # the sentences are padded to 16 tokens
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(final)
    batch = dev.with_format("torch")[:8]
    with torch.no_grad():
        logits = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert logits.shape == (8, 2)


def test_a_cpu_run_hides_the_objects_alive_before_it_from_the_trainers_full_collection(tmp_path):
    """`Trainer.train` starts with a full `gc.collect()` (Accelerate's `free_memory`); on a CPU the objects alive before
    the run are frozen for its length (that collection scans only the run's own) and unfrozen after it: a reference
    cycle dropped after the run is still collected."""
    import gc
    import weakref

    class Cycle:
        pass

    frozen = []

    class Watch(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            frozen.append(gc.get_freeze_count())

    cycle = Cycle()
    cycle.me = cycle
    gone = weakref.ref(cycle)
    before = gc.get_freeze_count()
    tok = tokenizer(tmp_path)
    finetune(classifier(tok.vocab_size, 2), TrainRun(tmp_path / "ft", encoded(tok, 32, seed=4), tokenizer=tok,
                                                     callbacks=[Watch()], args=dict(max_steps=2, **FAST)))
    assert frozen and frozen[0] > before + 1000, (before, frozen)  # the process's objects, the cycle among them
    assert gc.get_freeze_count() == before
    del cycle
    gc.collect()
    assert gone() is None


def test_trainer_metrics_adds_main_score_for_glue_tasks():
    import numpy as np
    from transformers import EvalPrediction

    from distillery.training.metrics import glue_metrics, trainer_metrics

    fn, main = glue_metrics("stsb")
    preds = np.array([[0.1], [2.0], [3.9], [5.0]])
    m = trainer_metrics(fn, main)(EvalPrediction(predictions=preds, label_ids=np.array([0.0, 2.5, 3.0, 4.8])))
    assert m["main"] == pytest.approx((m["pearson"] + m["spearman"]) / 2)
    fn, main = glue_metrics("sst2")
    logits = np.array([[2.0, -1.0], [0.0, 1.0], [1.0, 0.5]])
    m = trainer_metrics(fn, main)(EvalPrediction(predictions=logits, label_ids=np.array([0, 1, 1])))
    assert m["main"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="main_score"):
        trainer_metrics(lambda p, y: {"a": 1.0, "b": 2.0})(EvalPrediction(predictions=logits, label_ids=np.zeros(3)))
