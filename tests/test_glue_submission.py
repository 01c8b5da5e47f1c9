import zipfile

import numpy as np
import pytest

from distillery.glue import (
    GLUE_TASKS,
    GLUE_TEST_ROWS,
    check_submission,
    submission_filename,
    write_submission,
    zip_submission,
)

EXPECTED_FILES = {
    "cola": "CoLA.tsv", "sst2": "SST-2.tsv", "mrpc": "MRPC.tsv", "stsb": "STS-B.tsv", "qqp": "QQP.tsv",
    "mnli": "MNLI-m.tsv", "mnli-mm": "MNLI-mm.tsv", "qnli": "QNLI.tsv", "rte": "RTE.tsv", "wnli": "WNLI.tsv",
    "ax": "AX.tsv",
}

# task -> (predictions, expected prediction column)
CASES = {
    "cola": ([1, 0, 1], ["1", "0", "1"]),
    "sst2": ([0, 1, 1], ["0", "1", "1"]),
    "mrpc": ([1, 1, 0], ["1", "1", "0"]),
    "qqp": ([0, 0, 1], ["0", "0", "1"]),
    "wnli": ([1, 0, 0], ["1", "0", "0"]),
    "stsb": ([-0.4, 2.34567, 5.7], ["0.000", "2.346", "5.000"]),
    "mnli": ([0, 1, 2], ["contradiction", "entailment", "neutral"]),
    "mnli-mm": ([2, 2, 1], ["neutral", "neutral", "entailment"]),
    "ax": ([1, 0, 2], ["entailment", "contradiction", "neutral"]),
    "qnli": ([0, 1, 0], ["entailment", "not_entailment", "entailment"]),
    "rte": ([1, 0, 1], ["not_entailment", "entailment", "not_entailment"]),
}


def test_file_names_for_every_task():
    assert set(EXPECTED_FILES) == set(GLUE_TASKS) == set(CASES)
    for task, name in EXPECTED_FILES.items():
        assert submission_filename(task) == name
    assert set(GLUE_TEST_ROWS) == set(EXPECTED_FILES.values())
    assert submission_filename("demo") == "demo.tsv"


@pytest.mark.parametrize("task", sorted(CASES))
def test_format_for_every_task(tmp_path, task):
    preds, expected = CASES[task]
    path = write_submission(task, preds, tmp_path, indices=[10, 11, 12])
    assert path == tmp_path / EXPECTED_FILES[task]
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[0] == "index\tprediction"
    assert lines[-1] == ""  # newline-terminated
    assert [line.split("\t") for line in lines[1:-1]] == [[str(10 + i), e] for i, e in enumerate(expected)]


def test_logits_are_argmaxed_and_default_indices(tmp_path):
    logits = np.array([[0.1, 2.0, 0.3], [3.0, 0.0, 0.0]])
    path = write_submission("mnli", logits, tmp_path)
    assert path.read_text().splitlines()[1:] == ["0\tentailment", "1\tcontradiction"]
    path = write_submission("stsb", np.array([[1.23449], [4.9996]]), tmp_path)
    assert path.read_text().splitlines()[1:] == ["0\t1.234", "1\t5.000"]


def test_bad_predictions(tmp_path):
    with pytest.raises(ValueError, match="indices"):
        write_submission("rte", [0, 1], tmp_path, indices=[0])
    with pytest.raises(ValueError, match="duplicate"):
        write_submission("rte", [0, 1], tmp_path, indices=[3, 3])
    with pytest.raises(ValueError, match="outside"):
        write_submission("rte", [0, 2], tmp_path)
    with pytest.raises(ValueError, match="integers"):
        write_submission("sst2", [0.0, 1.0], tmp_path)
    with pytest.raises(ValueError, match="non-finite"):
        write_submission("stsb", [float("nan")], tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_zip_top_level_and_check(tmp_path):
    sub = tmp_path / "sub"
    for task, (preds, _) in CASES.items():
        write_submission(task, preds, sub)
    zpath = zip_submission(sub, tmp_path / "out" / "submission.zip")
    with zipfile.ZipFile(zpath) as zf:
        assert sorted(zf.namelist()) == sorted(EXPECTED_FILES.values())
        assert zf.read("AX.tsv").decode().startswith("index\tprediction\n0\tentailment\n")
    problems = check_submission(sub)
    assert len(problems) == len(GLUE_TASKS) and all("server expects" in p for p in problems)
    write_submission("wnli", [0] * GLUE_TEST_ROWS["WNLI.tsv"], sub)
    assert check_submission(sub, tasks=["wnli"]) == []
    assert check_submission(tmp_path / "empty", tasks=["wnli", "rte"]) == ["missing WNLI.tsv", "missing RTE.tsv"]
    with pytest.raises(FileNotFoundError):
        zip_submission(tmp_path / "empty", tmp_path / "x.zip")
