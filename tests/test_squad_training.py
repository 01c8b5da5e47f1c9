"""Span models in the training library: a `*ForQuestionAnswering` model fine-tuned and distilled with the official
EM/F1 as its dev score (issue 25, item 3, the library half).

- the prediction-layer terms on span logits equal an independent float64 implementation of their equations
  (TinyBERT eq. 10 and the gold cross-entropy, each the mean of its start and end value);
- a tiny span model learns a synthetic span task far above the question-overlap sentence baseline, through
  `finetune`, and a student distilled from it through `distill` keeps most of its F1.
"""

from __future__ import annotations

import random

import datasets
import numpy as np
import pytest
import torch
import transformers

from helpers import FAST, NEUTRAL, tokenizer
from distillery.squad.evaluate import SpanMetrics, in_feature_order, span_logits
from distillery.squad.features import FeatureConfig, prepare_eval_features, prepare_train_features
from distillery.squad.metrics import evaluate, sentence_baseline
from distillery.squad.data import gold_answers
from distillery.training.distill import Distiller, distill
from distillery.training.finetune import finetune
from distillery.training.spec import DistillSpec, TrainRun

NAMES = ["great", "good", "bad", "awful"]  # the answers: words a question asks for by its cue


def span_examples(n: int, seed: int) -> datasets.Dataset:
    """Contexts of two sentences of neutral words; one sentence holds a cue word and, right after it, the answer."""
    rng = random.Random(seed)
    rows = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    for i in range(n):
        answer = rng.choice(NAMES)
        first = " ".join(rng.choices(NEUTRAL, k=rng.randint(3, 6)))
        second = " ".join(rng.choices(NEUTRAL, k=rng.randint(3, 6)))
        cue = rng.choice(NEUTRAL)
        with_answer = f"{cue} {answer} {second}"
        context = f"{first}. {with_answer}." if rng.random() < 0.5 else f"{with_answer}. {first}."
        rows["id"].append(f"q{seed}-{i}")
        rows["title"].append("synthetic")
        rows["context"].append(context)
        rows["question"].append(f"which word follows {cue}?")
        rows["answers"].append({"text": [answer], "answer_start": [context.index(f"{cue} {answer}") + len(cue) + 1]})
    return datasets.Dataset.from_dict(rows)


def qa_model(tok, layers: int, hidden: int, seed: int) -> transformers.BertForQuestionAnswering:
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=64)
    return transformers.BertForQuestionAnswering(config)


def _log_softmax64(x: np.ndarray, real: np.ndarray) -> np.ndarray:
    """log softmax over the real entries of the last axis (the others -inf), in float64."""
    x = np.where(real, x.astype(np.float64), -np.inf)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def soft_ce64(s: np.ndarray, t: np.ndarray, real: np.ndarray) -> float:
    """-sum_c softmax(t)_c log softmax(s)_c over the real positions of the last axis, mean over the rest, in
    float64."""
    real = np.broadcast_to(real, s.shape)
    p_t = np.exp(_log_softmax64(t, real))
    return float((-np.where(real, p_t * np.where(real, _log_softmax64(s, real), 0.0), 0.0).sum(-1)).mean())


def gold_ce64(s: np.ndarray, starts: np.ndarray, ends: np.ndarray, real: np.ndarray) -> float:
    """The mean of the start and the end cross-entropy with the gold positions, softmax over real tokens."""
    real = np.broadcast_to(real, s.shape)
    logp = _log_softmax64(s, real)
    rows = np.arange(len(starts))
    return float(np.mean([-logp[rows, 0, starts].mean(), -logp[rows, 1, ends].mean()]))


def test_span_terms_match_their_equations_in_float64(tmp_path):
    tok = tokenizer(tmp_path)
    feats = prepare_train_features(span_examples(6, 0), tok, FeatureConfig(max_length=64, doc_stride=16,
                                                                           max_query_length=16))
    batch = tok.pad([{k: f[k] for k in ("input_ids", "token_type_ids", "attention_mask")} for f in feats],
                    return_tensors="pt")
    starts, ends = torch.tensor(feats["start_positions"][:]), torch.tensor(feats["end_positions"][:])
    teacher, student = qa_model(tok, 2, 32, 0).eval(), qa_model(tok, 1, 16, 1).train()
    student.config.hidden_dropout_prob = student.config.attention_probs_dropout_prob = 0.0
    student.eval()  # no dropout: the student's forward is the same in and out of the Distiller
    with torch.no_grad():
        t_out, s_out = teacher(**batch), student(**batch)
    t_np = np.stack([t_out.start_logits.numpy(), t_out.end_logits.numpy()], 1)
    s_np = np.stack([s_out.start_logits.numpy(), s_out.end_logits.numpy()], 1)
    real = batch["attention_mask"].numpy()[:, None, :] != 0
    assert not real.all()  # the batch is padded: padding must be out of both softmaxes
    for weights, expected in (
        ({"prediction_loss": 1.0}, soft_ce64(s_np, t_np, real)),  # eq. 10 on the start and on the end, averaged
        ({"hard_label_loss": 1.0}, gold_ce64(s_np, starts.numpy(), ends.numpy(), real)),
    ):
        distiller = Distiller(student, teacher, DistillSpec(weights, "prediction"))
        distiller.train()
        student.eval()
        with torch.no_grad():
            out = distiller(**batch, start_positions=starts, end_positions=ends)
        assert out.loss.item() == pytest.approx(expected, rel=1e-5), weights
        assert out.logits.shape == (len(starts), 2, batch["input_ids"].shape[1])


