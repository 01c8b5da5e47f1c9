"""Word vectors for the GloVe branch of TinyBERT augmentation: formats, errors, cache, neighbours."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from distillery.augment.glove import WordVectorsFormatError, load_word_vectors

SHARED_GLOVE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glove" / "glove.6B.50d.top5k.txt"


def _write(path: Path, words: list[str], vecs: np.ndarray, header: bool = False) -> Path:
    lines = [f"{len(words)} {vecs.shape[1]}"] if header else []
    lines += [w + " " + " ".join(f"{x:.6f}" for x in v) for w, v in zip(words, vecs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture()
def small(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    vecs = rng.normal(size=(40, 8)).astype(np.float32)
    return words, vecs, _write(tmp_path / "glove.txt", words, vecs)


def _brute(words, vecs, word, k):
    unit = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    i = words.index(word)
    sims = unit @ unit[i]
    sims[i] = -np.inf
    return [words[j] for j in np.argsort(-sims)[:k]]


def test_glove_text_neighbours_match_brute_force(small, tmp_path):
    words, vecs, path = small
    wv = load_word_vectors(path, cache_dir=tmp_path / "cache")
    assert len(wv) == 40 and wv.dim == 8
    assert np.allclose(np.linalg.norm(wv.matrix, axis=1), 1.0, atol=1e-5)
    for w in ("w0", "w7", "w39"):
        got = wv.neighbours(w, 5)
        assert got == _brute(words, vecs, w, 5)
        assert w not in got
        assert wv.reference_neighbours(w, 5) == got
    assert wv.neighbours("missing", 5) == []
    assert wv.neighbours_many(["w3", "missing", "w3"], 4) == [_brute(words, vecs, "w3", 4), [], _brute(words, vecs, "w3", 4)]


def test_glove_max_words_keeps_the_first_words(small, tmp_path):
    words, vecs, path = small
    wv = load_word_vectors(path, max_words=10, cache_dir=tmp_path / "c")
    assert wv.words == words[:10]
    assert "w20" not in wv


def test_word2vec_text_format(small, tmp_path):
    words, vecs, _ = small
    plain = load_word_vectors(_write(tmp_path / "a.txt", words, vecs), use_cache=False)
    w2v = load_word_vectors(_write(tmp_path / "b.txt", words, vecs, header=True), use_cache=False)
    assert w2v.words == plain.words
    np.testing.assert_array_equal(w2v.matrix, plain.matrix)


def test_binary_cache_reload_equals_text_load(small, tmp_path):
    words, vecs, path = small
    cache = tmp_path / "cache"
    first = load_word_vectors(path, cache_dir=cache)
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".npy"]
    stat = path.stat()
    second = load_word_vectors(path, cache_dir=cache)
    assert second.words == first.words
    np.testing.assert_array_equal(second.matrix, first.matrix)
    # a changed file (new mtime/size) is re-parsed, not served stale
    _write(path, words[:5], vecs[:5])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    third = load_word_vectors(path, cache_dir=cache)
    assert third.words == words[:5]


def test_cache_is_used_instead_of_parsing(small, tmp_path, monkeypatch):
    _, _, path = small
    load_word_vectors(path, cache_dir=tmp_path / "cache")
    import distillery.augment.glove as glove

    def boom(*a, **k):
        raise AssertionError("text parsed despite a valid cache")

    monkeypatch.setattr(glove, "_parse_text", boom)
    assert len(load_word_vectors(path, cache_dir=tmp_path / "cache")) == 40


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("a 0.1 0.2 0.3\nb 0.1 zero 0.3\nc 0.1 0.2 0.3\n", encoding="utf-8")
    with pytest.raises(WordVectorsFormatError, match=r"bad\.txt:2: malformed number"):
        load_word_vectors(path, use_cache=False)


def test_dimension_mismatch_names_line(tmp_path):
    path = tmp_path / "dims.txt"
    path.write_text("a 0.1 0.2 0.3\nb 0.1 0.2 0.3\nc 0.1 0.2\n", encoding="utf-8")
    with pytest.raises(WordVectorsFormatError, match=r"dims\.txt:3: dimension mismatch.*2 values, expected 3"):
        load_word_vectors(path, use_cache=False)
    w2v = tmp_path / "w2v.txt"
    w2v.write_text("2 4\na 0.1 0.2 0.3\n", encoding="utf-8")
    with pytest.raises(WordVectorsFormatError, match=r"w2v\.txt:2: dimension mismatch"):
        load_word_vectors(w2v, use_cache=False)


def test_missing_file_and_bad_max_words(tmp_path, small):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_word_vectors(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="max_words"):
        load_word_vectors(small[2], max_words=0)


@pytest.mark.skipif(not SHARED_GLOVE.is_file(), reason="shared GloVe subset not present")
def test_real_glove_subset(tmp_path):
    wv = load_word_vectors(SHARED_GLOVE, cache_dir=tmp_path)
    assert wv.dim == 50 and len(wv) > 5000 and wv.words[0] == "the"
    near = wv.neighbours("king", 10)
    assert "king" not in near and len(near) == 10
    assert {"queen", "prince", "throne", "son", "emperor"} & set(near)
