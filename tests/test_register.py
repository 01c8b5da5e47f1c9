"""The gated registry (tasks/register.py), on tiny models under a temporary MLflow sqlite store.

A student is registered from what the pipeline leaves on disk (its model directory, the prepared task and
metrics/eval/<task>.json, here written by the test): every version is a `candidate`, `champion` moves only to
a better one; versions carry their metrics, provenance and a model card; the pyfunc model uses both sentences
of a pair and answers scores for STS-B.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers

from distillery.config import parse_params

WORDS = "the a movie film good bad great plot acting story dull charming it was is not cat sat on mat".split()
TASKS = ("mrpc", "stsb")


def params(margin: float = 0.0, student: str = "tiny", **data):
    return parse_params({
        "data": {"source": "local", "glue_dir": "unused", "tasks": list(TASKS), "max_length": 16, **data},
        "teacher": {"init": "scratch", "shape": {"layers": 2, "hidden": 16, "heads": 2, "intermediate": 32}},
        "students": {student: {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2,
                                                                "intermediate": 32}}},
        "registry": {"promote_margin": margin},
    })


def save_tiny_model(out: Path, head, **config) -> None:
    """A 1-layer BERT with `head` (a transformers model class) and its tokenizer over WORDS, saved to `out`."""
    out.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "."] + WORDS
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = transformers.BertTokenizerFast(vocab=str(out / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64, **config)
    head(cfg).save_pretrained(out)
    tok.save_pretrained(out)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """tasks.paths pointed at a temporary project with a student per task, the prepared tasks and MLflow."""
    import datasets
    import mlflow

    from distillery.glue import get_task
    from tasks import paths

    root = tmp_path_factory.mktemp("registry")
    mp = pytest.MonkeyPatch()
    for name, sub in (("ROOT", None), ("DATA", "data"), ("MODELS", "models"), ("METRICS", "metrics")):
        mp.setattr(paths, name, root / sub if sub else root)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mp.chdir(root)  # MLflow's default artifact root is ./mlruns
    for task in TASKS:
        spec = get_task(task)
        save_tiny_model(paths.student("tiny", task) / "model", transformers.BertForSequenceClassification,
                        num_labels=spec.num_labels)
        dev = datasets.Dataset.from_dict({"text_a": ["the movie was good", "the cat sat"],
                                          "text_b": ["the film was great", "on the mat"],
                                          "label": [1.0, 0.0] if spec.is_regression else [1, 0], "idx": [0, 1]})
        datasets.DatasetDict({"train": dev, "dev": dev}).save_to_disk(str(paths.task_data(task)))
    yield root
    mlflow.set_tracking_uri(None)
    mp.undo()


def write_eval(task: str, main: float, direct: float | None = None) -> None:
    from tasks import paths

    metric = {"mrpc": {"accuracy": main, "f1": main}, "stsb": {"pearson": main, "spearman": main}}[task]
    paths.evaluation(task).parent.mkdir(parents=True, exist_ok=True)
    paths.evaluation(task).write_text(json.dumps({
        "teacher": {"main": 0.9, "params": 1000},
        "tiny": {**metric, "main": main, "params": 100, "flops": 1000, "int8_main_change": -0.01,
                 "latency_ms_b1": 1.5, "speedup_b1": 3.0},
        **({"tiny-direct": {**metric, "main": direct, "baseline_of": "tiny"}} if direct is not None else {}),
    }))


def register(task: str, main: float, margin: float = 0.0, direct: float | None = None) -> dict:
    import mlflow

    from tasks import paths
    from tasks.register import run_register

    write_eval(task, main, direct)
    with mlflow.start_run():
        run_register(params(margin), f"tiny:{task}")
    return json.loads(paths.registry("tiny", task).read_text())


def aliases(name: str) -> dict[str, str]:
    import mlflow

    return {a: str(v) for a, v in mlflow.MlflowClient().get_registered_model(name).aliases.items()}


def test_a_worse_student_does_not_become_champion(project, capsys):
    first = register("mrpc", 0.80)
    assert first["promoted"] and aliases("tiny-mrpc") == {"candidate": "1", "champion": "1"}
    worse = register("mrpc", 0.70)  # a deliberately degraded run: its eval file says 0.70
    assert not worse["promoted"] and worse["alias"] == "candidate" and worse["champion_version"] == 1
    assert aliases("tiny-mrpc") == {"candidate": "2", "champion": "1"}
    assert "not promoted: dev main 0.7000 does not beat the champion (version 1) 0.8000" in capsys.readouterr().out
    tie = register("mrpc", 0.80)  # a tie keeps the champion
    assert not tie["promoted"] and aliases("tiny-mrpc")["champion"] == "1"
    assert not register("mrpc", 0.85, margin=0.1)["promoted"]  # better, but not by the margin
    better = register("mrpc", 0.90)
    assert better["promoted"] and aliases("tiny-mrpc") == {"candidate": "5", "champion": "5"}
    again = register("mrpc", 0.90)  # evaluate re-ran, same model and scores: no new version
    assert again["version"] == 5 and "nothing new registered" in again["reason"]
    assert aliases("tiny-mrpc") == {"candidate": "5", "champion": "5"}


def test_version_tags_signature_and_model_card(project):
    import mlflow

    register("stsb", 0.60)
    client = mlflow.MlflowClient()
    version = client.get_model_version_by_alias("tiny-stsb", "candidate")
    tags = version.tags
    assert float(tags["dev.main"]) == 0.6 and float(tags["dev.pearson"]) == 0.6
    assert float(tags["retention"]) == pytest.approx(0.6 / 0.9, rel=1e-4)
    assert float(tags["int8.main_change"]) == -0.01 and tags["promoted"] == "true"
    assert len(tags["params_sha256"]) == 64
    for name in ("model", "eval", "teacher", "task_data"):
        assert f"inputs.{name}.sha256" in tags
    assert len(tags["inputs.eval.sha256"]) == 64  # the eval file exists; the teacher does not here ("missing")
    info = mlflow.models.get_model_info(f"models:/tiny-stsb/{version.version}")
    assert info.signature.inputs.input_names() == ["text", "text_pair"]
    assert [c.name for c in info.signature.outputs.inputs] == ["score"]
    local = Path(mlflow.artifacts.download_artifacts(f"models:/tiny-stsb/{version.version}"))
    assert (local / "serving_input_example.json").is_file() and "text_pair" in (local / "input_example.json").read_text()
    card = next(local.rglob("README.md")).read_text()
    assert card.startswith("---\n") and "model-index" in card and "pearson" in card and "tinybert" in card


def test_pyfunc_uses_both_sentences_and_the_task_labels(project):
    import mlflow

    register("mrpc", 0.95)
    model = mlflow.pyfunc.load_model("models:/tiny-mrpc@champion")
    out = model.predict(pd.DataFrame({"text": ["the movie was good", "the movie was good"],
                                      "text_pair": ["the film was great", "the cat sat on the mat"]}))
    assert list(out.columns) == ["label", "score"] and set(out["label"]) <= {"0", "1"}
    assert out["score"][0] != out["score"][1], "the second sentence did not change the prediction"
    with pytest.raises(Exception, match="text_pair"):
        model.predict(["the movie was good"])  # a pair model needs pairs
    with pytest.raises(Exception, match="row 1: text_pair is nan, not a text"):  # never scored as an empty text
        model.predict(pd.DataFrame({"text": ["the movie", "the film"], "text_pair": ["was good", None]}))


def test_stsb_pyfunc_answers_float_scores(project):
    import mlflow

    register("stsb", 0.99)
    model = mlflow.pyfunc.load_model("models:/tiny-stsb@champion")
    out = model.predict(pd.DataFrame({"text": ["the cat sat", "the movie"], "text_pair": ["on the mat", "was dull"]}))
    assert list(out.columns) == ["score"] and out["score"].dtype == "float64"
    assert out["score"][0] != out["score"][1]


@pytest.mark.parametrize("threshold,empty", [(-1e6, True), (1e6, False)])
def test_a_squad_v2_reader_answers_with_its_dev_tuned_null_threshold(project, threshold, empty):
    """The registered v2.0 reader takes the student's dev best-F1 null-odds threshold from metrics/eval: far below
    every question's null odds it answers "" (no answer), far above it always answers a span of the context."""
    import datasets
    import mlflow

    from tasks import paths
    from tasks.register import run_register

    task, name = "squad_v2", f"tiny{'-empty' if empty else ''}"
    save_tiny_model(paths.student(name, task) / "model", transformers.BertForQuestionAnswering)
    context = "the cat sat on the mat . the movie was good"
    dev = datasets.Dataset.from_dict({"id": ["q0"], "title": ["t"], "context": [context], "question": ["who sat ?"],
                                      "answers": [{"text": ["the cat"], "answer_start": [0]}]})
    datasets.DatasetDict({"train": dev, "dev": dev}).save_to_disk(str(paths.task_data(task)))
    paths.evaluation(task).parent.mkdir(parents=True, exist_ok=True)
    paths.evaluation(task).write_text(json.dumps({
        "teacher": {"main": 0.7, "em": 60.0, "f1": 70.0},
        name: {"em": 50.0, "f1": 60.0, "main": 0.6, "best_f1": 61.0, "best_f1_thresh": threshold, "params": 100}}))
    with mlflow.start_run():
        run_register(params(student=name, max_length=32, doc_stride=8, max_query_length=8), f"{name}:{task}")
    record = json.loads(paths.registry(name, task).read_text())
    assert float(record["metrics"]["null_threshold"]) == threshold
    model = mlflow.pyfunc.load_model(f"models:/{name}-{task}@champion")
    assert model.model_config["null_threshold"] == threshold
    [answer] = model.predict(pd.DataFrame({"question": ["who sat ?"], "context": [context]})).to_dict("records")
    if empty:
        assert (answer["answer"], answer["start"], answer["end"]) == ("", 0, 0)
    else:
        assert answer["answer"] and context[answer["start"]:answer["end"]] == answer["answer"]


