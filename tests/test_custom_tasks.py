"""Tasks of your own (issue 40): params under `data.custom`, files in four formats and a Hub dataset in the Hub's
layout, one `error:` line naming the file and line for every bad input, and one path proven equal to the GLUE
loader on a slice of a real GLUE task (read from ../shared at test time, skipped when absent)."""

from __future__ import annotations

import csv
import re
import json
import math
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distillery import custom_tasks
from distillery.config import ConfigError, parse_params
from distillery.preflight import register_custom_tasks
from distillery.glue import compute_metrics, format_predictions, get_task, load_local, main_score

SHARED_GLUE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glue"


def params(tmp_path: Path, custom: dict, tasks: list[str] | None = None):
    """Parsed, and the tasks registered (as every load of a params file registers them: `distillery.preflight`)."""
    path = str(tmp_path / "params.yaml")
    return register_custom_tasks(parse_params({
        "data": {"source": "demo", "tasks": tasks or list(custom), "custom": custom},
        "teacher": {"init": "scratch", "shape": {"layers": 2, "hidden": 16, "heads": 2, "intermediate": 32}},
        "students": {"tiny": {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2,
                                                              "intermediate": 32}}}}, path), path)


def write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def tickets(tmp_path: Path, **over) -> dict:
    train = write_csv(tmp_path / "tickets" / "train.csv", ["body", "queue"],
                      [["my card was charged twice", "billing"], ["the app crashes, on start", "bug"],
                       ["how do I change my name", "other"], ["refund please", "billing"]])
    dev = write_csv(tmp_path / "tickets" / "dev.csv", ["body", "queue"],
                    [["charged again", "billing"], ["it crashes", "bug"]])
    test = write_csv(tmp_path / "tickets" / "test.csv", ["body"], [["where is my invoice"], ["blank screen"]])
    return {"train": str(train), "validation": str(dev), "test": str(test), "text": "body", "label": "queue",
            "metric": "macro_f1", **over}


def test_a_csv_task_is_a_registry_task_with_its_label_names(tmp_path):
    p = params(tmp_path, {"tickets": tickets(tmp_path)})
    spec = get_task("tickets")
    assert spec.labels == ("billing", "bug", "other")  # sorted labels of the training split
    assert spec.metrics == ("accuracy", "macro_f1") and spec.main_metric == "macro_f1" and not spec.is_pair
    dsd = custom_tasks.load("tickets", p.data.custom["tickets"], tmp_path)
    assert list(dsd) == ["train", "dev", "test"]
    assert dsd["train"]["label"][:] == [0, 1, 2, 0] and dsd["train"]["text_a"][1] == "the app crashes, on start"
    assert dsd["test"]["label"][:] == [-1, -1] and dsd["test"]["idx"][:] == [0, 1]
    scores = compute_metrics("tickets", [0, 0], dsd["dev"]["label"][:])
    assert scores == {"accuracy": 0.5, "macro_f1": pytest.approx((2 / 3 + 0 + 0) / 3)}
    assert main_score("tickets", scores) == scores["macro_f1"]
    assert format_predictions("tickets", [2, 1]) == ["other", "bug"]  # test predictions carry the label names


def test_params_label_order_integer_labels_and_every_format(tmp_path):
    rows = [{"q": f"question {i}", "a": f"answer {i}", "y": ["no", "yes"][i % 2]} for i in range(6)]
    jsonl = write_jsonl(tmp_path / "pairs.jsonl", rows)
    tsv = write_csv(tmp_path / "pairs.tsv", ["q", "a", "y"], [[r["q"], r["a"], r["y"]] for r in rows], "\t")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pairs.parquet")
    ints = write_csv(tmp_path / "ints.csv", ["t", "y"], [["a", 10], ["b", 2], ["c", 2]])
    custom = {f"pairs-{fmt}": {"train": str(path), "validation": str(path), "text": "q", "text_pair": "a",
                               "label": "y", "labels": ["yes", "no"], "metric": "f1"}
              for fmt, path in (("jsonl", jsonl), ("tsv", tsv), ("parquet", tmp_path / "pairs.parquet"))}
    custom["ints"] = {"train": str(ints), "validation": str(ints), "text": "t", "label": "y"}
    p = params(tmp_path, custom)
    prepared = [custom_tasks.load(n, p.data.custom[n], tmp_path)["train"] for n in custom if n != "ints"]
    assert all(d.to_dict() == prepared[0].to_dict() for d in prepared)
    assert prepared[0]["label"][:] == [1, 0, 1, 0, 1, 0] and prepared[0]["text_b"][0] == "answer 0"  # params order
    assert get_task("pairs-jsonl").is_pair and get_task("ints").labels == ("2", "10")  # numbers sort as numbers


