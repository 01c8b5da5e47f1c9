"""Loaders on small files written in the official GLUE layouts, the Hub schema (mocked), the real data."""

import json
import math
from pathlib import Path

import datasets
import pytest

from distillery.cli import main as cli_main
from distillery.glue import GlueFileError, get_task, load_hub, load_local, load_split_file

SHARED_GLUE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glue"

MNLI_PREFIX = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
               "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]


def _write(path: Path, lines: list[str], *, bom: bool = False, final_newline: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + ("\n" if final_newline else "")
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))


def _mnli_row(i: int, s1: str, s2: str, *labels: str) -> str:
    return "\t".join([str(i), "31193", f"{i}n", "government", "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2,
                      *labels])


@pytest.fixture()
def glue_dir(tmp_path: Path) -> Path:
    d = tmp_path / "glue"
    _write(d / "CoLA" / "train.tsv", ["gj04\t1\t\tOur friends won't buy this analysis.",
                                      'gj04\t0\t*\tHe said "hello.', "ad03\t1\t\tThe cat sat."])
    _write(d / "CoLA" / "dev.tsv", ["gj04\t1\t\tA sentence.", "w_80\t0\t*\tThe last line."], final_newline=False)
    _write(d / "CoLA" / "test.tsv", ["index\tsentence", "0\tBill whistled.", "1\tThe car honked."])
    _write(d / "SST-2" / "train.tsv", ["sentence\tlabel", "it 's a \"charming journey . \t1", "bleak \t0"])
    _write(d / "SST-2" / "dev.tsv", ["sentence\tlabel", "fine \t1"])
    _write(d / "MRPC" / "train.tsv", ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                                      '1\t702876\t702977\tHe called " the witness .\tThe witness " said .',
                                      "0\t2108705\t2108831\tYucaipa owned it .\tYucaipa bought it ."], bom=True)
    _write(d / "MRPC" / "test.tsv", ["index\t#1 ID\t#2 ID\t#1 String\t#2 String", "7\t1\t2\ta .\tb ."], bom=True)
    sts_header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    _write(d / "STS-B" / "train.tsv", [sts_header + "\tscore",
                                       "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane.\tAn air plane.\t5.000",
                                       "1\tmain-news\theadlines\t2015\t0002\tnone\tnone\tA man.\tA flute.\t0"])
    _write(d / "STS-B" / "test.tsv", [sts_header, "0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA.\tB."])
    _write(d / "QQP" / "train.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                                     "133273\t213221\t213222\tHow is the life?\tHow is life?\t1",
                                     "402555\t536040\t536041\tWhat is \"x\"?\tWhy y?\t0"])
    _write(d / "QQP" / "dev.tsv", ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "5\t1\t2\tA?\tB?\t0"])
    _write(d / "QQP" / "test.tsv", ["id\tquestion1\tquestion2", "0\tA?\tB?", "1\tC?\tD?"])
    _write(d / "MNLI" / "train.tsv", ["\t".join(MNLI_PREFIX + ["label1", "gold_label"]),
                                      _mnli_row(0, "P0", "H0", "neutral", "neutral"),
                                      _mnli_row(1, "P1", "H1", "contradiction", "contradiction"),
                                      _mnli_row(2, "P2", "H2", "entailment", "entailment")])
    dev_header = "\t".join(MNLI_PREFIX + ["label1", "label2", "label3", "label4", "label5", "gold_label"])
    _write(d / "MNLI" / "dev_matched.tsv", [dev_header, _mnli_row(0, "P", "H", *["entailment"] * 6)])
    _write(d / "MNLI" / "dev_mismatched.tsv", [dev_header, _mnli_row(9, "Pm", "Hm", *["neutral"] * 6),
                                               _mnli_row(10, "Pm2", "Hm2", *["contradiction"] * 6)])
    _write(d / "MNLI" / "test_matched.tsv", ["\t".join(MNLI_PREFIX), _mnli_row(0, "tP", "tH")])
    _write(d / "MNLI" / "test_mismatched.tsv", ["\t".join(MNLI_PREFIX), _mnli_row(0, "tPm", "tHm")])
    _write(d / "RTE" / "dev.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tnot_entailment",
                                   "1\tC.\tD.\tentailment"])
    _write(d / "diagnostic" / "diagnostic.tsv", ["index\tsentence1\tsentence2", "0\tThe cat sat.\tIt did not."],
           final_newline=False)
    return d


