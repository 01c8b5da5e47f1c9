from pathlib import Path

import datasets
import pytest
from transformers import BertTokenizerFast

from distillery.glue import encode, load_local

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "the", "cat", "sat", "dog", "ran", "."]


@pytest.fixture()
def tokenizer(tmp_path: Path) -> BertTokenizerFast:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    # transformers 5 ignores `vocab_file=` silently (every token -> [UNK]); pass the path as `vocab`.
    tok = BertTokenizerFast(vocab=str(vocab))
    assert tok.convert_tokens_to_ids("cat") == WORDS.index("cat")
    return tok


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_pair_encoding_labels_and_unlabeled_test(tmp_path, tokenizer):
    _write(tmp_path / "RTE" / "train.tsv", ["index\tsentence1\tsentence2\tlabel",
                                            "0\tthe cat sat .\tthe dog ran\tnot_entailment",
                                            "1\ta b c a b c a b c a b c\tcat\tentailment"])
    _write(tmp_path / "RTE" / "test.tsv", ["index\tsentence1\tsentence2", "5\tthe cat\tsat ."])
    enc = encode(load_local("rte", tmp_path), tokenizer, "rte", max_length=8)
    tr = enc["train"]
    assert set(tr.column_names) == {"input_ids", "attention_mask", "token_type_ids", "labels", "idx"}
    ids = {w: i for i, w in enumerate(WORDS)}
    # [CLS] the cat sat . [SEP] the dog ran [SEP] = 10 > 8: longest_first cuts 1 from each side
    assert tr[0]["input_ids"] == [ids[w] for w in ["[CLS]", "the", "cat", "sat", "[SEP]", "the", "dog", "[SEP]"]]
    assert tr[0]["token_type_ids"] == [0, 0, 0, 0, 0, 1, 1, 1]
    # the long first sentence is cut, the one-word second survives
    assert tr[1]["input_ids"][-2:] == [ids["cat"], ids["[SEP]"]] and len(tr[1]["input_ids"]) == 8
    assert tr["labels"][:] == [1, 0] and tr.features["labels"].dtype == "int64"
    te = enc["test"]
    assert "labels" not in te.column_names and te["idx"][:] == [5]


def test_regression_labels_are_float(tmp_path, tokenizer):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    _write(tmp_path / "STS-B" / "dev.tsv", [header, "0\tg\tf\ty\to\ts\ts\tthe cat\tthe dog\t3.800"])
    enc = encode(load_local("stsb", tmp_path), tokenizer, "stsb", max_length=16)
    assert enc["dev"].features["labels"].dtype == "float32"
    assert enc["dev"]["labels"][:] == [pytest.approx(3.8)]


def test_single_sentence_no_pair_and_mixed_labels_rejected(tokenizer):
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"text_a": ["the cat", "a dog"], "label": [1, -1], "idx": [0, 1]})})
    with pytest.raises(ValueError, match="unlabeled"):
        encode(ds, tokenizer, "sst2", max_length=8)
    ok = datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"text_a": ["the cat"], "label": [1], "idx": [0]})})
    row = encode(ok, tokenizer, "sst2", max_length=8)["train"][0]
    assert row["input_ids"] == [2, 8, 9, 3] and row["token_type_ids"] == [0, 0, 0, 0] and row["labels"] == 1
    with pytest.raises(KeyError, match="text_b"):
        encode(ok, tokenizer, "rte", max_length=8)