def test_a_regression_task_from_jsonl(tmp_path):
    train = write_jsonl(tmp_path / "r.jsonl", [{"s": "a b", "score": 0.5}, {"s": "c", "score": "7"},
                                               {"s": "d", "score": -2}])
    p = params(tmp_path, {"scores": {"train": str(train), "validation": str(train), "text": "s", "label": "score",
                                     "type": "regression"}})
    spec = get_task("scores")
    assert spec.is_regression and spec.metrics == ("pearson", "spearman") and spec.main_metric == "pearson_spearman"
    ds = custom_tasks.load("scores", p.data.custom["scores"], tmp_path)["dev"]
    assert ds["label"][:] == [0.5, 7.0, -2.0]
    assert format_predictions("scores", [[9.1234]]) == ["9.123"]  # not clipped to STS-B's [0, 5]


def imdb_repo(tmp_path: Path) -> Path:
    """A small dataset repository in the Hub's layout of stanfordnlp/imdb: data/<split>-*.parquet, a ClassLabel."""
    repo = tmp_path / "imdb"
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    for split, n in (("train", 6), ("test", 4)):
        ds = datasets.Dataset.from_dict({"text": [f"review {i}" for i in range(n)], "label": [i % 2 for i in range(n)]},
                                        features=features)
        (repo / "data").mkdir(parents=True, exist_ok=True)
        ds.to_parquet(str(repo / "data" / f"{split}-00000-of-00001.parquet"))
    return repo


def test_a_hub_dataset_in_the_hubs_layout(tmp_path):
    """A dataset repository's layout (data/<split>-*.parquet, a ClassLabel label) through `datasets.load_dataset`:
    the ClassLabel's names are the labels, in its order; our validation split is the Hub's test split."""
    repo = imdb_repo(tmp_path)
    p = params(tmp_path, {"imdb": {"hub": str(repo), "splits": {"train": "train", "validation": "test"},
                                   "text": "text", "label": "label"}})
    assert get_task("imdb").labels == ("neg", "pos")
    dsd = custom_tasks.load("imdb", p.data.custom["imdb"], tmp_path)
    assert list(dsd) == ["train", "dev"] and dsd["dev"]["label"][:] == [0, 1, 0, 1]
    assert custom_tasks.inputs(p.data.custom["imdb"], tmp_path) == []


def test_the_distilbert_paper_presets_imdb_from_a_repository_in_the_hubs_layout(tmp_path):
    """params/paper-distilbert6.yaml's IMDb entry, its Hub name swapped for a local repository of the same layout:
    the paper's test split is our dev split, its label names neg/pos, its own 512-token windows."""
    import yaml

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "params" / "paper-distilbert6.yaml").read_text())
    assert raw["data"]["custom"]["imdb"]["hub"] == "stanfordnlp/imdb" and "imdb" in raw["data"]["tasks"]
    imdb = {**raw["data"]["custom"]["imdb"], "hub": str(imdb_repo(tmp_path))}
    p = register_custom_tasks(parse_params({**raw, "data": {**raw["data"], "source": "demo", "tasks": ["imdb"],
                                                           "custom": {"imdb": imdb}},
                                            "per_task": {"imdb": raw["per_task"]["imdb"]}}, str(tmp_path / "params.yaml")),
                              str(tmp_path / "params.yaml"))
    assert p.for_task("imdb").data.max_length == 512 and get_task("imdb").labels == ("neg", "pos")
    dsd = custom_tasks.load("imdb", p.data.custom["imdb"], tmp_path)
    assert dsd["train"].num_rows == 6 and dsd["dev"]["label"][:] == [0, 1, 0, 1]


