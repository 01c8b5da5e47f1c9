"""The official SQuAD evaluation (v1.1 and v2.0), the official predictions file, and a trivial span baseline.

No installed library gives this offline: `evaluate`'s "squad" / "squad_v2" metrics are scripts that
`evaluate.load` fetches from the Hugging Face Hub at run time (and `evaluate` is not a dependency), and
transformers 5 no longer ships `transformers.data.metrics.squad_metrics`. So the algorithms of the official scripts
`evaluate-v1.1.py` and `evaluate-v2.0.py` are re-implemented here and tested against hand-computed cases:

- `normalize_answer`: lowercase, drop ASCII punctuation (`string.punctuation`), replace the articles a/an/the
  (whole words) by a space, collapse whitespace.
- exact match: normalised strings equal (0/1); token F1: bag-of-tokens overlap of the normalised strings. v1.1 gives
  F1 0 when either side has no token; v2.0 gives 1 when both have none (a correct "no answer") and 0 otherwise.
- a question's score is the maximum over its gold answers; the totals are 100 x the mean over the questions.
  v1.1: `{"exact_match", "f1"}`; a question without a prediction scores 0 (the official script says so on stderr).
- v2.0: gold answers that normalise to "" are dropped, and a question with none left (an impossible one) has the
  single gold ""; the output has `exact`, `f1`, `total`, `HasAns_*` and `NoAns_*` (the official keys), scores
  with the null odds above `na_prob_thresh` (default 1.0) counted as "no answer", and with null odds given,
  `best_exact` / `best_f1` and their thresholds from the official `find_best_thresh` (questions in increasing
  null odds, switched from "no answer" to their prediction one by one, keeping the best running score). The
  official script fails when a question has no prediction; here that is a `SquadFileError` naming the question.

Predictions files are the official format, one JSON object `{question id: answer text}` ("" = no answer), and for
v2.0 `null_odds.json`, `{question id: null score - best span score}` (the `--na-prob-file` of the official script);
`write_predictions` writes them atomically.

The trivial baseline (`sentence_baseline`) is the question-overlap sentence baseline: each question is answered
with the sentence of its context that shares the most distinct words with it (lowercased `\\w+` words, stop words
removed: NLTK's English list as in `distillery.augment.stopwords`, question words included), ties to the first
sentence. Sentences are split by a simple regex (after . ! or ? and optional closing quotes or brackets, before
whitespace and an upper-case letter, digit or opening quote), not NLTK's Punkt: its pre-trained data is a separate
download that is not available offline. A model that does not beat it has not learned to pick a span.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import datasets

from distillery.errors import InputNotFoundError
from distillery.io import write_text
from distillery.squad.data import SquadFileError, normalize_version

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official normalisation: lowercase, punctuation removed, articles removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> int:
    """1 when the normalised strings are equal, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, version: str = "1.1") -> float:
    """Token F1 of the normalised strings. No token on either side: 0 in v1.1; in v2.0 1 when both have none
    (a correct "no answer"), else 0."""
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(gold).split()
    if version == "2.0" and (not pred or not ref):
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(metric, prediction: str, golds: Sequence[str], **kwargs) -> float:
    """The official `metric_max_over_ground_truths`: the best score of `prediction` against any gold answer."""
    if not golds:
        raise ValueError("no gold answer to score against")
    return max(metric(prediction, g, **kwargs) for g in golds)