def test_a_student_that_loses_to_its_direct_baseline_is_never_champion(project, capsys):
    """Better than every champion so far, but not better than the same student trained without the teacher: it is
    registered (a candidate, tagged with why) and never gets `champion`."""
    import mlflow

    from tasks.register import promotion

    assert promotion(0.8, None, None, 0.0, direct_main=0.8) == (
        False, "not promoted: dev main 0.8000 does not beat its direct baseline 0.8000 (the same student without "
               "distillation); it stays the candidate")
    assert promotion(0.81, None, None, 0.0, direct_main=0.8)[0]
    before = aliases("tiny-stsb").get("champion") if _registered("tiny-stsb") else None
    loser = register("stsb", 0.9990, direct=0.9995)
    assert not loser["promoted"] and loser["alias"] == "candidate"
    assert "does not beat its direct baseline 0.9995" in loser["reason"] in capsys.readouterr().out
    assert (aliases("tiny-stsb").get("champion") if before else None) == before
    version = mlflow.MlflowClient().get_model_version("tiny-stsb", str(loser["version"]))
    assert version.tags["promoted"] == "false" and "direct baseline" in version.tags["promotion"]
    assert version.tags["direct.dev.main"] == "0.9995"
    winner = register("stsb", 0.9999, direct=0.9995)
    assert winner["promoted"] and aliases("tiny-stsb")["champion"] == str(winner["version"])