@pytest.mark.parametrize("custom, message", [
    ({"train": "t.xlsx", "validation": "t.csv"}, "t.xlsx': unknown extension"),
    ({"metric": "bleu"}, "metric"),
    ({"type": "regression", "metric": "macro_f1"}, "'macro_f1' is not a regression score"),
    ({"labels": ["a", "b", "c"], "metric": "f1"}, "f1 is the binary F1"),
    ({"type": "regression", "labels": ["a", "b"]}, "a regression task has no label list"),
    ({"hub": "org/data"}, "give files"),
    ({"validation": None}, "needs `train` and `validation`"),
])
def test_bad_task_descriptions_name_the_key(tmp_path, custom, message):
    base = {"train": "t.csv", "validation": "t.csv", "text": "x", "label": "y"}
    with pytest.raises(ConfigError, match="data.custom.mine") as err:
        params(tmp_path, {"mine": {k: v for k, v in {**base, **custom}.items() if v is not None}})
    assert message in str(err.value)


@pytest.mark.parametrize("name, message", [("sst2", "registry task"), ("../evil", "not a path"),
                                           ("Tickets", "lower-case"), ("squad", "registry task")])
def test_a_task_named_like_a_registry_task_or_a_path_is_refused(tmp_path, name, message):
    with pytest.raises(ConfigError, match=message):
        params(tmp_path, {name: {"train": "t.csv", "validation": "t.csv", "text": "x", "label": "y"}})


def _load(tmp_path, name, cfg):
    p = params(tmp_path, {name: cfg})
    return custom_tasks.load(name, p.data.custom[name], tmp_path)


@pytest.mark.parametrize("rows, over, message", [
    ([["hello", "a"]], {"text_pair": "body"}, "train.csv: no column 'body' (data.custom.bad.text_pair); the columns "
                                              "are 'x', 'y'"),
    ([["hello", "a"], ["", "b"]], {}, "dev.csv:3: an empty text in column 'x'"),
    ([["hello", "a"], ["world", ""]], {}, "dev.csv:3: no label in column 'y'"),
    ([["hello", "a"], ["world", "zzz"]], {}, "dev.csv:3: label 'zzz' is not one of ['a', 'b'] (the labels of the "
                                             "training split)"),
    ([["hello", "1.5"], ["world", "high"]], {"type": "regression"}, "dev.csv:3: label 'high' is not a number"),
])
def test_bad_rows_are_one_line_naming_the_file_and_line(tmp_path, rows, over, message):
    train = write_csv(tmp_path / "train.csv", ["x", "y"], [["one", "a"], ["two", "b"]] if "type" not in over
                      else [["one", "1"], ["two", "2"]])
    dev = write_csv(tmp_path / "dev.csv", ["x", "y"], rows)
    with pytest.raises(custom_tasks.CustomTaskError) as err:
        _load(tmp_path, "bad", {"train": str(train), "validation": str(dev), "text": "x", "label": "y", **over})
    assert message in str(err.value) and str(tmp_path) in str(err.value)


def test_missing_labels_in_json_and_parquet(tmp_path):
    train = write_csv(tmp_path / "train.csv", ["x", "y"], [["one", "a"], ["two", "b"]])
    jl = write_jsonl(tmp_path / "dev.jsonl", [{"x": "ok", "y": "a"}, {"x": "no label", "y": None}])
    with pytest.raises(custom_tasks.CustomTaskError, match=r"dev.jsonl:2: no label in column 'y'"):
        _load(tmp_path, "nulls", {"train": str(train), "validation": str(jl), "text": "x", "label": "y"})
    pq.write_table(pa.table({"x": ["a", "b"], "y": [1.0, float("nan")]}), tmp_path / "dev.parquet")
    ints = write_csv(tmp_path / "ints.csv", ["x", "y"], [["one", "1"], ["two", "0"]])
    with pytest.raises(custom_tasks.CustomTaskError, match=r"dev.parquet: row 2: no label in column 'y'"):
        _load(tmp_path, "nans", {"train": str(ints), "validation": str(tmp_path / "dev.parquet"), "text": "x",
                                 "label": "y"})