def test_cola_headerless_quotes_and_no_trailing_newline(glue_dir):
    ds = load_local("cola", glue_dir)
    assert list(ds) == ["train", "dev", "test"]
    assert ds["train"]["text_a"][1] == 'He said "hello.'  # unbalanced quote read literally
    assert ds["train"]["label"] == [1, 0, 1]
    assert ds["train"]["idx"] == [0, 1, 2]
    assert ds["dev"]["text_a"] == ["A sentence.", "The last line."]
    assert ds["test"]["label"] == [-1, -1] and ds["test"]["idx"] == [0, 1]
    assert "text_b" not in ds["train"].column_names


def test_sst2_and_mrpc_bom(glue_dir):
    sst = load_local("sst2", glue_dir)
    assert list(sst) == ["train", "dev"]  # only present files
    assert sst["train"]["text_a"][0] == 'it \'s a "charming journey . '
    mrpc = load_local("mrpc", glue_dir)
    assert mrpc["train"]["label"] == [1, 0]
    assert mrpc["train"]["text_a"][0] == 'He called " the witness .'
    assert mrpc["train"]["text_b"][0] == 'The witness " said .'
    assert mrpc["test"]["idx"] == [7] and mrpc["test"]["label"] == [-1]


def test_stsb_ten_columns_regression(glue_dir):
    ds = load_local("stsb", glue_dir)
    assert ds["train"]["label"] == [5.0, 0.0]
    assert ds["train"]["text_b"] == ["An air plane.", "A flute."]
    assert ds["train"].features["label"].dtype == "float32"
    assert [math.isnan(v) for v in ds["test"]["label"]] == [True]  # a score of any sign is a target: no label is NaN


def test_qqp_layout(glue_dir):
    ds = load_local("qqp", glue_dir)
    assert ds["train"]["text_a"] == ["How is the life?", 'What is "x"?']
    assert ds["train"]["label"] == [1, 0]
    assert ds["train"]["idx"] == [133273, 402555]
    assert ds["test"]["text_b"] == ["B?", "D?"] and ds["test"]["label"] == [-1, -1]


def test_mnli_matched_mismatched_and_label_order(glue_dir):
    m = load_local("mnli", glue_dir)
    assert list(m) == ["train", "dev", "test"]
    # registry order: contradiction=0, entailment=1, neutral=2
    assert m["train"]["label"] == [2, 0, 1]
    assert m["train"]["text_a"] == ["P0", "P1", "P2"]
    assert m["dev"]["label"] == [1] and m["test"]["text_b"] == ["tH"]
    mm = load_local("mnli-mm", glue_dir)
    assert list(mm) == ["dev", "test"]
    assert mm["dev"]["text_a"] == ["Pm", "Pm2"] and mm["dev"]["label"] == [2, 0]
    assert mm["dev"]["idx"] == [9, 10]
    assert mm["test"]["text_a"] == ["tPm"]


def test_ax_diagnostic(glue_dir):
    ax = load_local("ax", glue_dir)
    assert list(ax) == ["test"]
    assert ax["test"]["text_a"] == ["The cat sat."] and ax["test"]["label"] == [-1]


def test_missing_dir_and_split(glue_dir):
    with pytest.raises(FileNotFoundError, match="WNLI"):
        load_local("wnli", glue_dir)
    with pytest.raises(FileNotFoundError, match="test.tsv"):
        load_local("rte", glue_dir, splits=["test"])
    with pytest.raises(ValueError, match="unknown split"):
        load_local("rte", glue_dir, splits=["validation"])


