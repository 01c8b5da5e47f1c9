"""Augmented TSV files: quoting round trip, streaming dataset augmentation, GLUE reader, CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from distillery.augment import AugmentConfig, augment_dataset, read_augmented, write_augmented
from distillery.augment.glove import load_word_vectors

NASTY = ['he said "hi"\tthen left', '"quoted"', "tab\there", "new\nline", 'lone " quote', "plain"]


def test_quoting_round_trip(tmp_path):
    rows = [{"text_a": t, "text_b": NASTY[-1 - i], "label": i % 3, "source_idx": i} for i, t in enumerate(NASTY)]
    path = tmp_path / "aug.tsv"
    assert write_augmented(iter(rows), path, pair=True) == len(rows)
    back = list(read_augmented(path))
    assert [r["text_a"] for r in back] == NASTY
    assert [r["text_b"] for r in back] == NASTY[::-1]
    assert [int(r["label"]) for r in back] == [r["label"] for r in rows]
    assert [int(r["source_idx"]) for r in back] == list(range(len(NASTY)))
    assert path.read_text(encoding="utf-8").splitlines()[0] == "text_a\ttext_b\tlabel\tsource_idx"


def test_write_is_atomic_on_failure(tmp_path):
    path = tmp_path / "aug.tsv"

    def rows():
        yield {"text_a": "ok", "label": 0, "source_idx": 0}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_augmented(rows(), path, pair=False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KeyError, match="lacks column 'source_idx'"):
        write_augmented([{"text_a": "x", "label": 0}], path, pair=False)


def test_read_augmented_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_augmented(tmp_path / "none.tsv"))
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence\tlabel\nx\t0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.tsv:1: header"):
        list(read_augmented(bad))
    short = tmp_path / "short.tsv"
    short.write_text("text_a\tlabel\tsource_idx\nx\t0\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"short\.tsv:2: expected 3 fields"):
        list(read_augmented(short))


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    words = "the a movie film good bad great plot acting story dull charming it was is".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", ".", '"', "'"] + words
    vocab += list("bcdefghijklmnopqrstuvwxyz") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    d = tmp_path_factory.mktemp("mlm")
    (d / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    tok = transformers.BertTokenizerFast(vocab=str(d / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    out = d / "model"
    transformers.BertForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    rng = np.random.default_rng(0)
    (d / "glove.txt").write_text("".join(w + " " + " ".join(f"{x:.4f}" for x in rng.normal(size=4)) + "\n"
                                         for w in words + ["terrible", "wonderful"]))
    return out, d / "glove.txt"


def test_augment_dataset_with_quotes_and_glue_reader(mlm_dir, tmp_path):
    model_dir, glove = mlm_dir
    model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    vectors = load_word_vectors(glove, use_cache=False)
    rows = [{"text_a": 'a "charming"\tmovie , terrible plot', "label": 1, "idx": 5},
            {"text_a": "wonderful acting", "label": 0, "idx": 9}]
    out = augment_dataset(rows, "sst2", model, tok, vectors, AugmentConfig(n_aug=6, seed=1), tmp_path / "a.tsv",
                          progress=False)
    back = list(read_augmented(out))
    assert back[0] == {"text_a": rows[0]["text_a"], "label": "1", "source_idx": "5"}
    assert {r["source_idx"] for r in back} == {"5", "9"} and len(back) > 2
    assert all(r["label"] == ("1" if r["source_idx"] == "5" else "0") for r in back)
    from distillery.glue.loaders import load_split_file

    ds = load_split_file("sst2", out)
    assert ds["text_a"] == [r["text_a"] for r in back]
    assert ds["source_idx"] == [int(r["source_idx"]) for r in back]


def test_sharded_augmentation_equals_one_pass_and_reuses_finished_shards(mlm_dir, tmp_path):
    """Shards (the resume points of a killed augmentation) give the same file; a finished shard is not recomputed."""
    model_dir, glove = mlm_dir
    model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    vectors = load_word_vectors(glove, use_cache=False)
    rows = [{"text_a": f"the {w} movie was {v} , a {u} plot", "label": i % 2}
            for i, (w, v, u) in enumerate(zip(["good", "dull", "great", "bad", "charming"] * 2,
                                              ["charming", "terrible", "dull", "good", "great"] * 2,
                                              ["great", "wonderful", "bad", "dull", "good"] * 2))]
    config = AugmentConfig(n_aug=4, seed=2, chunk_size=3)
    whole = augment_dataset(rows, "sst2", model, tok, vectors, config, tmp_path / "whole.tsv", progress=False)
    shards = tmp_path / "shards"
    sharded = augment_dataset(rows, "sst2", model, tok, vectors, config, tmp_path / "sharded.tsv", progress=False,
                              shards=shards)
    assert sharded.read_bytes() == whole.read_bytes() and not shards.exists()
    # a run killed after its first shard: that shard is reused as it is (here: marked), the rest computed
    write_augmented([{"text_a": "from the first run", "label": 0, "source_idx": 0}], shards / "part-000000.tsv",
                    pair=False)
    resumed = augment_dataset(rows, "sst2", model, tok, vectors, config, tmp_path / "resumed.tsv", progress=False,
                              shards=shards)
    lines = resumed.read_text(encoding="utf-8").splitlines()
    assert lines[1] == "from the first run\t0\t0"
    first_shard_rows = sum(1 for r in read_augmented(whole) if int(r["source_idx"]) < 3)
    assert lines[2:] == whole.read_text(encoding="utf-8").splitlines()[1 + first_shard_rows:]


def test_cli_augments_a_glue_file(mlm_dir, tmp_path):
    from distillery.cli import main

    model_dir, glove = mlm_dir
    src = tmp_path / "train.tsv"
    src.write_text("sentence\tlabel\nthe movie was charming \t1\na dull , terrible plot \t0\n", encoding="utf-8")
    out = tmp_path / "out" / "train_aug.tsv"
    argv = ["augment", "--task", "sst2", "--input", str(src), "--mlm", str(model_dir), "--glove", str(glove),
            "--output", str(out), "--n-aug", "5", "--k", "4", "--seed", "3", "--quiet", "--cache-dir", str(tmp_path / "c")]
    assert main(argv) == 0
    rows = list(read_augmented(out))
    assert rows[0]["text_a"] == "the movie was charming " and rows[0]["source_idx"] == "0"
    assert 2 < len(rows) <= 12
    assert main(argv[:-2] + ["--fast", "--output", str(tmp_path / "fast.tsv")] + argv[-2:]) == 0
    with pytest.raises(FileNotFoundError, match="MLM directory"):
        main(["augment", "--task", "sst2", "--input", str(src), "--mlm", str(tmp_path / "no"), "--glove", str(glove),
              "--output", str(out), "--debug"])  # without --debug: one `error:` line, exit code 2