def test_a_label_outside_the_params_labels_names_them(tmp_path):
    train = write_csv(tmp_path / "train.csv", ["x", "y"], [["one", "a"], ["two", "c"]])
    with pytest.raises(custom_tasks.CustomTaskError, match=r"train.csv:3: label 'c' is not one of \['a', 'b'\] "
                                                           r"\(data.custom.lab.labels\)"):
        _load(tmp_path, "lab", {"train": str(train), "validation": str(train), "text": "x", "label": "y",
                                "labels": ["a", "b"]})


def test_a_hub_dataset_offline_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    p = params(tmp_path, {"gone": {"hub": "nobody-here/no-such-dataset", "text": "t", "label": "l",
                                   "labels": ["a", "b"]}})
    with pytest.raises(custom_tasks.CustomTaskError, match="the Hub is offline here"):
        custom_tasks.load("gone", p.data.custom["gone"], tmp_path)


def test_files_are_checked_before_any_stage(tmp_path):
    from distillery.preflight import check_inputs

    p = params(tmp_path, {"tickets": tickets(tmp_path, test=str(tmp_path / "nowhere.csv"))})
    with pytest.raises(ConfigError, match=r"data.custom.tickets.test: file .*nowhere.csv not found"):
        check_inputs(p, str(tmp_path / "params.yaml"))


@pytest.mark.skipif(not (SHARED_GLUE / "RTE").is_dir(), reason="the shared GLUE data is not here")
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_one_path_a_glue_slice_as_files_is_the_glue_task_bit_for_bit(tmp_path, fmt):
    """RTE's first 64 train and 32 dev rows through the GLUE loader, and the same rows written as CSV, JSONL or
    Parquet with other column names and the label names as strings: the same prepared datasets, and the same
    weights after a short training run on each."""
    glue = load_local("rte", SHARED_GLUE, splits=["train", "dev"])
    files = {}
    for split, n in (("train", 64), ("dev", 32)):
        rows = [{"premise": r["text_a"], "claim": r["text_b"], "verdict": get_task("rte").labels[r["label"]]}
                for r in glue[split].select(range(n))]
        path = tmp_path / f"{split}.{fmt}"
        if fmt == "csv":
            write_csv(path, ["premise", "claim", "verdict"], [list(r.values()) for r in rows])
        elif fmt == "jsonl":
            write_jsonl(path, rows)
        else:
            pq.write_table(pa.Table.from_pylist(rows), path)
        files[split] = str(path)
    p = params(tmp_path, {"mine": {"train": files["train"], "validation": files["dev"], "text": "premise",
                                   "text_pair": "claim", "label": "verdict",
                                   "labels": list(get_task("rte").labels)}})
    own = custom_tasks.load("mine", p.data.custom["mine"], tmp_path)
    for split, n in (("train", 64), ("dev", 32)):
        ref = glue[split].select(range(n)).to_dict()
        mine = own[split].to_dict()
        assert mine["text_a"] == ref["text_a"] and mine["text_b"] == ref["text_b"] and mine["label"] == ref["label"]
    assert _trained(own["train"], "mine") == _trained(glue["train"].select(range(64)), "rte")