@pytest.mark.parametrize(
    "task,lines,match",
    [
        ("rte", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tentailment", "1\tA.\tB"], r"train\.tsv:3: expected 4"),
        ("rte", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tneutral"], r"train\.tsv:2: label 'neutral'"),
        ("cola", ["gj04\t1\t\tok.", "gj04\t2\t\tbad label."], r"train\.tsv:2: label '2'"),
        ("cola", ["gj04\t1\tok."], r"train\.tsv:1: expected 4"),
        ("stsb", ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
                  "0\tg\tf\ty\to\ts\ts\tA.\tB.\t7.5"], r"train\.tsv:2: score '7.5'"),
        ("rte", ["index\tsentence1\tsentence2\tlabel", "x\tA.\tB.\tentailment"], r"train\.tsv:2: index 'x'"),
        ("rte", ["index\tpremise\tlabel", "0\tA.\tentailment"], r"train\.tsv:1: header"),
    ],
)
def test_malformed_file_names_file_and_line(tmp_path, task, lines, match):
    path = tmp_path / get_task(task).dirname / "train.tsv"
    _write(path, lines)
    with pytest.raises(GlueFileError, match=match):
        load_local(task, tmp_path)


def test_augmented_file_csv_quoting(tmp_path):
    import csv

    path = tmp_path / "aug.tsv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(["text_a", "text_b", "label", "source_idx"])
        w.writerow(['he said "hi', "tab\tinside", "entailment", 0])
        w.writerow(["b", "c", "not_entailment", 0])
        w.writerow(["d", "e", "1", 1])  # label id accepted too
    ds = load_split_file("rte", path)
    assert ds["text_a"] == ['he said "hi', "b", "d"]
    assert ds["text_b"][0] == "tab\tinside"
    assert ds["label"] == [0, 1, 1]
    assert ds["source_idx"] == [0, 0, 1] and ds["idx"] == [0, 1, 2]
    with open(path, "a", newline="", encoding="utf-8") as f:
        csv.writer(f, delimiter="\t").writerow(["x", "y", "maybe", 2])
    with pytest.raises(GlueFileError, match=r"aug\.tsv:5: label 'maybe'"):
        load_split_file("rte", path)
    with pytest.raises(GlueFileError, match="augmented header"):
        load_split_file("sst2", path)


def test_demo_tasks(tmp_path):
    from distillery.demo import make_demo_task

    make_demo_task(tmp_path / "demo", n_train=20, n_dev=5, n_test=4, seed=1)
    ds = load_local("demo", tmp_path)
    assert [len(ds[s]) for s in ("train", "dev", "test")] == [20, 5, 4]
    assert set(ds["train"]["label"]) <= {0, 1} and ds["test"]["label"] == [-1] * 4
    _write(tmp_path / "demo-pair" / "train.tsv", ["sentence1\tsentence2\tlabel", "a\tb\t1", "c\td\t0"])
    _write(tmp_path / "demo-pair" / "test.tsv", ["index\tsentence1\tsentence2", "0\ta\tb"])
    pair = load_local("demo-pair", tmp_path)
    assert pair["train"]["text_b"] == ["b", "d"] and pair["train"]["label"] == [1, 0]
    assert pair["test"]["label"] == [-1]


def _hub_mnli() -> datasets.DatasetDict:
    names = ["entailment", "neutral", "contradiction"]  # the Hub's order
    feats = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                               "label": datasets.ClassLabel(names=names), "idx": datasets.Value("int32")})

    def split(n, labels):
        return datasets.Dataset.from_dict({"premise": [f"p{i}" for i in range(n)],
                                           "hypothesis": [f"h{i}" for i in range(n)],
                                           "label": labels, "idx": list(range(n))}, features=feats)

    return datasets.DatasetDict({"train": split(3, [0, 1, 2]), "validation_matched": split(2, [2, 0]),
                                 "validation_mismatched": split(1, [1]), "test_matched": split(2, [-1, -1]),
                                 "test_mismatched": split(1, [-1])})


def test_load_hub_maps_labels_by_name(monkeypatch):
    calls = []

    def fake_load_dataset(path, name, cache_dir=None):
        calls.append((path, name, cache_dir))
        return _hub_mnli()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = load_hub("mnli", cache_dir="/tmp/c")
    assert calls == [("nyu-mll/glue", "mnli", "/tmp/c")]
    assert list(ds) == ["train", "dev", "test"]
    assert ds["train"].column_names == ["text_a", "text_b", "label", "idx"]
    # Hub entailment(0)/neutral(1)/contradiction(2) -> registry entailment=1, neutral=2, contradiction=0
    assert ds["train"]["label"] == [1, 2, 0]
    assert ds["dev"]["label"] == [0, 1]
    assert ds["test"]["label"] == [-1, -1]
    assert ds["train"]["text_a"] == ["p0", "p1", "p2"]