def _registered(name: str) -> bool:
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        mlflow.MlflowClient().get_registered_model(name)
    except MlflowException:
        return False
    return True


@pytest.mark.parametrize("form", ["bf16", "int8"])
def test_the_pyfunc_serves_the_deployed_form_a_budget_search_chose(tmp_path, form):
    """`model_config.form`: int8 runs the int8 ONNX export on ONNX Runtime (the model artifact without its fp32
    weights), bf16 the PyTorch model under bf16 autocast; both give the fp32 model's labels, with close scores."""
    from types import SimpleNamespace

    from distillery.efficiency.export import export_onnx, quantize_onnx
    from distillery.precision import bf16_supported
    from tasks.pyfunc_classifier import SequenceClassifier

    if form == "bf16" and not bf16_supported("cpu"):
        pytest.skip("no fast bf16 on this CPU")
    model_dir = tmp_path / "model"
    save_tiny_model(model_dir, transformers.BertForSequenceClassification, num_labels=2)
    artifacts = {"model": str(model_dir)}
    if form == "int8":
        export_onnx(model_dir, tmp_path / "model.onnx")
        artifacts["onnx"] = str(quantize_onnx(tmp_path / "model.onnx", tmp_path / "model.int8.onnx"))
        for weights in model_dir.glob("*.safetensors"):
            weights.unlink()  # as the register stage stages it: the int8 model needs no fp32 weights
    texts = pd.DataFrame({"text": ["the movie was good", "a dull plot", "the cat sat on the mat", "great acting"]})
    served, fp32 = SequenceClassifier(), SequenceClassifier()
    served.load_context(SimpleNamespace(artifacts=artifacts, model_config={"labels": ["bad", "good"], "form": form}))
    out = served.predict(None, texts)
    assert (form == "int8") == (not hasattr(served, "model"))
    if form == "int8":
        save_tiny_model(tmp_path / "fp32", transformers.BertForSequenceClassification, num_labels=2)
    fp32.load_context(SimpleNamespace(artifacts={"model": str(tmp_path / "fp32" if form == "int8" else model_dir)},
                                      model_config={"labels": ["bad", "good"]}))
    ref = fp32.predict(None, texts)
    assert list(out["label"]) == list(ref["label"]) and set(out["label"]) <= {"bad", "good"}
    assert out["score"].to_numpy() == pytest.approx(ref["score"].to_numpy(), abs=0.02)