def _trained(train: datasets.Dataset, task: str) -> list[float]:
    """The weights (a checksum per tensor) of a tiny model after 4 steps on `train` (columns text_a, text_b,
    label), the same seed for both."""
    import torch
    import transformers

    torch.manual_seed(0)
    tok = _tok()
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64,
                                  num_labels=get_task(task).num_labels)
    model = transformers.BertForSequenceClassification(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    enc = tok(train["text_a"][:], train["text_b"][:], truncation=True, max_length=48, padding=True,
              return_tensors="pt")
    labels = torch.tensor(train["label"][:])
    for step in range(4):
        rows = slice(16 * step, 16 * step + 16)
        loss = model(**{k: v[rows] for k, v in enc.items()}, labels=labels[rows]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [float(t.double().sum()) for t in model.state_dict().values()]


def _tok():
    from transformers import BertTokenizerFast

    vocab = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "vocab" / "bert-base-uncased-vocab.txt"
    return BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)


# ------------------------------------------------------------------------------------------------ a given teacher

def _classifier(path: Path, num_labels: int, names: list[str] | None = None, head: bool = True) -> Path:
    import torch
    import transformers

    path.mkdir(parents=True)
    words = "my card was charged twice the app crashes on start how do i change name refund please again it".split()
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ","] + words) + "\n")
    tok = transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64, num_labels=num_labels,
                                  **({"id2label": dict(enumerate(names))} if names else {}))
    (transformers.BertForSequenceClassification if head else transformers.BertModel)(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture()
def project(tmp_path, monkeypatch):
    from tasks import paths

    for name, sub in (("ROOT", None), ("DATA", "data"), ("MODELS", "models"), ("METRICS", "metrics")):
        monkeypatch.setattr(paths, name, tmp_path / sub if sub else tmp_path)
    return tmp_path


def _given(project, teacher: Path):
    from tasks.data import save_task

    p = parse_params({"data": {"source": "demo", "tasks": ["tickets"], "custom": {"tickets": tickets(project)},
                               "max_length": 16},
                      "teacher": {"init": "scratch", "shape": {"layers": 1, "hidden": 16, "heads": 2,
                                                               "intermediate": 32},
                                  "finetuned": {"tickets": str(teacher)}},
                      "students": {"tiny": {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2,
                                                                             "intermediate": 32}}}},
                     str(project / "params.yaml"))
    register_custom_tasks(p, str(project / "params.yaml"))
    save_task(p, "tickets", custom_tasks.load("tickets", p.data.custom["tickets"], project))
    return p


def test_a_teacher_you_fine_tuned_is_evaluated_not_trained(project):
    """Its head fits (3 labels named as the task's): saved as the task's teacher with its dev metrics, which the gate
    and every student read; its weights are the given ones, untouched."""
    import json

    import torch
    import transformers

    from tasks import paths
    from tasks.teacher import gate_failure, run_finetune_teacher

    given = _classifier(project / "mine", 3, ["billing", "bug", "other"])
    p = _given(project, given)
    result = run_finetune_teacher(p, "tickets")
    saved = paths.teacher("tickets") / "model"
    metrics = json.loads((saved / "metrics.json").read_text())
    assert set(metrics) == {"eval_accuracy", "eval_macro_f1"} and "curve" not in result
    ours = transformers.AutoModelForSequenceClassification.from_pretrained(saved)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(given)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    assert ours.config.id2label == {0: "billing", 1: "bug", 2: "other"}
    gate_failure(p, "tickets")  # the gate reads its dev score (pass or fail, it has one)


@pytest.mark.parametrize("num_labels, names, head, message", [
    (2, None, True, "its head has 2 outputs, tickets has 3"),
    (3, ["bug", "billing", "other"], True, "its labels are ['bug', 'billing', 'other']"),
    (3, None, False, "not a fine-tuned classifier (BertModel"),
])
def test_a_teacher_whose_head_does_not_fit_is_refused(project, num_labels, names, head, message):
    from distillery.errors import UserError
    from tasks import paths
    from tasks.teacher import run_finetune_teacher

    p = _given(project, _classifier(project / "mine", num_labels, names, head))
    with pytest.raises(UserError, match=re.escape(message)):
        run_finetune_teacher(p, "tickets")
    assert not (paths.teacher("tickets") / "model").exists()  # nothing half-written


