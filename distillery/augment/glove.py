"""Word vectors for TinyBERT's augmentation of multi-piece words (Algorithm 1, GloVe branch).

A word that the WordPiece tokenizer splits into several pieces cannot be predicted by one [MASK], so
TinyBERT replaces it with one of its K nearest GloVe neighbours by cosine similarity, the word itself
excluded. As in the official code, only the first ``max_words`` (100,000) words of the file are kept
and every vector is L2-normalised, so cosine similarity is a matrix product and the neighbours are a
``topk`` over it.

Reads the standard GloVe text format (``word v1 ... vD`` per line) and the word2vec text format (the
same with a first line ``<count> <dim>``). The parsed, normalised matrix is cached as ``.npy`` plus a
JSON vocabulary, keyed by the text file's size, modification time and ``max_words``, so a reload skips
the text parsing.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from distillery.errors import InputNotFoundError, UserError
from distillery.io import atomic_path, write_text

__all__ = ["WordVectorsFormatError", "WordVectors", "load_word_vectors"]


class WordVectorsFormatError(UserError, ValueError):
    """A word-vector text file has a malformed line or inconsistent dimensions."""


@dataclass
class WordVectors:
    """Row-normalised word vectors: ``matrix[i]`` is the unit vector of ``words[i]``."""

    words: list[str]
    matrix: np.ndarray  # (N, D) float32, rows L2-normalised (all-zero rows stay zero)
    _index: dict[str, int] = field(init=False, repr=False)
    _cache: dict[tuple[str, int], list[str]] = field(init=False, repr=False, default_factory=dict)
    _tensor: torch.Tensor | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.matrix.ndim != 2 or self.matrix.shape[0] != len(self.words):
            raise ValueError(f"matrix shape {self.matrix.shape} does not match {len(self.words)} words")
        self._index = {}
        for i, w in enumerate(self.words):
            self._index.setdefault(w, i)  # first occurrence wins

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def neighbours(self, word: str, k: int) -> list[str]:
        """The `k` words of highest cosine similarity to `word`, best first, `word` excluded.

        A word missing from the vectors has no neighbours (``[]``), as in the official code.
        """
        return self.neighbours_many([word], k)[0]

    def neighbours_many(self, words: list[str], k: int) -> list[list[str]]:
        """`neighbours` for several words with one matrix product for those not cached yet."""
        todo = sorted({w for w in words if (w, k) not in self._cache and w in self._index})
        if todo:
            if self._tensor is None:
                self._tensor = torch.from_numpy(self.matrix)
            rows = torch.tensor([self._index[w] for w in todo])
            with torch.inference_mode():
                sims = self._tensor[rows] @ self._tensor.T  # cosine: rows are unit vectors
                sims[torch.arange(len(todo)), rows] = -float("inf")  # exclude the word itself
                top = torch.topk(sims, min(k, len(self.words) - 1), dim=1).indices.tolist()
            for w, ids in zip(todo, top):
                self._cache[(w, k)] = [self.words[i] for i in ids]
        return [list(self._cache.get((w, k), [])) for w in words]

    def reference_neighbours(self, word: str, k: int) -> list[str]:
        """`neighbours` computed as the official script does: a full ``argsort`` of all similarities,
        no cache (used by the per-position reference and the benchmark)."""
        i = self._index.get(word)
        if i is None:
            return []
        sims = self.matrix @ self.matrix[i]
        sims[i] = -np.inf
        return [self.words[j] for j in np.argsort(-sims)[:k]]


def _normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def _parse_text(path: Path, max_words: int) -> tuple[list[str], np.ndarray]:
    try:
        words, rows = _parse_lines(path, max_words)
    except UnicodeDecodeError as exc:
        raise WordVectorsFormatError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} cannot be "
                                     "decoded); re-save it as UTF-8") from None
    if not words:
        raise WordVectorsFormatError(f"{path}: no word vectors found")
    return words, _normalise(np.stack(rows))


def _parse_lines(path: Path, max_words: int) -> tuple[list[str], list[np.ndarray]]:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim: int | None = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.rstrip("\r\n").rstrip(" ").split(" ")
            if lineno == 1 and len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                dim = int(parts[1])  # word2vec text header: "<count> <dim>"
                if dim <= 0:
                    raise WordVectorsFormatError(f"{path}:1: word2vec header gives dimension {dim}")
                continue
            if parts == [""]:
                raise WordVectorsFormatError(f"{path}:{lineno}: empty line")
            if len(parts) < 2:
                raise WordVectorsFormatError(f"{path}:{lineno}: malformed line, expected a word and its vector")
            if dim is None:
                dim = len(parts) - 1
            if len(parts) - 1 != dim:
                raise WordVectorsFormatError(
                    f"{path}:{lineno}: dimension mismatch, word {parts[0]!r} has {len(parts) - 1} values, "
                    f"expected {dim}"
                )
            try:
                vec = np.array(parts[1:], dtype=np.float32)
            except ValueError as exc:
                raise WordVectorsFormatError(f"{path}:{lineno}: malformed number in vector of {parts[0]!r}: {exc}") from None
            words.append(parts[0])
            rows.append(vec)
            if len(words) >= max_words:
                break
    return words, rows


def _cache_paths(path: Path, max_words: int, cache_dir: str | os.PathLike | None) -> tuple[Path, Path]:
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{max_words}".encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir is not None else path.parent
    stem = f"{path.name}.{key}"
    return folder / f"{stem}.npy", folder / f"{stem}.vocab.json"


def load_word_vectors(
    path: str | os.PathLike, max_words: int = 100_000, cache_dir: str | os.PathLike | None = None,
    *, use_cache: bool = True,
) -> WordVectors:
    """Load the first `max_words` vectors of a GloVe / word2vec text file, L2-normalised.

    A binary copy (``.npy`` + ``.vocab.json``) is written beside the file, or in `cache_dir`, and reused
    while the file's size and modification time are unchanged. Raises FileNotFoundError for a missing
    file and WordVectorsFormatError (a ValueError) naming the file and line of a malformed line.
    """
    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(f"word vector file not found: {path}")
    if max_words <= 0:
        raise ValueError(f"max_words must be positive, got {max_words}")
    if use_cache:
        npy, vocab = _cache_paths(path, max_words, cache_dir)
        if npy.is_file() and vocab.is_file():
            words = json.loads(vocab.read_text(encoding="utf-8"))
            matrix = np.load(npy, allow_pickle=False)
            if matrix.shape[0] == len(words):
                return WordVectors(words, matrix)
    words, matrix = _parse_text(path, max_words)
    if use_cache:
        try:
            npy.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(npy) as tmp:
                with open(tmp, "wb") as f:
                    np.save(f, matrix, allow_pickle=False)
            write_text(vocab, json.dumps(words, ensure_ascii=False))
        except OSError:  # a read-only folder (e.g. shared data): the cache is an optimisation only
            pass
    return WordVectors(words, matrix)
