"""Corpus preparation (sentence splitting without NLTK data), demo data, word vectors, WordPiece."""

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from distillery import corpus, demo

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def test_gutenberg_header_footer_bom_crlf_are_stripped(tmp_path):
    raw = tmp_path / "book.txt"
    raw.write_bytes(
        "\ufeffThe Project Gutenberg eBook of X\r\n\r\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\n"
        "It was a dark night. Mr. Smith went home.\r\nHe slept well.\r\n\r\n = Heading = \r\n"
        "A second paragraph starts here. It ends here!\r\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nLicense text that must not appear.\r\n".encode("utf-8")
    )
    out = tmp_path / "sentences.txt"
    counts = corpus.prepare_corpus([raw], out, min_words=2)
    text = out.read_text()
    assert "Gutenberg" not in text and "License" not in text and "Heading" not in text and "\r" not in text
    docs = corpus.read_sentences(out)
    assert counts == {"documents": 2, "sentences": sum(len(d) for d in docs)}
    assert docs[1] == ["A second paragraph starts here.", "It ends here!"]


def test_max_sentences_and_missing_file(tmp_path):
    raw = tmp_path / "raw.txt"
    demo.make_demo_corpus(raw, n_documents=20, seed=1)
    counts = corpus.prepare_corpus([raw], tmp_path / "s.txt", max_sentences=15)
    assert counts["sentences"] == 15
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        corpus.prepare_corpus([tmp_path / "nope.txt"], tmp_path / "s2.txt")


@pytest.mark.skipif(not (SHARED / "corpus" / "gutenberg" / "1342-0.txt").is_file(), reason="shared corpus absent")
def test_real_gutenberg_book(tmp_path):
    counts = corpus.prepare_corpus([SHARED / "corpus" / "gutenberg" / "1342-0.txt"], tmp_path / "s.txt",
                                   max_sentences=2000)
    docs = corpus.read_sentences(tmp_path / "s.txt")
    flat = [s for d in docs for s in d]
    assert counts["sentences"] == len(flat) == 2000
    assert "It is a truth universally acknowledged, that a single man in possession of a good fortune, " \
           "must be in want of a wife." in flat
    assert not any("PROJECT GUTENBERG" in s.upper() for s in flat)


def test_demo_task_is_deterministic_balanced_and_in_sst2_layout(tmp_path):
    a = demo.make_demo_task(tmp_path / "a", n_train=400, n_dev=100, n_test=50, seed=3)
    b = demo.make_demo_task(tmp_path / "b", n_train=400, n_dev=100, n_test=50, seed=3)
    assert (a / "train.tsv").read_text() == (b / "train.tsv").read_text()
    rows = list(csv.reader(open(a / "train.tsv"), delimiter="\t"))
    assert rows[0] == ["sentence", "label"] and len(rows) == 401
    labels = Counter(r[1] for r in rows[1:])
    assert set(labels) == {"0", "1"} and min(labels.values()) > 150
    test = list(csv.reader(open(a / "test.tsv"), delimiter="\t"))
    assert test[0] == ["index", "sentence"] and len(test) == 51


def test_demo_label_needs_more_than_bag_of_words():
    # negation flips the label: the same evaluative word appears with both labels
    import random

    rng = random.Random(0)
    by_word: dict[str, set[int]] = {}
    for _ in range(2000):
        text, label = demo._sentence(rng)
        for w in demo.POSITIVE + demo.NEGATIVE:
            if f" {w}" in f" {text}":
                by_word.setdefault(w, set()).add(label)
    assert sum(len(v) == 2 for v in by_word.values()) > len(by_word) // 2


def test_word_vectors_glove_format_and_neighbours(tmp_path):
    raw = tmp_path / "raw.txt"
    demo.make_demo_corpus(raw, n_documents=200, seed=0)
    corpus.prepare_corpus([raw], tmp_path / "s.txt")
    info = corpus.learn_word_vectors(tmp_path / "s.txt", tmp_path / "v.txt", dim=20)
    lines = (tmp_path / "v.txt").read_text().splitlines()
    assert len(lines) == info["words"] and all(len(l.split()) == 21 for l in lines)
    vec = {l.split()[0]: np.array(l.split()[1:], dtype=float) for l in lines}

    def cos(a, b):
        return float(vec[a] @ vec[b] / np.linalg.norm(vec[a]) / np.linalg.norm(vec[b]))

    # words used in the same slots are closer than words from different slots
    assert cos("good", "bad") > cos("good", "station")


def test_wordpiece_tokenizer_round_trip(tmp_path):
    from transformers import AutoTokenizer

    raw = tmp_path / "raw.txt"
    demo.make_demo_corpus(raw, n_documents=100, seed=0)
    corpus.prepare_corpus([raw], tmp_path / "s.txt")
    tok = AutoTokenizer.from_pretrained(str(corpus.train_wordpiece(tmp_path / "s.txt", tmp_path / "tok", vocab_size=300)))
    pieces = tok.tokenize("the movie was not good")
    assert "[UNK]" not in pieces and pieces[:2] == ["the", "movie"]
    texts = corpus.pack_sequences(corpus.read_sentences(tmp_path / "s.txt"), tok, 32)
    assert max(len(tok(t)["input_ids"]) for t in texts) <= 32  # demo sentences are shorter than the budget
    assert len(texts) < sum(len(d) for d in corpus.read_sentences(tmp_path / "s.txt"))  # sentences were packed


def test_wordpiece_training_is_deterministic(tmp_path):
    """The tokenizers trainer numbers its pieces in hash-map order (tens of ids moved between two trainings on
    the same corpus); the vocabulary must come out identical, or resumed weights no longer match it."""
    from distillery.corpus import train_wordpiece

    corpus = tmp_path / "corpus.txt"
    words = ["distillation", "teacher", "student", "attention", "hidden", "layer", "general", "task", "augment",
             "vocabulary", "sentence", "transformer", "embedding", "prediction", "quantised", "latency"]
    corpus.write_text("".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) + ".\n"
                              for i in range(400)), encoding="utf-8")
    first = train_wordpiece(corpus, tmp_path / "a", vocab_size=150)
    second = train_wordpiece(corpus, tmp_path / "b", vocab_size=150)
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(first))
    assert len(tok) <= 150 and tok.convert_ids_to_tokens(list(range(5))) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_packing_benchmark_counts_padding_both_ways(tmp_path):
    """benchmarks.packing on a corpus and tokenizer made here: across documents, fewer sequences and less padding."""
    from benchmarks import packing

    raw = tmp_path / "raw.txt"
    demo.make_demo_corpus(raw, n_documents=60, seed=0)
    corpus.prepare_corpus([raw], tmp_path / "s.txt")
    tok = corpus.train_wordpiece(tmp_path / "s.txt", tmp_path / "tok", vocab_size=300)
    out = packing.main([str(raw), "--tokenizer", str(tok), "--max-length", "48"])
    assert out["sequences_packed"] < out["sequences_alone"]
    assert 0 <= out["padded_packed"] < out["padded_alone"] < 1