def test_a_hub_dataset_is_read_at_the_revision_the_cache_holds_and_a_new_revision_reruns_its_preparation(
        tmp_path, monkeypatch):
    """`hub: org/reviews` offline: the snapshot of the revision the Hugging Face cache's refs/main names is what the
    task is prepared from and what the prepare stage's key covers (issue 42: a Hub dataset's revision is an input); a
    new revision (other rows) gives another key, and its rows."""
    import huggingface_hub.constants

    from distillery.io import hub_dataset
    from tasks.data import PREPARE_TASK, _task_inputs
    from tasks.stage import stage_key

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    storage = cache / "datasets--org--reviews"

    def publish(sha: str, n_train: int) -> Path:
        snapshot = storage / "snapshots" / sha
        repo = imdb_repo(tmp_path / sha)
        for f in (repo / "data").iterdir():
            ds = datasets.Dataset.from_parquet(str(f))
            if f.name.startswith("train"):
                ds = datasets.Dataset.from_dict({"text": [f"{sha[:4]} review {i}" for i in range(n_train)],
                                                 "label": [i % 2 for i in range(n_train)]}, features=ds.features)
            (snapshot / "data").mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(snapshot / "data" / f.name))
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / "main").write_text(sha)
        hub_dataset.cache_clear()
        return snapshot

    first = publish("a" * 40, 6)
    p = params(tmp_path, {"reviews": {"hub": "org/reviews", "splits": {"train": "train", "validation": "test"},
                                      "text": "text", "label": "label"}})
    assert hub_dataset("org/reviews") == str(first) and _task_inputs(p, "reviews") == [first]
    key = stage_key(PREPARE_TASK, p, "reviews")
    assert custom_tasks.load("reviews", p.data.custom["reviews"], tmp_path)["train"].num_rows == 6
    second = publish("b" * 40, 8)
    assert _task_inputs(p, "reviews") == [second] and stage_key(PREPARE_TASK, p, "reviews") != key
    dsd = custom_tasks.load("reviews", p.data.custom["reviews"], tmp_path)
    assert dsd["train"].num_rows == 8 and any(str(v).startswith("bbbb") for v in dsd["train"][0].values())
    hub_dataset.cache_clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_dataset("org/not-cached") == "org/not-cached"  # offline and not cached: the load says why


def test_each_task_kind_names_the_hub_dataset_it_is_prepared_from(tmp_path):
    """GLUE from the Hub reads nyu-mll/glue, SQuAD rajpurkar/squad (a task of your own its `hub`: the revision test
    above); the demo none."""
    from distillery.task_kinds import task_kind

    hub = parse_params({"data": {"source": "hub", "tasks": ["sst2", "squad"]},
                        "teacher": {"init": "scratch", "shape": {"layers": 2, "hidden": 16, "heads": 2,
                                                                 "intermediate": 32}},
                        "students": {"tiny": {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2,
                                                                               "intermediate": 32}}}},
                       str(tmp_path / "params.yaml"))
    assert task_kind("sst2", hub.data).hub_dataset_id(hub.data) == "nyu-mll/glue"
    assert task_kind("squad", hub.data).hub_dataset_id(hub.data) == "rajpurkar/squad"
    demo = params(tmp_path, {}, tasks=["demo"])
    assert task_kind("demo", demo.data).hub_dataset_id(demo.data) is None


