"""The official SQuAD evaluation on hand-computed cases, postprocessing on synthetic logits, predictions files, the
sentence baseline and the `distillery squad` commands; gold answers and the baseline on the real dev-v1.1.json."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from distillery.cli import main as cli_main
from distillery.squad import (
    SquadFileError, evaluate, evaluate_v1, evaluate_v2, exact_match, f1_score, find_best_thresh, gold_answers,
    normalize_answer, null_odds, postprocess, prediction_texts, read_null_odds, read_predictions, read_squad,
    sentence_baseline, split_sentences, write_predictions,
)

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
DEV = SHARED / "squad" / "dev-v1.1.json"
VOCAB = SHARED / "vocab" / "bert-base-uncased-vocab.txt"
needs_dev = pytest.mark.skipif(not DEV.is_file(), reason="shared SQuAD dev-v1.1.json not present")


# --------------------------------------------------------------------------------------------------------------
# the official metrics


@pytest.mark.parametrize("text,normalized", [
    ("The  Eiffel\tTower!", "eiffel tower"),
    ("an apple, a day", "apple day"),
    ("Theory of the anthem", "theory of anthem"),  # articles are whole words only
    ("U.S.A.", "usa"),
    ("rock-n-roll's (1950s)", "rocknrolls 1950s"),  # ASCII punctuation removed, not replaced by a space
    ("\u201cquoted\u201d", "\u201cquoted\u201d"),  # curly quotes are not string.punctuation: kept, as officially
    ("  A  ", ""),
])
def test_normalize_answer(text, normalized):
    assert normalize_answer(text) == normalized


def test_exact_match_and_f1_hand_computed():
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1
    assert exact_match("Eiffel", "Eiffel Tower") == 0
    # pred "the big red dog" -> [big, red, dog]; gold "a red dog barked" -> [red, dog, barked]: 2 common,
    # P = 2/3, R = 2/3, F1 = 2/3
    assert f1_score("the big red dog", "a red dog barked") == pytest.approx(2 / 3)
    # repeated tokens count once per occurrence: pred [dog, dog, cat], gold [dog, cat, cat, mouse];
    # common = min(2, 1) dog + min(1, 2) cat = 2; P = 2/3, R = 2/4; F1 = 2 * (1/3) / (7/6) = 4/7
    assert f1_score("dog dog cat", "dog cat cat mouse") == pytest.approx(4 / 7)
    assert f1_score("Paris.", "paris") == 1.0 and f1_score("Lyon", "Paris") == 0.0
    # no token on a side: v1.1 scores 0 always, v2.0 1 when both are empty ("the" normalises to "")
    assert f1_score("", "") == 0.0 and f1_score("the", "") == 0.0
    assert f1_score("", "", version="2.0") == 1.0 and f1_score("the", "", version="2.0") == 1.0
    assert f1_score("Paris", "", version="2.0") == 0.0 and f1_score("", "Paris", version="2.0") == 0.0


def test_evaluate_v1_max_over_golds_and_missing_predictions():
    gold = {"q1": ["Paris", "the city of Paris"], "q2": ["red dog barked"], "q3": ["1990"]}
    preds = {"q1": "City of Paris!", "q2": "big red dog", "other": "ignored"}  # q3 unanswered
    # q1: EM 1 (second gold), F1 1; q2: EM 0, F1 = [big, red, dog] vs [red, dog, barked] = 2/3; q3: 0 and 0
    result = evaluate_v1(gold, preds)
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == pytest.approx(100 / 3)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert evaluate(gold, preds, "1.1") == result
    with pytest.raises(ValueError, match="question q2 has no gold answer"):
        evaluate_v1({"q2": []}, {"q2": ""})
    with pytest.raises(ValueError, match="null odds are a SQuAD v2.0 input"):
        evaluate(gold, preds, "1.1", na_probs={"q1": 0.0})


V2_GOLD = {"h1": ["Paris"], "h2": ["red dog"], "n1": [], "n2": []}
V2_PREDS = {"h1": "Paris", "h2": "big red dog", "n1": "", "n2": "something"}
V2_NA = {"h1": 0.1, "h2": 0.3, "n2": 0.4, "n1": 0.9}


def test_evaluate_v2_has_ans_no_ans_and_best_threshold():
    # raw exact: h1 1, h2 0, n1 1 ("" = the only gold ""), n2 0; raw F1: h1 1, h2 [big, red, dog] vs [red, dog]:
    # P = 2/3, R = 1 -> 0.8; n1 1; n2 0
    out = evaluate_v2(V2_GOLD, V2_PREDS)
    assert out == pytest.approx({"exact": 50.0, "f1": 70.0, "total": 4,
                                 "HasAns_exact": 50.0, "HasAns_f1": 90.0, "HasAns_total": 2,
                                 "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})
    assert "best_exact" not in out  # no null odds given: no threshold search
    # best threshold: start with "no answer" everywhere = 2 (n1, n2 right); in increasing null odds:
    # exact: h1 +1 -> 3 (best, 0.1), h2 +0 -> 3 (not better), n2 -1 (it answers) -> 2, n1 +0 -> 2
    #   -> best_exact = 100 * 3 / 4 = 75 at 0.1
    # f1:    h1 +1 -> 3 (0.1), h2 +0.8 -> 3.8 (best, 0.3), n2 -1 -> 2.8, n1 +0 -> 2.8 -> best_f1 = 95 at 0.3
    out = evaluate_v2(V2_GOLD, V2_PREDS, V2_NA)
    assert (out["best_exact"], out["best_exact_thresh"]) == (pytest.approx(75.0), 0.1)
    assert (out["best_f1"], out["best_f1_thresh"]) == (pytest.approx(95.0), 0.3)
    assert out["exact"] == 50.0  # the default threshold 1.0 changes nothing
    # threshold 0.35: n2 (0.4) and n1 (0.9) count as "no answer", both right -> exact (1+0+1+1)/4, f1 (1+.8+1+1)/4
    out = evaluate_v2(V2_GOLD, V2_PREDS, V2_NA, na_prob_thresh=0.35)
    assert (out["exact"], out["f1"]) == (pytest.approx(75.0), pytest.approx(95.0))
    assert (out["NoAns_exact"], out["HasAns_exact"]) == (100.0, 50.0)
    # only answerable questions: no NoAns keys; the search starts at 0
    only = {"h1": ["Paris"]}
    assert find_best_thresh({"h1": "Paris"}, {"h1": 1.0}, {"h1": 0.5}, {"h1": True}) == (100.0, 0.5)
    assert "NoAns_exact" not in evaluate_v2(only, {"h1": "x"})


def test_evaluate_v2_gold_normalising_to_empty_and_missing_inputs():
    # a gold that normalises to "" is dropped; none left: the gold is "" (so "" is right, "the" too)
    assert evaluate_v2({"q": ["The"]}, {"q": ""})["exact"] == 100.0
    assert evaluate_v2({"q": ["The", "dog"]}, {"q": "dog"})["exact"] == 100.0
    with pytest.raises(SquadFileError, match=r"no prediction for 1 of 4 questions \(first: question n2\)"):
        evaluate_v2(V2_GOLD, {k: v for k, v in V2_PREDS.items() if k != "n2"})
    with pytest.raises(SquadFileError, match=r"no null odds for 1 of 4 questions \(first: question n1\)"):
        evaluate_v2(V2_GOLD, V2_PREDS, {k: v for k, v in V2_NA.items() if k != "n1"})


# --------------------------------------------------------------------------------------------------------------
# predictions files


def test_write_and_read_predictions_atomically(tmp_path):
    preds = {"z": "Zürich", "a": ""}
    paths = write_predictions(tmp_path / "out" / "predictions.json", preds, null_odds={"z": -1.5, "a": 2})
    assert paths == [tmp_path / "out" / "predictions.json", tmp_path / "out" / "null_odds.json"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["null_odds.json", "predictions.json"]  # no temp
    assert list(read_predictions(paths[0]).items()) == [("z", "Zürich"), ("a", "")]  # the given order
    assert read_null_odds(paths[1]) == {"z": -1.5, "a": 2.0}
    with pytest.raises(SquadFileError, match="question q: the answer must be a string"):
        write_predictions(tmp_path / "bad" / "p.json", {"q": 3})
    with pytest.raises(SquadFileError, match="question a: the null odds must be a finite number"):
        write_predictions(tmp_path / "bad" / "p.json", preds, null_odds={"z": 0.0, "a": float("nan")})
    assert not (tmp_path / "bad" / "p.json").exists()
    (tmp_path / "p.json").write_text('{"q": "x",}')
    with pytest.raises(SquadFileError, match=r"p\.json:1:11: not valid JSON"):
        read_predictions(tmp_path / "p.json")
    (tmp_path / "p.json").write_text('["x"]')
    with pytest.raises(SquadFileError, match="expected a JSON object"):
        read_predictions(tmp_path / "p.json")


# --------------------------------------------------------------------------------------------------------------
# postprocessing


CONTEXT = "alpha beta gamma delta"
# [CLS] q q [SEP] alpha beta gamma delta [SEP]
OFFSETS = [None, None, None, None, [0, 5], [6, 10], [11, 16], [17, 22], None]


def _logits(n: int, start: dict, end: dict) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.zeros(n), np.zeros(n)
    for k, v in start.items():
        s[k] = v
    for k, v in end.items():
        e[k] = v
    return s, e


def _run(start, end, offsets=OFFSETS, context=CONTEXT, **kwargs):
    examples = {"id": ["q"], "context": [context]}
    features = {"example_id": ["q"], "offset_mapping": [offsets]}
    return postprocess(examples, features, [start], [end], **kwargs)["q"]


def test_postprocess_best_span_from_the_original_context():
    s, e = _logits(9, {5: 3.0, 4: 1.0}, {6: 2.0, 7: 1.5})
    a = _run(s, e)
    assert (a.text, a.start, a.end, a.logit) == ("beta gamma", 6, 16, 5.0)
    assert 0 < a.score < 1 and a.null_odds is None


def test_postprocess_refuses_invalid_spans():
    # candidates: (6,6) 4+1 = 5; (5,5) 1+9 = 10; (5,6) 1+1 = 2; (6,5) end < start: refused;
    # start 1 (a question token), end 2 / 8 (question token, [SEP]): refused
    s, e = _logits(9, {1: 50.0, 0: 40.0, 6: 4.0, 5: 1.0}, {2: 50.0, 8: 45.0, 5: 9.0, 6: 1.0})
    a = _run(s, e)
    assert (a.text, a.start, a.end, a.logit) == ("beta", 6, 10, 10.0)


def test_postprocess_max_answer_length_and_padding():
    words = [f"w{i:02d}" for i in range(40)]
    context = " ".join(words)
    offsets = [None, None, None] + [[4 * i, 4 * i + 3] for i in range(40)] + [None]  # token 3 + i = word i
    # start at word 0; ends at word 35 (36 tokens, logit 9), word 30 (31 tokens, 8), word 29 (30 tokens, 7)
    s, e = _logits(44 + 6, {3: 5.0, 44: 99.0}, {3 + 35: 9.0, 3 + 30: 8.0, 3 + 29: 7.0, 45: 99.0})
    a = _run(s, e, offsets, context)  # logits padded past the feature (a batch's padding): cut to its 44 tokens
    assert (a.text, a.logit) == (" ".join(words[:30]), 12.0)  # 30 tokens is the longest allowed
    a = _run(s, e, offsets, context, max_answer_length=31)
    assert a.text == " ".join(words[:31])
    a = _run(s, e, offsets, context, max_answer_length=5)  # the long ends do not fit; ties: the first pair
    assert a.text == "w00" and a.logit == 5.0
    # n_best 1: the only pair (word 0, word 35) is too long; then the best valid span of the window is taken
    a = _run(s, e, offsets, context, n_best=1)
    assert (a.text, a.logit) == (" ".join(words[:30]), 12.0)


def test_postprocess_several_windows_and_null_answer():
    context = "alpha beta gamma delta epsilon"
    w1 = [None, None, None, [0, 5], [6, 10], [11, 16], None]
    w2 = [None, None, None, [11, 16], [17, 22], [23, 30], None]
    s1, e1 = _logits(7, {0: 4.0, 3: 2.0}, {0: 4.0, 4: 2.0})  # null 8, best span "alpha beta" 4
    s2, e2 = _logits(7, {0: 3.0, 4: 5.0}, {0: 2.0, 5: 4.0})  # null 5, best span "delta epsilon" 9
    examples = {"id": ["q", "other"], "context": [context, "x y"]}
    features = {"example_id": ["q", "q", "other"], "offset_mapping": [w1, w2, [None, [0, 1], [2, 3], None]]}
    start = [s1, s2, np.array([0.0, 1.0, 0.0, 0.0])]
    end = [e1, e2, np.array([0.0, 0.0, 1.0, 0.0])]
    v1 = postprocess(examples, features, start, end)
    assert (v1["q"].text, v1["q"].start, v1["q"].end) == ("delta epsilon", 17, 30)
    assert v1["other"].text == "x y"
    # v2.0: null = min over windows = 5; null_odds = 5 - 9 = -4 <= 0: the span
    v2 = postprocess(examples, features, start, end, version="2.0")
    assert (v2["q"].text, v2["q"].null_odds) == ("delta epsilon", -4.0)
    s2[0] = 9.0  # null now min(8, 11) = 8; odds 8 - 9 = -1
    v2 = postprocess(examples, features, start, end, version="2.0")
    assert v2["q"].null_odds == -1.0 and v2["q"].text == "delta epsilon"
    s1[0], s2[0] = 12.0, 12.0  # null min(16, 14) = 14; odds 14 - 9 = 5 > 0: no answer
    v2 = postprocess(examples, features, start, end, version="2.0")
    assert (v2["q"].text, v2["q"].start, v2["q"].end, v2["q"].logit, v2["q"].null_odds) == ("", 0, 0, 14.0, 5.0)
    assert v2["q"].score > 0.5  # the null answer dominates the softmax
    v2 = postprocess(examples, features, start, end, version="2.0", null_threshold=6.0)  # odds 5 <= 6: the span
    assert v2["q"].text == "delta epsilon"
    assert prediction_texts(v2) == {"q": "delta epsilon", "other": "x y"}
    assert set(null_odds(v2)) == {"q", "other"}
    with pytest.raises(ValueError, match="v1.1 answers have none"):
        null_odds(v1)
    with pytest.raises(ValueError, match="question missing has no feature"):
        postprocess({"id": ["missing"], "context": ["x"]}, features, start, end)
    with pytest.raises(ValueError, match="3 features but 2 start"):
        postprocess(examples, features, start[:2], end)


@needs_dev
def test_features_and_postprocess_round_trip_on_real_questions():
    """Logits that point at each window's gold answer give back the gold text: features + postprocess agree."""
    import transformers

    from distillery.squad import prepare_eval_features, prepare_train_features

    if not VOCAB.is_file():
        pytest.skip("shared vocabulary not present")
    tok = transformers.BertTokenizerFast(vocab=str(VOCAB), do_lower_case=True)
    ds = read_squad(DEV).dataset().select(range(0, 10570, 97))
    tf, ef = prepare_train_features(ds, tok), prepare_eval_features(ds, tok)
    start = np.zeros((len(ef), 384))
    end = np.zeros((len(ef), 384))
    too_long = set()
    for i, (qid, s, e) in enumerate(zip(ef["example_id"][:], tf["start_positions"][:], tf["end_positions"][:])):
        start[i, s] += 10.0
        end[i, e] += 10.0
        if e - s + 1 > 30:
            too_long.add(qid)
    answers = postprocess(ds, ef, start, end)
    gold = gold_answers(ds)
    assert len(too_long) == 1  # one gold answer of more than 30 tokens: refused (max_answer_length)
    assert all(answers[q].text == gold[q][0] for q in gold if q not in too_long)
    assert all(answers[q].text != gold[q][0] for q in too_long)
    assert evaluate_v1({q: g for q, g in gold.items() if q not in too_long},
                       prediction_texts(answers)) == {"exact_match": 100.0, "f1": 100.0}


