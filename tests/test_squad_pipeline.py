"""A span task through the whole pipeline (issue 25, item 3): a SQuAD-format file split by article, a teacher with
a question-answering head, TinyBERT and DistilBERT students (task distillation on start/end logits) and their direct
baselines, the official EM/F1 in metrics/summary.json beside the sentence baseline, every model's dev answers in the
official predictions format, scored again by the official algorithm, the students' int8 ONNX exports scored beside
them, and the registered student answering {question, context} through its MLflow pyfunc."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from helpers import MICRO, make_project, run
from distillery.demo import NEGATIVE, NEUTRAL, POSITIVE, SUBJECTS
from distillery.squad.data import read_squad
from distillery.squad.metrics import evaluate, read_predictions


def write_squad(path: Path, articles: int = 24, paragraphs: int = 10, seed: int = 0) -> Path:
    """Paragraphs of neutral sentences with one evaluative sentence ("the film was great"); each question asks how
    one subject was, and the answer is its evaluative word: learnable, and far from the question's own words."""
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            subject, word = rng.choice(SUBJECTS), rng.choice(POSITIVE + NEGATIVE)
            sentences = [s + " ." for s in rng.sample(NEUTRAL, 3)]
            evaluative = f"{subject} was {word} ."
            sentences.insert(rng.randrange(len(sentences) + 1), evaluative)
            context = " ".join(sentences)
            start = context.index(evaluative) + len(subject) + len(" was ")
            qas = [{"id": f"a{a}p{p}q{k}", "question": q, "answers": [{"text": word, "answer_start": start}]}
                   for k, q in enumerate((f"how was {subject} ?", f"what was {subject} like ?"))]
            paras.append({"context": context, "qas": qas})
        data.append({"title": f"article {a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


SQUAD_MICRO = {
    **MICRO,
    "data": {"source": "local", "tasks": ["squad"], "max_length": 64, "doc_stride": 16,
             "max_query_length": 16, "squad_eval_articles": 2},
    "teacher_finetune": {"epochs": 6, "learning_rate": 3e-3, "batch_size": 16, "warmup_ratio": 0.1,
                         "min_gain_over_trivial": 0.2},
    "students": {"micro": MICRO["students"]["micro"],  # DistilBERT with the paper's SQuAD extra step (start/end logits)
                 "micro-distilbert": {**MICRO["students"]["micro-distilbert"], "task_distillation": True}},
    "task_distillation": {"intermediate": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 16},
                          "prediction": {"learning_rates": [3e-3], "batch_sizes": [16], "epochs": 3},
                          "finetune": {"learning_rates": [3e-3], "batch_sizes": [16], "epochs": 3}},
    "evaluation": {"latency": False, "export_onnx": True},
}


@pytest.mark.slow
def test_a_span_task_through_the_pipeline(tmp_path):
    squad_file = write_squad(tmp_path / "squad.json")
    params = {**SQUAD_MICRO, "data": {**SQUAD_MICRO["data"], "squad_file": str(squad_file)}}
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project", params, dvc_yaml=False)
    run([sys.executable, "-m", "flows.pipeline"], project)
    summary = json.loads((project / "metrics" / "summary.json").read_text())["squad"]
    trivial, teacher = summary["trivial"], summary["teacher"]
    print({name: (round(row.get("em", 0), 1), round(row.get("f1", 0), 1)) for name, row in summary.items()})
    assert teacher["passed_gate"] and teacher["f1"] >= trivial["f1"] + 20
    for name in ("micro", "micro-distilbert", "micro-direct", "micro-distilbert-direct"):
        assert {"em", "f1"} <= set(summary[name]), name
    assert "retention" in summary["micro"] and "gain_over_direct" in summary["micro"]
    for name in ("micro", "micro-distilbert"):  # the int8 ONNX students answer the same questions about as well
        assert abs(summary[name]["int8_f1"] - summary[name]["f1"]) < 10, summary[name]
    # the answers files give the report's scores under the official v1.1 algorithm
    held = read_squad(squad_file)
    gold = {}
    for article in held.articles[-2:]:
        for paragraph in article.paragraphs:
            for q in paragraph.questions:
                gold[q.id] = [text for text, _ in q.answers]
    for name in ("teacher", "micro", "micro-distilbert-direct"):
        predictions = read_predictions(project / "metrics" / "answers" / "squad" / name / "predictions.json")
        assert set(predictions) == set(gold)
        scores = evaluate(gold, predictions, "1.1")
        assert scores["exact_match"] == pytest.approx(summary[name]["em"]) and scores["f1"] == pytest.approx(
            summary[name]["f1"])

    # the registered champion answers raw questions about a raw context, as the evaluate stage's answers
    article = held.articles[-1].paragraphs[0]
    uri = json.loads((project / "metrics" / "registry" / "micro-squad.json").read_text())["uri"]  # its alias in force
    code = ("import json, mlflow, sys, pandas as pd; mlflow.set_tracking_uri(sys.argv[1]);"
            "m = mlflow.pyfunc.load_model(sys.argv[3]);"
            "q = json.loads(sys.argv[2]);"
            "print(m.predict(pd.DataFrame({'question': [q['question']], 'context': [q['context']]})).to_json("
            "orient='records'))")
    question = article.questions[0]
    asked = json.dumps({"question": question.question, "context": article.context})
    out = run([sys.executable, "-c", code, f"sqlite:///{project / 'mlflow.db'}", asked, uri], project).stdout
    [answer] = json.loads(out.strip().splitlines()[-1])
    assert set(answer) == {"answer", "score", "start", "end"} and 0 < answer["score"] <= 1
    assert article.context[answer["start"]:answer["end"]] == answer["answer"]
    served = read_predictions(project / "metrics" / "answers" / "squad" / "micro" / "predictions.json")[question.id]
    assert answer["answer"] == served