def missing_predictions(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> list[str]:
    """The question ids of `gold` (in its order) that have no prediction."""
    return [qid for qid in gold if qid not in predictions]


def evaluate_v1(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """The official v1.1 evaluation: {"exact_match", "f1"} on a 0-100 scale over every question of `gold`
    ({id: gold answer texts}); a question with no prediction scores 0, a prediction for no question is ignored."""
    if not gold:
        raise ValueError("no questions to evaluate")
    em = f1 = 0.0
    for qid, golds in gold.items():
        if not golds:
            raise ValueError(f"question {qid} has no gold answer: a v2.0 dataset; evaluate it as v2.0")
        if qid not in predictions:
            continue
        em += best_over_golds(exact_match, predictions[qid], golds)
        f1 += best_over_golds(f1_score, predictions[qid], golds)
    return {"exact_match": 100.0 * em / len(gold), "f1": 100.0 * f1 / len(gold)}


def raw_scores_v2(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Per question (exact, f1) of the official v2.0 `get_raw_scores`: golds that normalise to "" dropped, "" the
    only gold of a question with none left."""
    missing = missing_predictions(gold, predictions)
    if missing:
        raise SquadFileError(f"no prediction for {len(missing)} of {len(gold)} questions (first: question "
                             f"{missing[0]}); the v2.0 evaluation needs one for every question (\"\" = no answer)")
    exact, f1 = {}, {}
    for qid, golds in gold.items():
        kept = [g for g in golds if normalize_answer(g)] or [""]
        exact[qid] = float(best_over_golds(exact_match, predictions[qid], kept))
        f1[qid] = best_over_golds(f1_score, predictions[qid], kept, version="2.0")
    return exact, f1


def apply_no_answer_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float],
                              has_answer: Mapping[str, bool], threshold: float) -> dict[str, float]:
    """Scores with every question whose null odds exceed `threshold` counted as "no answer" (1 when it has none)."""
    return {qid: float(not has_answer[qid]) if na_probs[qid] > threshold else s for qid, s in scores.items()}


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str]) -> dict[str, float]:
    total = len(qids)
    return {"exact": 100.0 * sum(exact[q] for q in qids) / total, "f1": 100.0 * sum(f1[q] for q in qids) / total,
            "total": total}


def find_best_thresh(predictions: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float],
                     has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """The official `find_best_thresh`: (best score on the 0-100 scale, its null-odds threshold).

    Start from "no answer" everywhere (every impossible question right), then take the questions in increasing
    null odds (stable: ties in `na_probs`'s order) and answer each with its prediction: an answerable one adds its
    score, an impossible one loses 1 when the prediction is not empty. The best running score and the null odds
    where it was reached are returned."""
    current = best = sum(1 for qid in has_answer if not has_answer[qid])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """The official v2.0 evaluation of `predictions` against `gold` ({id: gold answer texts}, [] = impossible).

    na_probs: the null odds per question (`null_odds.json`); without them every question has 0 and no best
    threshold is searched. Keys as the official script: exact, f1, total, HasAns_exact, HasAns_f1, HasAns_total,
    NoAns_* (each when such questions exist), best_exact, best_exact_thresh, best_f1, best_f1_thresh (with
    na_probs)."""
    if not gold:
        raise ValueError("no questions to evaluate")
    exact_raw, f1_raw = raw_scores_v2(gold, predictions)
    has_answer = {qid: bool(golds) for qid, golds in gold.items()}
    searched = na_probs is not None
    if na_probs is None:
        na_probs = {qid: 0.0 for qid in predictions}
    lacking = [qid for qid in gold if qid not in na_probs]
    if lacking:
        raise SquadFileError(f"no null odds for {len(lacking)} of {len(gold)} questions (first: question "
                             f"{lacking[0]}); the null-odds file needs one number per question")
    exact = apply_no_answer_threshold(exact_raw, na_probs, has_answer, na_prob_thresh)
    f1 = apply_no_answer_threshold(f1_raw, na_probs, has_answer, na_prob_thresh)
    out = _summary(exact, f1, list(gold))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has == wanted]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1, qids).items()})
    if searched:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(predictions, exact_raw, na_probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, na_probs, has_answer)
    return out


def evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str], version: str,
             na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """`evaluate_v1` or `evaluate_v2` by `version` ("1.1" / "2.0"); null odds are a v2.0 input only."""
    v = normalize_version(version)
    if v == "1.1":
        if na_probs is not None:
            raise ValueError("null odds are a SQuAD v2.0 input; a v1.1 evaluation has no 'no answer'")
        return evaluate_v1(gold, predictions)
    if v == "2.0":
        return evaluate_v2(gold, predictions, na_probs, na_prob_thresh)
    raise ValueError(f"version must be '1.1' or '2.0', got {version!r}")


# ----------------------------------------------------------------------------------------------------------------
# predictions files (the official format)


def _check_predictions(predictions: Mapping[str, Any], source: str) -> dict[str, str]:
    if not isinstance(predictions, Mapping):
        raise SquadFileError(f"{source}: expected a JSON object {{question id: answer text}}, got "
                             f"{type(predictions).__name__}")
    for qid, text in predictions.items():
        if not isinstance(qid, str) or not isinstance(text, str):
            raise SquadFileError(f"{source}: question {qid}: the answer must be a string, got {type(text).__name__}")
    return dict(predictions)


def _check_null_odds(null_odds: Mapping[str, Any], source: str) -> dict[str, float]:
    if not isinstance(null_odds, Mapping):
        raise SquadFileError(f"{source}: expected a JSON object {{question id: null odds}}, got "
                             f"{type(null_odds).__name__}")
    out = {}
    for qid, value in null_odds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SquadFileError(f"{source}: question {qid}: the null odds must be a finite number, got {value!r}")
        out[str(qid)] = float(value)
    return out


def write_predictions(path: str | os.PathLike, predictions: Mapping[str, str],
                      null_odds: Mapping[str, float] | None = None,
                      null_odds_path: str | os.PathLike | None = None) -> list[Path]:
    """Write `predictions` ({question id: answer text}) to `path` in the official format and, for v2.0, the null
    odds to `null_odds_path` (default `null_odds.json` beside it); each file atomically, in the given order (the
    order breaks ties in `find_best_thresh`). Returns the paths written."""
    preds = _check_predictions(predictions, str(path))
    odds = None
    if null_odds is not None:  # both checked before either is written
        odds = _check_null_odds(null_odds, "null odds")
        lacking = [qid for qid in preds if qid not in odds]
        if lacking:
            raise ValueError(f"null odds lack {len(lacking)} predicted questions (first: {lacking[0]})")
    written = [write_text(path, json.dumps(preds, indent=2, ensure_ascii=False) + "\n")]
    if odds is not None:
        target = Path(path).with_name("null_odds.json") if null_odds_path is None else Path(null_odds_path)
        written.append(write_text(target, json.dumps(odds, indent=2, ensure_ascii=False) + "\n"))
    return written


def _read_json_object(path: str | os.PathLike, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(f"{what} {path} not found")
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise SquadFileError(f"{path}: byte {exc.start} is not UTF-8; a {what} is UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise SquadFileError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None


def read_predictions(path: str | os.PathLike) -> dict[str, str]:
    """An official predictions file: {question id: answer text}."""
    return _check_predictions(_read_json_object(path, "predictions file"), str(path))


def read_null_odds(path: str | os.PathLike) -> dict[str, float]:
    """A null-odds file (`--na-prob-file`): {question id: number}, in file order."""
    return _check_null_odds(_read_json_object(path, "null-odds file"), str(path))


# ----------------------------------------------------------------------------------------------------------------
# the question-overlap sentence baseline

_SENTENCE_END = re.compile(r"[.!?]+[\"')\]\u201d\u2019]*(?=\s+[\"'(\[\u201c\u2018]*[A-Z0-9])")
_WORD = re.compile(r"\w+")
QUESTION_WORDS = frozenset({"what", "which", "who", "whom", "when", "where", "why", "how"})


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans (start, end) of the sentences of `text` (see the module docstring), whitespace trimmed."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


def _content_words(text: str, stopwords: frozenset[str]) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in stopwords}


def sentence_baseline(examples: datasets.Dataset | Mapping[str, Sequence]) -> dict[str, str]:
    """{question id: the context sentence sharing the most content words with the question} (ties: the first)."""
    from distillery.augment.stopwords import STOPWORDS  # lazy: the augment package imports torch

    stopwords = STOPWORDS | QUESTION_WORDS
    out: dict[str, str] = {}
    sentences: dict[str, list[tuple[str, set[str]]]] = {}  # per context, split once
    for qid, question, context in zip(_column(examples, "id"), _column(examples, "question"),
                                      _column(examples, "context")):
        if context not in sentences:
            sentences[context] = [(context[s:e], _content_words(context[s:e], stopwords))
                                  for s, e in split_sentences(context)] or [(context, set())]
        words = _content_words(question, stopwords)
        best = max(sentences[context], key=lambda item: len(words & item[1]))  # max keeps the first of ties
        out[qid] = best[0]
    return out


def _column(examples, name: str) -> Iterable:
    column = examples[name]
    return column[:] if isinstance(examples, datasets.Dataset) else column