def test_span_logits_layouts():
    a, b = np.zeros((3, 5)), np.ones((3, 5))
    assert [x.tolist() for x in span_logits((a, b))] == [a.tolist(), b.tolist()]
    assert [x.tolist() for x in span_logits(np.stack([a, b], 1))] == [a.tolist(), b.tolist()]
    with pytest.raises(ValueError, match="span logits"):
        span_logits(a)


@pytest.mark.usefixtures("one_thread")
def test_a_span_model_learns_and_a_distilled_student_keeps_it(tmp_path):
    tok = tokenizer(tmp_path)
    config = FeatureConfig(max_length=64, doc_stride=16, max_query_length=16)
    train, dev = span_examples(400, 1), span_examples(80, 2)
    train_f = prepare_train_features(train, tok, config)
    dev_f = prepare_eval_features(dev, tok, config)
    trivial = evaluate(gold_answers(dev), sentence_baseline(dev), "1.1")

    def run(name: str, lr: float, epochs: int) -> TrainRun:
        return TrainRun(tmp_path / name, train_f, dev_f, tokenizer=tok, compute_metrics=SpanMetrics(dev, dev_f),
                        main_score="f1", args={**FAST, "learning_rate": lr, "num_train_epochs": epochs,
                                               "per_device_train_batch_size": 16, "eval_strategy": "epoch",
                                               "save_strategy": "epoch",
                                               "label_names": ["start_positions", "end_positions"]})

    teacher_dir = finetune(qa_model(tok, 2, 32, 0), run("teacher", 3e-3, 6))
    teacher_metrics = __import__("json").loads((teacher_dir / "metrics.json").read_text())
    teacher_f1 = teacher_metrics["eval_f1"]
    print(f"sentence baseline EM/F1 {trivial['exact_match']:.1f}/{trivial['f1']:.1f}; teacher "
          f"{teacher_metrics['eval_em']:.1f}/{teacher_f1:.1f}")
    assert teacher_f1 >= trivial["f1"] + 30, (teacher_metrics, trivial)

    teacher = transformers.BertForQuestionAnswering.from_pretrained(teacher_dir).eval()
    student_dir = distill(teacher, qa_model(tok, 1, 16, 3), DistillSpec({"prediction_loss": 1.0}, "prediction"),
                          run("student", 3e-3, 6))
    student = __import__("json").loads((student_dir / "metrics.json").read_text())
    print(f"student (eq. 10 on start/end logits) {student['eval_em']:.1f}/{student['eval_f1']:.1f}")
    assert student["eval_f1"] >= trivial["f1"] + 20, (student, trivial)


def test_length_grouped_training_scores_span_models_in_feature_order(tmp_path):
    """transformers 5 groups evaluation batches by length too (a seeded shuffle of length-sorted chunks). The Trainer
    then hands the input ids with the logits and the metrics put each row back beside its feature: the score it logs
    equals the same model's score on logits computed in feature order (before this: F1 6 instead of 33 on real
    SQuAD)."""
    tok = tokenizer(tmp_path)
    config = FeatureConfig(max_length=64, doc_stride=16, max_query_length=16)
    dev = span_examples(40, 2)
    dev_f = prepare_eval_features(dev, tok, config)
    assert len(set(dev_f["length"])) > 3  # lengths differ: grouping does reorder
    run = TrainRun(tmp_path / "t", prepare_train_features(span_examples(64, 1), tok, config), dev_f, tokenizer=tok,
                   compute_metrics=SpanMetrics(dev, dev_f), main_score="f1",
                   args={**FAST, "learning_rate": 3e-3, "num_train_epochs": 2, "per_device_train_batch_size": 8,
                         "per_device_eval_batch_size": 4, "train_sampling_strategy": "group_by_length",
                         "eval_strategy": "epoch", "save_strategy": "epoch",
                         "label_names": ["start_positions", "end_positions"]})
    out = finetune(qa_model(tok, 1, 16, 0), run)
    logged = __import__("json").loads((out / "metrics.json").read_text())
    model = transformers.BertForQuestionAnswering.from_pretrained(out).eval()
    width = max(dev_f["length"])
    starts, ends = [], []
    with torch.inference_mode():
        for ids, types in zip(dev_f["input_ids"], dev_f["token_type_ids"]):
            o = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
            pad = (0, width - len(ids))
            starts.append(np.pad(o.start_logits[0].numpy(), pad, constant_values=-1e4))
            ends.append(np.pad(o.end_logits[0].numpy(), pad, constant_values=-1e4))
    ordered = SpanMetrics(dev, dev_f)((np.stack(starts), np.stack(ends)))
    assert ordered["f1"] > 30  # a model that answers: a wrong pairing would show
    assert logged["eval_f1"] == pytest.approx(ordered["f1"], abs=1e-6)
    assert logged["eval_em"] == pytest.approx(ordered["em"], abs=1e-6)


def test_rows_go_back_to_their_features():
    features = {"input_ids": [[101, 5, 102], [101, 6, 7, 102], [101, 5, 102]]}  # the first and last are the same
    start = np.array([[1.0, 0, 0, -100], [2.0, 0, 0, 0], [3.0, 0, 0, -100]])
    inputs = np.array([[101, 6, 7, 102], [101, 5, 102, 0], [101, 5, 102, -100]])  # rows 2, 1, 3/1 in another order
    got, _ = in_feature_order(start, start, inputs, features)
    assert got[1, 0] == 1.0 and sorted([got[0, 0], got[2, 0]]) == [2.0, 3.0]
    with pytest.raises(ValueError, match="matches no feature"):
        in_feature_order(start, start, np.array([[101, 9, 102, 0], [101, 6, 7, 102], [101, 5, 102, 0]]), features)
