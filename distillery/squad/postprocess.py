"""Start/end logits of the eval features -> one answer per question (BERT, Devlin et al. 2019, sec. 4.2-4.3; the
algorithm of BERT's `run_squad.py` and of `run_qa.py`'s `postprocess_qa_predictions`).

For every window of a question, the `n_best` (20) highest start logits are paired with the `n_best` highest end
logits; a pair is a candidate when both tokens are context tokens (an offset, not None), end >= start and it spans at
most `max_answer_length` (30) tokens. Its score is start logit + end logit and its text is the context's characters
from the start token's first to the end token's last character (the original context, so case, spacing and
punctuation are kept). The best `n_best` candidates over all windows are kept; when the top-n pairing finds no valid
candidate at all, the best valid span of every window is taken instead.

v2.0: the null score is the smallest CLS start + end logit over the question's windows; `null_odds` = null score -
best span score. The answer is "" (no answer) when `null_odds > null_threshold` (0.0: the null score wins), else the
best span. `null_odds` is what `null_odds.json` holds for the official evaluation's best threshold.

Each answer carries its character `start` / `end` in the context (0, 0 for no answer) and `score`, its probability
under a softmax over the kept candidates' scores (and the null score in v2.0), the `score` of a served answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import datasets
import numpy as np


Table = datasets.Dataset | Mapping[str, Sequence]  # columns by name


@dataclass(frozen=True)
class Answer:
    text: str
    start: int  # character offsets of the answer in its context (end exclusive); 0, 0 for no answer
    end: int
    score: float  # softmax probability among the n-best candidates (and the null answer in v2.0)
    logit: float  # start + end logit (the null score for no answer)
    null_odds: float | None = None  # v2.0: null score - best span score; None in v1.1


def _column(table, name: str) -> list:
    column = table[name]
    return list(column[:] if isinstance(table, datasets.Dataset) else column)


def _window_candidates(start: np.ndarray, end: np.ndarray, offsets: Sequence, n_best: int, max_answer_length: int,
                       exhaustive: bool = False) -> list[tuple[float, int, int]]:
    """(score, start char, end char) of the valid spans of one window from its top-n starts x top-n ends (or, with
    `exhaustive`, its single best valid span)."""
    is_context = np.array([o is not None for o in offsets], dtype=bool)
    if exhaustive:
        n = len(offsets)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        valid = is_context[:, None] & is_context[None, :] & (j >= i) & (j - i < max_answer_length)
        if not valid.any():
            return []
        scores = np.where(valid, start[:, None] + end[None, :], -np.inf)
        s, e = np.unravel_index(int(np.argmax(scores)), scores.shape)
        return [(float(scores[s, e]), offsets[s][0], offsets[e][1])]
    out = []
    for s in np.argsort(-start, kind="stable")[:n_best]:
        if not is_context[s]:
            continue
        for e in np.argsort(-end, kind="stable")[:n_best]:
            if is_context[e] and s <= e < s + max_answer_length:
                out.append((float(start[s] + end[e]), offsets[s][0], offsets[e][1]))
    return out


def _softmax(scores: Sequence[float]) -> np.ndarray:
    x = np.asarray(scores, dtype=np.float64)
    x = np.exp(x - x.max())
    return x / x.sum()


def postprocess(examples: Table, features: Table, start_logits, end_logits, *, version: str = "1.1",
                n_best: int = 20, max_answer_length: int = 30, null_threshold: float = 0.0) -> dict[str, Answer]:
    """{question id: Answer} for every question of `examples` ({"id", "context"} columns), from the logits of its
    eval `features` ({"example_id", "offset_mapping"} columns, `distillery.squad.features.eval_features`).

    start_logits / end_logits: (features, tokens) arrays, row i for feature i; rows longer than a feature (padding
    of a batch) are cut to its length. version "2.0" allows the null answer (see the module docstring)."""
    if version not in ("1.1", "2.0"):
        raise ValueError(f"version must be '1.1' or '2.0', got {version!r}")
    if n_best < 1 or max_answer_length < 1:
        raise ValueError(f"n_best and max_answer_length must be >= 1, got {n_best} and {max_answer_length}")
    example_ids = _column(features, "example_id")
    offsets_all = _column(features, "offset_mapping")
    if len(start_logits) != len(example_ids) or len(end_logits) != len(example_ids):
        raise ValueError(f"{len(example_ids)} features but {len(start_logits)} start and {len(end_logits)} end "
                         "logit rows")
    by_example: dict[str, list[int]] = defaultdict(list)
    for f, qid in enumerate(example_ids):
        by_example[qid].append(f)
    answers = {}
    for qid, context in zip(_column(examples, "id"), _column(examples, "context")):
        windows = by_example.get(qid)
        if not windows:
            raise ValueError(f"question {qid} has no feature; postprocess the features made from these examples")
        answers[qid] = _answer(windows, offsets_all, start_logits, end_logits, context, version, n_best,
                               max_answer_length, null_threshold)
    return answers


def _answer(windows: Iterable[int], offsets_all, start_logits, end_logits, context: str, version: str, n_best: int,
            max_answer_length: int, null_threshold: float) -> Answer:
    inputs = []
    for f in windows:
        offsets = offsets_all[f]
        n = len(offsets)
        inputs.append((np.asarray(start_logits[f], dtype=np.float64)[:n],
                       np.asarray(end_logits[f], dtype=np.float64)[:n], offsets))
    candidates = [c for s, e, o in inputs for c in _window_candidates(s, e, o, n_best, max_answer_length)]
    if not candidates:
        candidates = [c for s, e, o in inputs for c in _window_candidates(s, e, o, n_best, max_answer_length, True)]
    candidates = sorted(candidates, key=lambda c: -c[0])[:n_best]  # stable: ties keep window and logit order
    null = min(float(s[0] + e[0]) for s, e, _ in inputs) if version == "2.0" else None
    if not candidates:  # no context token at all in any window (not possible for a non-empty context)
        return Answer("", 0, 0, 1.0, 0.0 if null is None else null, None if null is None else float("inf"))
    probs = _softmax([c[0] for c in candidates] + ([] if null is None else [null]))
    best_score, start, end = candidates[0]
    if null is None:
        return Answer(context[start:end], start, end, float(probs[0]), best_score)
    odds = null - best_score
    if odds > null_threshold:
        return Answer("", 0, 0, float(probs[-1]), null, odds)
    return Answer(context[start:end], start, end, float(probs[0]), best_score, odds)


def prediction_texts(answers: Mapping[str, Answer]) -> dict[str, str]:
    """{question id: answer text}: the official predictions file."""
    return {qid: a.text for qid, a in answers.items()}


def null_odds(answers: Mapping[str, Answer]) -> dict[str, float]:
    """{question id: null odds} of v2.0 answers: `null_odds.json`."""
    missing = [qid for qid, a in answers.items() if a.null_odds is None]
    if missing:
        raise ValueError(f"question {missing[0]} has no null odds: v1.1 answers have none")
    return {qid: float(a.null_odds) for qid, a in answers.items()}