# --------------------------------------------------------------------------------------------------------------
# the sentence baseline


def test_split_sentences():
    text = "It rained. The end came in 3.5 years! Did the U.S. army go? \u201cYes,\u201d he said.  "
    assert [text[s:e] for s, e in split_sentences(text)] == [
        "It rained.", "The end came in 3.5 years!", "Did the U.S. army go?", "\u201cYes,\u201d he said."]
    assert split_sentences("no end") == [(0, 6)] and split_sentences("  ") == []


def test_sentence_baseline_picks_the_most_overlapping_sentence():
    context = "Cats purr softly. Dogs bark at the mailman. Birds sing at dawn."
    examples = {"id": ["a", "b", "c"], "context": [context] * 3,
                "question": ["At whom do dogs bark?", "What do birds do at dawn?", "Why is the sky blue?"]}
    assert sentence_baseline(examples) == {"a": "Dogs bark at the mailman.", "b": "Birds sing at dawn.",
                                           "c": "Cats purr softly."}  # no overlap at all: the first sentence


@needs_dev
def test_real_dev_gold_is_100_and_the_baseline_is_low(capsys):
    ds = read_squad(DEV).dataset()
    gold = gold_answers(ds)
    assert evaluate_v1(gold, {q: g[0] for q, g in gold.items()}) == {"exact_match": 100.0, "f1": 100.0}
    baseline = evaluate_v1(gold, sentence_baseline(ds))
    with capsys.disabled():
        print(f"\nSQuAD v1.1 dev, question-overlap sentence baseline: EM {baseline['exact_match']:.2f}, "
              f"F1 {baseline['f1']:.2f}")
    assert 0.0 <= baseline["exact_match"] < 3.0  # a whole sentence is almost never the exact answer
    assert 10.0 < baseline["f1"] < 30.0