def test_your_files_are_read_exactly_or_refused_with_one_line(tmp_path):
    """A TSV is read literally (a quote is a character: six lines, six rows); a CSV quote that runs over lines, a
    column named twice, a label spelled two ways, a list for a label, a target a float32 cannot hold: one line each."""
    quote = '"'
    lines = ["x\ty"] + [f"{quote if i == 1 else ''}sentence {i}\t{'ab'[i % 2]}" for i in range(6)]
    (tmp_path / "lit.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ds = _load(tmp_path, "lit", {"train": str(tmp_path / "lit.tsv"), "validation": str(tmp_path / "lit.tsv"),
                                 "text": "x", "label": "y"})["train"]
    assert ds.num_rows == 6 and ds["text_a"][1] == '"sentence 1'
    cases = [
        ('x,y\n"one,a\ntwo,b\nthree,a\n', "bad.csv:2: a quoted field runs over lines 2-4"),
        ("x,y,x\none,a,1\ntwo,b,2\n", "bad.csv:1: column 'x' appears 2 times in the header"),
        ("x,y\none,1\ntwo,0\nthree,1.0\n", "bad.csv:4: label '1.0' is label '1' (") ,
    ]
    for text, message in cases:
        (tmp_path / "bad.csv").write_text(text, encoding="utf-8")
        with pytest.raises(custom_tasks.CustomTaskError) as err:
            _load(tmp_path, "bad", {"train": str(tmp_path / "bad.csv"), "validation": str(tmp_path / "bad.csv"),
                                    "text": "x", "label": "y"})
        assert message in str(err.value) and "\n" not in str(err.value), (message, str(err.value))
    ints = write_csv(tmp_path / "ints.csv", ["x", "y"], [["one", "1"], ["two", "0"]])
    spelled = write_csv(tmp_path / "spelled.csv", ["x", "y"], [["one", "1"], ["two", "0.0"]])
    with pytest.raises(custom_tasks.CustomTaskError, match=r"spelled.csv:3: label '0.0' is label '0' spelled another"):
        _load(tmp_path, "spelled", {"train": str(ints), "validation": str(spelled), "text": "x", "label": "y"})
    pq.write_table(pa.table({"x": ["a", "b"], "y": [["neg"], ["pos"]]}), tmp_path / "lists.parquet")
    with pytest.raises(custom_tasks.CustomTaskError, match=r"lists.parquet: row 1: label \['neg'\] is a list, not "
                                                           r"one value"):
        _load(tmp_path, "lists", {"train": str(tmp_path / "lists.parquet"),
                                  "validation": str(tmp_path / "lists.parquet"), "text": "x", "label": "y"})
    huge = write_jsonl(tmp_path / "huge.jsonl", [{"s": "a", "v": 1.0}, {"s": "b", "v": 1e39}])
    with pytest.raises(custom_tasks.CustomTaskError, match=r"huge.jsonl:2: label '1e\+39' is beyond what a float32"):
        _load(tmp_path, "huge", {"train": str(huge), "validation": str(huge), "text": "s", "label": "v",
                                 "type": "regression"})


def test_a_regression_target_of_any_sign_is_scored_and_a_test_row_without_one_is_nan(tmp_path):
    rows = [{"s": f"t {i}", "v": v} for i, v in enumerate([-3.5, -1.0, 0.0, 2.0])]
    train = write_jsonl(tmp_path / "neg.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [{"s": "u"}, {"s": "w"}])
    dsd = _load(tmp_path, "neg", {"train": str(train), "validation": str(train), "test": str(test), "text": "s",
                                  "label": "v", "type": "regression"})
    assert dsd["dev"]["label"][:] == [-3.5, -1.0, 0.0, 2.0]  # -1.0 is a target, not "unlabeled"
    from distillery.glue.stats import split_stats

    assert split_stats("neg", dsd["dev"]) == {"rows": 4, "labels": {"-4--3": 1, "-1-0": 1, "0-1": 1, "2-3": 1}}
    assert split_stats("neg", dsd["test"]) == {"rows": 2, "labels": {}}
    assert all(math.isnan(v) for v in dsd["test"]["label"][:])
    scores = compute_metrics("neg", [-3.0, -1.5, 0.5, 2.5], dsd["dev"]["label"][:])
    assert scores["pearson"] > 0.9
    with pytest.raises(ValueError, match="unlabeled rows"):
        compute_metrics("neg", [0.0, 0.0], dsd["test"]["label"][:])


def test_a_bad_task_of_your_own_is_one_error_not_two(tmp_path):
    with pytest.raises(ConfigError) as err:
        params(tmp_path, {"tickets": {**tickets(tmp_path), "metric": "bleu"}})
    lines = [line for line in str(err.value).splitlines() if line.strip()]
    assert len(lines) == 1 and "data.custom.tickets" in lines[0], lines
