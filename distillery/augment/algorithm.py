"""TinyBERT data augmentation, Algorithm 1 of Jiao et al. 2020 ("TinyBERT", Section 3.1, Alg. 1).

For a sentence x = (w_1 ... w_n), tokenised into words by BERT's basic tokenizer (lower-cased):

* an eligible word (purely [a-z], not a stop-word) that is a single WordPiece gets the top-K words of
  a masked language model at its masked position (input: masked sentence + original sentence as the
  second segment, as the official code does); a multi-piece word gets its K nearest GloVe neighbours;
  an empty candidate list becomes the word itself. Candidates are computed once per sentence;
* then N_a tries: each eligible position is replaced, with probability p_t, by a uniform choice among
  its candidates; only new unique sentences are kept and the original comes first (<= N_a + 1 outputs).

Defaults K = 15, p_t = 0.4 and N_a per task follow the official script. Each sentence draws from its own
random generator seeded by (seed, example index, field), so outputs do not depend on batching.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from transformers import BasicTokenizer

from distillery import precision
from distillery.augment.fast import joint_masked_copy
from distillery.augment.glove import WordVectors
from distillery.augment.mlm import MaskedCopy, MaskedLM, build_masked_input
from distillery.augment.stopwords import is_eligible

__all__ = [
    "TASK_N_AUG", "DEFAULT_N_AUG", "default_n_aug", "AugmentConfig", "SentenceAnalysis", "Augmenter",
    "sample_variants", "sentence_rng",
]

# N_a of the official script (TinyBERT/data_augmentation.py, ``default_params``); 20 elsewhere (the paper).
TASK_N_AUG: dict[str, int] = {
    "cola": 30, "mnli": 10, "mrpc": 30, "sst2": 20, "qqp": 10, "qnli": 20, "rte": 30, "stsb": 30,
}
DEFAULT_N_AUG = 20


def default_n_aug(task: str | None) -> int:
    """N_a for `task` (``"sst2"``, ``"SST-2"``, ``"sts-b"`` ... all accepted); 20 for other tasks."""
    if task is None:
        return DEFAULT_N_AUG
    return TASK_N_AUG.get(task.lower().replace("-", "").replace("_", ""), DEFAULT_N_AUG)


@dataclass
class AugmentConfig:
    """Hyper-parameters of Algorithm 1 and of its implementation.

    k: candidates per word (K); p_t: replacement probability; n_aug: tries per sentence (N_a; None ->
    the task's official default); seed: base of the per-sentence generators; batch_size: masked copies
    per MLM forward; fast: opt-in approximation (one forward per sentence, see `distillery.augment.fast`);
    drop_original / drop_punctuation / drop_subwords: MLM candidate filters (off = official);
    restore_case: re-apply the input's casing to the output words (off = official lower-cased output);
    max_seq_length: MLM input length cut (512 as official); chunk_size: sentences per streamed chunk.
    """

    k: int = 15
    p_t: float = 0.4
    n_aug: int | None = None
    seed: int = 42
    batch_size: int = 32
    fast: bool = False
    drop_original: bool = False
    drop_punctuation: bool = False
    drop_subwords: bool = False
    restore_case: bool = False
    max_seq_length: int = 512
    chunk_size: int = 256

    def __post_init__(self) -> None:
        checks = {
            "k": self.k >= 1, "p_t": 0.0 <= self.p_t <= 1.0, "n_aug": self.n_aug is None or self.n_aug >= 0,
            "batch_size": self.batch_size >= 1, "max_seq_length": self.max_seq_length >= 4,
            "chunk_size": self.chunk_size >= 1,
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"AugmentConfig.{key}: impossible value {getattr(self, key)!r}")


@dataclass
class SentenceAnalysis:
    """A sentence tokenised once: words, their WordPiece ids, and the eligible word indices."""

    text: str
    words: list[str]
    piece_ids: list[int]
    starts: list[int]
    lengths: list[int]
    eligible: list[int]
    cased: list[str] | None = None


def sentence_rng(seed: int, example: int | str, field_name: str) -> random.Random:
    """The generator of one sentence, seeded from (seed, example index, field): batch-independent."""
    return random.Random(f"{seed}/{example}/{field_name}")


def _match_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def sample_variants(
    analysis: SentenceAnalysis, candidates: Mapping[int, Sequence[str]], n_aug: int, p_t: float,
    rng: random.Random, *, restore_case: bool = False,
) -> list[str]:
    """The N_a tries of Algorithm 1: the original sentence first, then each new unique variant.

    A try that changes nothing reproduces the tokenised original and is not kept (the official script
    keeps it once, as a lower-cased duplicate of the original).
    """
    words = analysis.words
    cased = analysis.cased if restore_case and analysis.cased is not None else None

    def join(tokens: list[str]) -> str:
        if cased is None:
            return " ".join(tokens)
        return " ".join(c if t == w else _match_case(t, c) for t, w, c in zip(tokens, words, cased))

    out = [analysis.text]
    seen = {analysis.text, join(list(words))}
    positions = [i for i in analysis.eligible if i in candidates]
    for _ in range(n_aug):
        new = list(words)
        for i in positions:
            choice = rng.choice(candidates[i])
            if rng.random() < p_t:
                new[i] = choice
        text = join(new)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


class Augmenter:
    """Algorithm 1 with a given MLM, its tokenizer, word vectors and `AugmentConfig`."""

    def __init__(self, mlm_model, tokenizer, vectors: WordVectors | None, config: AugmentConfig | None = None) -> None:
        self.config = config or AugmentConfig()
        self.tokenizer = tokenizer
        self.vectors = vectors
        self.mlm = MaskedLM(
            mlm_model, tokenizer, drop_original=self.config.drop_original,
            drop_punctuation=self.config.drop_punctuation, drop_subwords=self.config.drop_subwords,
        )
        # words as the MLM's own basic tokenizer splits them (lower-cased for uncased models, as official)
        self._basic = BasicTokenizer(do_lower_case=bool(getattr(tokenizer, "do_lower_case", True)))
        self._cased = BasicTokenizer(do_lower_case=False) if self.config.restore_case else None
        self._pieces: dict[str, list[int]] = {}

    # -- tokenisation (once per sentence; WordPieces cached per word) -----------------------------
    def _word_pieces(self, word: str) -> list[int]:
        ids = self._pieces.get(word)
        if ids is None:
            if len(self._pieces) > 1_000_000:
                self._pieces.clear()
            ids = self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(word))
            self._pieces[word] = ids
        return ids

    def analyse(self, text: str) -> SentenceAnalysis:
        words = self._basic.tokenize(text or "")
        piece_ids: list[int] = []
        starts, lengths, eligible = [], [], []
        for i, w in enumerate(words):
            ids = self._word_pieces(w)
            starts.append(len(piece_ids))
            lengths.append(len(ids))
            piece_ids.extend(ids)
            if ids and is_eligible(w):
                eligible.append(i)
        cased = None
        if self._cased is not None:
            cased = self._cased.tokenize(text or "")
            if len(cased) != len(words):
                cased = None
        return SentenceAnalysis(text or "", words, piece_ids, starts, lengths, eligible, cased)

    # -- candidates ------------------------------------------------------------------------------
    def _copy(self, a: SentenceAnalysis, words: list[int]) -> MaskedCopy:
        build = joint_masked_copy if len(words) > 1 else build_masked_input
        return build(
            a.piece_ids, [a.starts[i] for i in words], cls_id=self.mlm.cls_id, sep_id=self.mlm.sep_id,
            mask_id=self.mlm.mask_id, max_seq_length=self.config.max_seq_length,
        )

    def _plan(self, analyses: Sequence[SentenceAnalysis], fast: bool):
        copies: list[MaskedCopy] = []
        owners: list[tuple[int, list[int]]] = []
        glove: list[tuple[int, int]] = []
        for s, a in enumerate(analyses):
            single = [i for i in a.eligible if a.lengths[i] == 1]
            glove.extend((s, i) for i in a.eligible if a.lengths[i] > 1)
            groups = [single] if fast and single else [[i] for i in single]
            for g in groups:
                copies.append(self._copy(a, g))
                owners.append((s, g))
        return copies, owners, glove

    def _assemble(self, analyses, owners, copies, mlm_out, glove, glove_out) -> list[dict[int, list[str]]]:
        result: list[dict[int, list[str]]] = [dict() for _ in analyses]
        for (s, group), copy, cands in zip(owners, copies, mlm_out):
            for j, i in enumerate(group):  # masks cut by max_seq_length are a suffix: no candidates
                result[s][i] = list(cands[j]) if j < len(copy.positions) else []
        for (s, i), cands in zip(glove, glove_out):
            word = analyses[s].words[i]  # cased models: title-case the neighbours of a title word (official)
            result[s][i] = [c.title() for c in cands] if word.istitle() else list(cands)
        for s, a in enumerate(analyses):
            ordered = {}
            for i in a.eligible:
                ordered[i] = result[s].get(i) or [a.words[i]]  # empty -> the word itself
            result[s] = ordered
        return result

    def candidates_for(self, analyses: Sequence[SentenceAnalysis], *, fast: bool | None = None) -> list[dict[int, list[str]]]:
        """Candidate words of every eligible position (word index -> list), batched over all sentences."""
        fast = self.config.fast if fast is None else fast
        copies, owners, glove = self._plan(analyses, fast)
        # the faithful path keeps fp32 forwards: bf16 changed 1.1% of the top-15 candidates of a real MLM and the order
        # of most lists (`python -m benchmarks.precision --mlm DIR`); fast mode, an approximation already, follows the
        # precision in force (distillery.precision)
        with contextlib.nullcontext() if fast else precision.use("fp32"):
            mlm_out = self.mlm.topk(copies, self.config.k, self.config.batch_size) if copies else []
        glove_words = [analyses[s].words[i] for s, i in glove]
        glove_out = self.vectors.neighbours_many(glove_words, self.config.k) if self.vectors is not None else [[] for _ in glove]
        return self._assemble(analyses, owners, copies, mlm_out, glove, glove_out)

    def candidates(self, sentences: Sequence[str], *, fast: bool | None = None) -> list[dict[int, list[str]]]:
        """Candidates of each sentence's eligible words (word index in the basic tokenisation -> words)."""
        return self.candidates_for([self.analyse(t) for t in sentences], fast=fast)

    def reference_candidates(self, sentences: Sequence[str], *, autograd: bool = True) -> list[dict[int, list[str]]]:
        """The per-position reference: one batch-1 MLM forward per eligible single-piece word and a full
        sort over the GloVe matrix per multi-piece word, as the official script computes them."""
        analyses = [self.analyse(t) for t in sentences]
        copies, owners, glove = self._plan(analyses, fast=False)
        mlm_out = [self.mlm.reference_topk(c, self.config.k, autograd=autograd) for c in copies]
        glove_out = [
            self.vectors.reference_neighbours(analyses[s].words[i], self.config.k) if self.vectors is not None else []
            for s, i in glove
        ]
        return self._assemble(analyses, owners, copies, mlm_out, glove, glove_out)

    # -- sampling --------------------------------------------------------------------------------
    def augment_sentence(
        self, sentence: str, n_aug: int | None = None, *, rng: random.Random | None = None,
        candidates: Mapping[int, Sequence[str]] | None = None, analysis: SentenceAnalysis | None = None,
    ) -> list[str]:
        """Algorithm 1 on one sentence: the original first, then up to N_a new unique variants."""
        analysis = analysis or self.analyse(sentence)
        if candidates is None:
            candidates = self.candidates_for([analysis])[0]
        n = self.config.n_aug if n_aug is None else n_aug
        n = DEFAULT_N_AUG if n is None else n
        rng = rng or sentence_rng(self.config.seed, 0, "a")
        return sample_variants(analysis, candidates, n, self.config.p_t, rng, restore_case=self.config.restore_case)

    def augment_rows(self, rows: Iterable[Mapping], task: str | None = None, *, start: int = 0) -> Iterator[dict]:
        """Augmented rows of GLUE-style examples (``text_a``, optional ``text_b``, ``label``, ``idx``).

        Yields dicts ``text_a`` [, ``text_b``], ``label``, ``source_idx``: the original example first,
        then the variants of text_a (text_b kept original), then those of text_b (text_a kept original);
        the official script's bug (rows of text_b carrying the last variant of text_a) is not reproduced.
        Works in chunks of ``config.chunk_size`` examples, so memory stays flat on any input size. `start`: the
        position of the first row in the whole set (the index of rows without ``idx``).
        """
        n_aug = self.config.n_aug if self.config.n_aug is not None else default_n_aug(task)
        chunk: list[Mapping] = []
        position = start
        for row in rows:
            chunk.append(row)
            if len(chunk) >= self.config.chunk_size:
                yield from self._augment_chunk(chunk, n_aug, position)
                position += len(chunk)
                chunk = []
        if chunk:
            yield from self._augment_chunk(chunk, n_aug, position)

    def _augment_chunk(self, rows: list[Mapping], n_aug: int, offset: int) -> Iterator[dict]:
        fields: list[tuple[int, str]] = []
        analyses: list[SentenceAnalysis] = []
        for r, row in enumerate(rows):
            if "text_a" not in row:
                raise KeyError(f"augment: example {offset + r} has no 'text_a' (keys: {sorted(row)})")
            for name in ("text_a", "text_b"):
                if row.get(name) is not None:
                    fields.append((r, name))
                    analyses.append(self.analyse(str(row[name])))
        cands = self.candidates_for(analyses)
        variants: dict[tuple[int, str], list[str]] = {}
        for (r, name), a, c in zip(fields, analyses, cands):
            idx = rows[r].get("idx", offset + r)
            rng = sentence_rng(self.config.seed, idx, name)
            variants[(r, name)] = sample_variants(a, c, n_aug, self.config.p_t, rng, restore_case=self.config.restore_case)
        for r, row in enumerate(rows):
            idx = row.get("idx", offset + r)
            label = row.get("label", -1)
            pair = row.get("text_b") is not None
            base = {"text_a": str(row["text_a"])}
            if pair:
                base["text_b"] = str(row["text_b"])
            yield {**base, "label": label, "source_idx": idx}
            for name in ("text_a", "text_b") if pair else ("text_a",):
                for text in variants[(r, name)][1:]:
                    yield {**base, name: text, "label": label, "source_idx": idx}