def test_load_hub_stsb_and_cola(monkeypatch):
    def fake(path, name, cache_dir=None):
        if name == "stsb":
            f = datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                   "label": datasets.Value("float32"), "idx": datasets.Value("int32")})
            rows = {"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [4.5, -1.0], "idx": [0, 1]}
            return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows, features=f)})
        f = datasets.Features({"sentence": datasets.Value("string"),
                               "label": datasets.ClassLabel(names=["unacceptable", "acceptable"]),
                               "idx": datasets.Value("int32")})
        rows = {"sentence": ["x", "y"], "label": [1, 0], "idx": [0, 1]}
        return datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows, features=f)})

    monkeypatch.setattr(datasets, "load_dataset", fake)
    st = load_hub("stsb", splits=["train"])
    assert st["train"]["label"][0] == 4.5 and math.isnan(st["train"]["label"][1])  # the Hub's -1: no label
    assert st["train"]["text_b"] == ["c", "d"]
    cola = load_hub("cola", splits=["dev"])
    assert cola["dev"]["label"] == [1, 0] and cola["dev"].column_names == ["text_a", "label", "idx"]
    with pytest.raises(KeyError, match="no split 'train'"):
        load_hub("cola", splits=["train"])
    with pytest.raises(ValueError, match="generated"):
        load_hub("demo")


def test_cli_stats_json_and_table(glue_dir, capsys):
    assert cli_main(["glue", "stats", "--data-dir", str(glue_dir), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert set(stats) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "rte", "ax"}
    assert stats["cola"]["train"] == {"rows": 3, "labels": {"0": 1, "1": 2}}
    assert stats["cola"]["test"] == {"rows": 2, "labels": {}}
    assert stats["mnli"]["train"]["labels"] == {"contradiction": 1, "entailment": 1, "neutral": 1}
    assert stats["mnli-mm"]["dev"] == {"rows": 2, "labels": {"contradiction": 1, "neutral": 1}}
    assert stats["stsb"]["train"]["labels"] == {"0-1": 1, "4-5": 1}
    assert cli_main(["glue", "stats", "--data-dir", str(glue_dir)]) == 0
    table = capsys.readouterr().out
    assert "mnli-mm" in table and "contradiction: 1" in table


def test_cli_stats_missing_dir(tmp_path, capsys):
    assert cli_main(["glue", "stats", "--data-dir", str(tmp_path / "nope")]) == 2  # one error line, no traceback
    assert capsys.readouterr().err == f"error: GLUE data directory {tmp_path / 'nope'} not found\n"
    with pytest.raises(FileNotFoundError, match="nope"):
        cli_main(["--debug", "glue", "stats", "--data-dir", str(tmp_path / "nope")])


@pytest.mark.skipif(not SHARED_GLUE.is_dir(), reason="shared GLUE data not present")
def test_real_glue_counts_exact(capsys):
    assert cli_main(["glue", "stats", "--data-dir", str(SHARED_GLUE), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    expected = {
        "cola": (8551, 1043, 1063), "sst2": (67349, 872, 1821), "mrpc": (3668, 408, 1725),
        "rte": (2490, 277, 3000), "stsb": (5749, 1500, 1379), "wnli": (635, 71, 146),
    }
    for task, counts in expected.items():
        assert tuple(stats[task][s]["rows"] for s in ("train", "dev", "test")) == counts, task
    assert "train" not in stats["qnli"]
    assert stats["qnli"]["dev"]["rows"] == 5463 and stats["qnli"]["test"]["rows"] == 5463
    assert stats["ax"]["test"]["rows"] == 1104
    # label counts of the official dev sets
    assert stats["cola"]["dev"]["labels"] == {"0": 322, "1": 721}
    assert stats["mrpc"]["dev"]["labels"] == {"0": 129, "1": 279}
    assert stats["rte"]["dev"]["labels"] == {"entailment": 146, "not_entailment": 131}
    assert sum(stats["stsb"]["dev"]["labels"].values()) == 1500
    assert stats["sst2"]["test_labeled"]["rows"] == 1821


def test_reads_files_written_by_augment_io(tmp_path):
    aug_io = pytest.importorskip("distillery.augment.io")
    rows = [{"text_a": 'a "quoted\ttab', "text_b": "line\nbreak", "label": 0, "source_idx": 4},
            {"text_a": "x", "text_b": "y", "label": 2, "source_idx": 4}]
    path = tmp_path / "mnli_aug.tsv"
    aug_io.write_augmented(rows, path, pair=True)
    ds = load_split_file("mnli", path)
    assert ds["text_a"][:] == ['a "quoted\ttab', "x"] and ds["text_b"][:] == ["line\nbreak", "y"]
    assert ds["label"][:] == [0, 2] and ds["source_idx"][:] == [4, 4]


def test_empty_file(tmp_path):
    path = tmp_path / "SST-2" / "train.tsv"
    path.parent.mkdir()
    path.write_text("")
    with pytest.raises(GlueFileError, match="empty"):
        load_local("sst2", tmp_path)