# --------------------------------------------------------------------------------------------------------------
# the command line


def _write_doc(path: Path, version: str = "1.1") -> Path:
    ctx = "The cat sat on the mat in Paris."
    qas = [{"id": "q1", "question": "Where did the cat sit?", "answers": [{"text": "on the mat", "answer_start": 12}]},
           {"id": "q2", "question": "In which city?", "answers": [{"text": "Paris", "answer_start": 26}]}]
    if version == "2.0":
        for qa in qas:
            qa["is_impossible"] = False
        qas.append({"id": "q3", "question": "Who barked?", "answers": [], "is_impossible": True,
                    "plausible_answers": [{"text": "The cat", "answer_start": 0}]})
    doc = {"version": "v2.0" if version == "2.0" else "1.1",
           "data": [{"title": "Cats", "paragraphs": [{"context": ctx, "qas": qas}]}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_cli_stats(tmp_path, capsys):
    path = _write_doc(tmp_path / "v2.json", "2.0")
    assert cli_main(["squad", "stats", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"version": "2.0", "articles": 1, "paragraphs": 1, "questions": 3,
                                                   "answers": 2, "impossible": 1}
    assert cli_main(["squad", "stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "questions   3" in out and "impossible  1" in out


def test_cli_evaluate_v1_and_v2(tmp_path, capsys):
    data = _write_doc(tmp_path / "v1.json")
    preds = tmp_path / "predictions.json"
    write_predictions(preds, {"q1": "the mat", "q2": "Paris"})
    assert cli_main(["squad", "evaluate", str(data), str(preds)]) == 0
    captured = capsys.readouterr()
    # q1: EM 0 ("mat" vs "on mat"), F1: [mat] vs [on, mat]: P 1, R 1/2 -> 2/3; q2: 1 and 1
    assert json.loads(captured.out) == pytest.approx({"exact_match": 50.0, "f1": 100 * (2 / 3 + 1) / 2})
    assert list(json.loads(captured.out)) == ["exact_match", "f1"] and captured.err == ""
    write_predictions(preds, {"q1": "on the mat"})
    assert cli_main(["squad", "evaluate", str(data), str(preds)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"exact_match": 50.0, "f1": 50.0}
    assert captured.err == "warning: 1 of 2 questions have no prediction and score 0 (first: q2)\n"
    data2 = _write_doc(tmp_path / "v2.json", "2.0")
    write_predictions(preds, {"q1": "on the mat", "q2": "Paris", "q3": "a dog"}, null_odds={"q1": -2, "q2": 0,
                                                                                            "q3": 1})
    assert cli_main(["squad", "evaluate", str(data2), str(preds), "--na-prob-file",
                     str(tmp_path / "null_odds.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    # exact q1 1, q2 1, q3 0 (answered "a dog"); best: start 1 (q3 right), q1 +1, q2 +1, q3 -1 -> best 3 at 0
    assert out["exact"] == pytest.approx(200 / 3) and out["NoAns_exact"] == 0.0 and out["HasAns_total"] == 2
    assert (out["best_exact"], out["best_exact_thresh"]) == (100.0, 0.0)


def test_cli_bad_input_is_one_error_line(tmp_path, capsys):
    data = _write_doc(tmp_path / "v1.json")
    preds = tmp_path / "predictions.json"
    write_predictions(preds, {"q1": "x"})
    bad = tmp_path / "bad.json"
    doc = json.loads(data.read_text())
    doc["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 3
    bad.write_text(json.dumps(doc))
    (tmp_path / "broken.json").write_text("{")
    preds3, odds = tmp_path / "p3.json", tmp_path / "odds.json"
    preds3.write_text(json.dumps({"q1": "x", "q2": "y", "q3": ""}))
    odds.write_text(json.dumps({"q1": 0.5, "q2": -1}))
    cases = [
        (["squad", "stats", str(bad)], rf"error: {bad}: question q2: answer 1 'Paris' is not at its answer_start 3"),
        (["squad", "evaluate", str(bad), str(preds)], rf"error: {bad}: question q2: answer 1 'Paris'"),
        (["squad", "evaluate", str(data), str(tmp_path / "broken.json")], rf"error: {tmp_path}/broken.json:1:2: "),
        (["squad", "evaluate", str(data), str(tmp_path / "nope.json")],
         r"error: predictions file .*nope.json not found"),
        (["squad", "stats", str(tmp_path / "nope.json")], r"error: SQuAD file .*nope.json not found"),
        (["squad", "evaluate", str(data), str(preds), "--na-prob-file", str(preds)],
         r"error: .*null odds are a SQuAD v2.0 input"),
        (["squad", "stats", str(_write_doc(tmp_path / "v2.json", "2.0")), "--version", "1.1"],
         r"error: .*v2.json: question q3: is marked is_impossible"),
        (["squad", "evaluate", str(tmp_path / "v2.json"), str(preds)],
         rf"error: {preds}: no prediction for 2 of 3 questions \(first: question q2\)"),
        (["squad", "evaluate", str(tmp_path / "v2.json"), str(preds3), "--na-prob-file", str(odds)],
         rf"error: {odds}: no null odds for 1 of 3 questions \(first: question q3\)"),
        (["squad", "evaluate", str(tmp_path / "v2.json"), str(preds3), "--na-prob-file", str(preds3)],
         rf"error: {preds3}: question q1: the null odds must be a finite number, got 'x'"),
    ]
    before = sorted(tmp_path.rglob("*"))
    for argv, match in cases:
        assert cli_main(argv) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
        assert re.match(match, lines[0]), (lines[0], match)
        assert captured.out == ""
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
