"""SQuAD data: official JSON files (v1.1, v2.0) the tests write, the Hub loader (mocked), every bad input, the
by-article split, features; and the real dev-v1.1.json when ../shared/data has it."""

import copy
import json
from pathlib import Path

import datasets
import pytest

from distillery.errors import InputNotFoundError
from distillery.squad import (
    FEATURES, FeatureConfig, SquadFileError, article_groups, eval_features, load_hub, load_squad_file,
    load_squad_split, prepare_eval_features, prepare_train_features, read_squad, split_by_article, squad_stats,
    train_features,
)

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
DEV = SHARED / "squad" / "dev-v1.1.json"
VOCAB = SHARED / "vocab" / "bert-base-uncased-vocab.txt"
COLUMNS = ["id", "title", "context", "question", "answers"]

CATS = "The cat sat on the mat. It was a sunny day in Paris, and the cat slept."
DOGS = "  Dogs bark at the mailman. The mailman, Mr. Brown, runs away."  # leading spaces are part of the context


def _answer(context: str, text: str, nth: int = 0) -> dict:
    start = -1
    for _ in range(nth + 1):
        start = context.index(text, start + 1)
    return {"text": text, "answer_start": start}


def v1_doc() -> dict:
    return {"version": "1.1", "data": [
        {"title": "Cats", "paragraphs": [{"context": CATS, "qas": [
            {"id": "c1", "question": "Where did the cat sit?",
             "answers": [_answer(CATS, "on the mat"), _answer(CATS, "the mat")]},
            {"id": "c2", "question": "  Where was it sunny?", "answers": [_answer(CATS, "Paris")]},
        ]}]},
        {"title": "Dogs", "paragraphs": [{"context": DOGS, "qas": [
            {"id": "d1", "question": "Who runs away?", "answers": [_answer(DOGS, "Mr. Brown")]},
        ]}]},
    ]}


def v2_doc() -> dict:
    doc = v1_doc()
    doc["version"] = "v2.0"
    for article in doc["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["is_impossible"] = False
    doc["data"][1]["paragraphs"][0]["qas"].append(
        {"id": "d2", "question": "Who bites the mailman?", "answers": [], "is_impossible": True,
         "plausible_answers": [_answer(DOGS, "Dogs")]})
    return doc


def _write(path: Path, doc) -> Path:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def test_v11_file_has_the_hub_squad_columns(tmp_path):
    ds = load_squad_file(_write(tmp_path / "v1.json", v1_doc()))
    assert ds.column_names == COLUMNS and ds.features == FEATURES
    assert ds["id"][:] == ["c1", "c2", "d1"]
    assert ds["title"][:] == ["Cats", "Cats", "Dogs"]
    assert ds["context"][2] == DOGS  # leading whitespace kept: the offsets count it
    assert ds["question"][1] == "  Where was it sunny?"
    assert ds["answers"][0] == {"text": ["on the mat", "the mat"], "answer_start": [12, 15]}
    assert ds["answers"][2] == {"text": ["Mr. Brown"], "answer_start": [41]}
    assert read_squad(tmp_path / "v1.json").version == "1.1"


def test_v20_file_impossible_questions_have_empty_answers(tmp_path):
    path = _write(tmp_path / "v2.json", v2_doc())
    squad = read_squad(path)
    assert squad.version == "2.0"
    ds = squad.dataset()
    assert ds.column_names == COLUMNS  # no is_impossible, no plausible_answers: the squad_v2 layout
    assert ds["id"][:] == ["c1", "c2", "d1", "d2"]
    assert ds["answers"][3] == {"text": [], "answer_start": []}
    assert squad_stats(path) == {"version": "2.0", "articles": 2, "paragraphs": 2, "questions": 4, "answers": 4,
                                 "impossible": 1}
    # the version field missing: an is_impossible key makes it v2.0; a file without one is v1.1
    doc = v2_doc()
    del doc["version"]
    assert read_squad(_write(tmp_path / "noversion.json", doc)).version == "2.0"
    doc = v1_doc()
    del doc["version"]
    assert read_squad(_write(tmp_path / "noversion1.json", doc)).version == "1.1"
    # a v1.1 file read as v2.0 is fine (every question answerable)
    assert read_squad(tmp_path / "noversion1.json", version="2.0").version == "2.0"


def _set(doc: dict, where: tuple, value=None, *, delete: bool = False) -> dict:
    doc = copy.deepcopy(doc)
    target = doc
    for key in where[:-1]:
        target = target[key]
    if delete:
        del target[where[-1]]
    else:
        target[where[-1]] = value
    return doc


QA = ("data", 0, "paragraphs", 0, "qas")


@pytest.mark.parametrize("doc,version,match", [
    (_set(v1_doc(), ("data",), delete=True), None, r"no top-level 'data' list"),
    (_set(v1_doc(), ("data", 0, "title"), delete=True), None, r"data\[0\]: missing key 'title'"),
    (_set(v1_doc(), ("data", 0, "paragraphs", 0, "context"), delete=True), None,
     r"data\[0\]\.paragraphs\[0\]: missing key 'context'"),
    (_set(v1_doc(), QA + (0, "id"), delete=True), None, r"data\[0\]\.paragraphs\[0\]\.qas\[0\]: missing key 'id'"),
    (_set(v1_doc(), QA + (1, "answers"), delete=True), None, r"question c2: missing key 'answers'"),
    (_set(v1_doc(), QA + (1, "question"), delete=True), None, r"question c2: missing key 'question'"),
    (_set(v1_doc(), QA + (1, "answers", 0, "answer_start"), delete=True), None,
     r"question c2: answer 1: missing key 'answer_start'"),
    (_set(v1_doc(), QA + (1, "answers", 0, "answer_start"), "7"), None,
     r"question c2: answer 1: 'answer_start' must be a int, got str"),
    (_set(v1_doc(), QA + (0, "answers", 1, "answer_start"), 16), None,
     r"question c1: answer 2 'the mat' is not at its answer_start 16 in the context "
     r"\(the context has 'he mat\.' there\)$"),
    (_set(v1_doc(), QA + (0, "answers", 0, "answer_start"), len(CATS) - 2), None,
     r"question c1: answer 1 'on the mat' is not at its answer_start"),
    (_set(v1_doc(), ("data", 0, "paragraphs", 0, "context"), " \n "), None, r"question c1: empty context"),
    (_set(v1_doc(), QA + (1, "answers"), []), None, r"question c2: has no answer, which only SQuAD v2\.0 allows"),
    (v2_doc(), "1.1", r"question d2: is marked is_impossible, which only SQuAD v2\.0 allows; this looks like a v2\.0 "
                      r"file read as v1\.1"),
    (_set(v2_doc(), ("version",), "1.1"), None, r"question d2: is marked is_impossible"),
    (_set(v2_doc(), QA + (1, "is_impossible"), True), None, r"question c2: is_impossible is true but it has answers"),
    (_set(v2_doc(), QA + (1, "answers"), []), None, r"question c2: is_impossible is false but it has no answer"),
    (_set(v1_doc(), ("data", 1, "paragraphs", 0, "qas", 0, "id"), "c1"), None,
     r"question c1: duplicate question id \(also at data\[0\]\.paragraphs\[0\]\.qas\[0\]\)"),
    (_set(v1_doc(), ("data",), []), None, r"no questions"),
])
def test_bad_file_one_error_naming_file_and_question(tmp_path, doc, version, match):
    path = _write(tmp_path / "bad.json", doc)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SquadFileError, match=match) as err:
        load_squad_file(path, version)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_malformed_json_names_line_and_column(tmp_path):
    text = '{"version": "1.1",\n "data": [\n   {"title": "x" "paragraphs": []}\n ]}\n'
    path = _write(tmp_path / "broken.json", text)
    with pytest.raises(SquadFileError, match=rf"^{path}:3:18: not valid JSON: Expecting ',' delimiter$"):
        read_squad(path)
    path.write_bytes(b'{"version": "1.1",\n "data": ["\xff"]}')
    with pytest.raises(SquadFileError, match=rf"^{path}:2: byte 0xff is not UTF-8"):
        read_squad(path)
    with pytest.raises(SquadFileError, match="not a file"):
        read_squad(tmp_path)
    with pytest.raises(InputNotFoundError, match="nope.json not found") as err:
        read_squad(tmp_path / "nope.json")
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(ValueError, match="version must be one of"):
        read_squad(_write(tmp_path / "ok.json", v1_doc()), version="3")


# --------------------------------------------------------------------------------------------------------------
# the Hub


def _hub_split(rows: list[tuple[str, str, str, str, list[str], list[int]]]) -> datasets.Dataset:
    """The Hub `squad` / `squad_v2` layout: answers a Sequence of {text, answer_start int32}."""
    feats = datasets.Features({"id": datasets.Value("string"), "title": datasets.Value("string"),
                               "context": datasets.Value("string"), "question": datasets.Value("string"),
                               "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                             "answer_start": datasets.Value("int32")})})
    return datasets.Dataset.from_dict({
        "id": [r[0] for r in rows], "title": [r[1] for r in rows], "context": [r[2] for r in rows],
        "question": [r[3] for r in rows], "answers": [{"text": r[4], "answer_start": r[5]} for r in rows]},
        features=feats)


def test_load_hub_squad_and_squad_v2(monkeypatch):
    calls = []
    train = [("h1", "Cats", CATS, "Where?", ["on the mat"], [12])]
    dev = [("h2", "Cats", CATS, "Where?", ["Paris", "Paris"], [CATS.index("Paris")] * 2)]
    impossible = [("h3", "Dogs", DOGS, "Who bites?", [], [])]

    def fake_load_dataset(path, cache_dir=None):
        calls.append((path, cache_dir))
        extra = impossible if path.endswith("_v2") else []
        return datasets.DatasetDict({"train": _hub_split(train), "validation": _hub_split(dev + extra)})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    v1 = load_hub("1.1", cache_dir="/tmp/c")
    assert calls == [("rajpurkar/squad", "/tmp/c")]
    assert list(v1) == ["train", "validation"]
    assert v1["train"].column_names == COLUMNS and v1["train"].features == FEATURES
    assert v1["validation"]["answers"][0] == {"text": ["Paris", "Paris"], "answer_start": [46, 46]}
    v2 = load_hub("2.0", splits=["validation"])
    assert calls[-1] == ("rajpurkar/squad_v2", None) and list(v2) == ["validation"]
    assert v2["validation"]["answers"][1] == {"text": [], "answer_start": []}
    assert load_hub("v1.1", path="mirror/squad", splits=["train"])["train"]["id"][:] == ["h1"]
    assert calls[-1] == ("mirror/squad", None)
    # the file rules apply to the Hub rows too
    with pytest.raises(SquadFileError, match=r"^mirror/squad_v2\[validation\]: question h3: has no answer, which only "
                                             r"SQuAD v2\.0 allows"):
        load_hub("1.1", path="mirror/squad_v2")
    train[0] = ("h1", "Cats", CATS, "Where?", ["on the mat"], [13])
    with pytest.raises(SquadFileError, match=r"^rajpurkar/squad\[train\]: question h1: answer 1 'on the mat' is not"):
        load_hub("1.1")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_hub("1.1", splits=["test"])
    with pytest.raises(ValueError, match="version must be one of"):
        load_hub("3.0")
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda path, cache_dir=None: datasets.DatasetDict({"train": _hub_split(dev)}))
    with pytest.raises(KeyError, match="has no split 'validation'"):
        load_hub("1.1")


# --------------------------------------------------------------------------------------------------------------
# the split by article


def _articles_doc(titles: list[str], contexts: list[str] | None = None) -> dict:
    contexts = contexts or [f"Article {t} is about {t}." for t in titles]
    return {"version": "1.1", "data": [
        {"title": t, "paragraphs": [{"context": c, "qas": [
            {"id": f"q{i}", "question": f"What is {t} about?", "answers": [_answer(c, "about")]}]}]}
        for i, (t, c) in enumerate(zip(titles, contexts))]}


def test_split_by_article_last_articles_or_seeded(tmp_path):
    path = _write(tmp_path / "s.json", _articles_doc(["A", "B", "C", "D", "E", "F"]))
    squad = read_squad(path)
    assert split_by_article(squad, 2) == ([0, 1, 2, 3], [4, 5])
    seeded = split_by_article(squad, 2, seed=3)
    assert seeded == split_by_article(read_squad(path), 2, seed=3)  # the same file, count, seed: the same split
    assert sorted(seeded[0] + seeded[1]) == list(range(6)) and len(seeded[1]) == 2
    assert {tuple(split_by_article(squad, 2, seed=s)[1]) for s in range(10)} != {(4, 5)}  # the seed matters
    dd = load_squad_split(path, 2)
    assert list(dd) == ["train", "validation"]
    assert dd["train"]["title"][:] == ["A", "B", "C", "D"] and dd["validation"]["title"][:] == ["E", "F"]
    with pytest.raises(SquadFileError, match="cannot give 6 to evaluation"):
        split_by_article(squad, 6)
    with pytest.raises(ValueError, match="eval_articles must be >= 1"):
        split_by_article(squad, 0)


def test_split_keeps_a_title_or_a_context_on_one_side(tmp_path):
    # articles 1 and 4 share a title, 2 and 5 a context: each pair stays together
    contexts = ["Alpha about a.", "Beta about b.", "Gamma about g.", "Delta about d.", "Epsilon about e.",
                "Gamma about g."]
    squad = read_squad(_write(tmp_path / "g.json", _articles_doc(["A", "B", "C", "D", "B", "F"], contexts)))
    assert article_groups(squad) == [[0], [1, 4], [2, 5], [3]]
    train, held = split_by_article(squad, 1)
    assert (train, held) == ([0, 1, 3, 4], [2, 5])  # the last group holds two articles
    for seed in range(5):
        train, held = split_by_article(squad, 2, seed=seed)
        titles = lambda idx: {squad.articles[i].title for i in idx}  # noqa: E731
        ctx = lambda idx: {p.context for i in idx for p in squad.articles[i].paragraphs}  # noqa: E731
        assert not titles(train) & titles(held) and not ctx(train) & ctx(held)


# --------------------------------------------------------------------------------------------------------------
# features


@pytest.fixture(scope="module")
def tokenizer():
    if not VOCAB.is_file():
        pytest.skip("shared vocabulary not present")
    import transformers

    return transformers.BertTokenizerFast(vocab=str(VOCAB), do_lower_case=True)


def _decoded(context: str, offsets, start: int, end: int) -> str:
    return context[offsets[start][0]:offsets[end][1]]


def test_features_on_small_files(tmp_path, tokenizer):
    ds = read_squad(_write(tmp_path / "v2.json", v2_doc())).dataset()
    tf = prepare_train_features(ds, tokenizer)
    assert tf.column_names == ["input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions",
                               "length"]
    assert len(tf) == 4  # short contexts: one window each
    assert tf["length"][:] == [len(ids) for ids in tf["input_ids"][:]] and max(tf["length"][:]) < 40  # no padding
    enc = tokenizer(ds["question"][0], ds["context"][0], return_offsets_mapping=True)
    assert tf["input_ids"][0] == enc["input_ids"]
    s, e = tf["start_positions"][0], tf["end_positions"][0]
    assert _decoded(CATS, enc["offset_mapping"], s, e) == "on the mat"  # the first gold answer
    s, e = tf["start_positions"][2], tf["end_positions"][2]
    assert _decoded(DOGS, tokenizer(ds["question"][2], DOGS, return_offsets_mapping=True)["offset_mapping"], s, e) \
        == "Mr. Brown"
    assert (tf["start_positions"][3], tf["end_positions"][3]) == (0, 0)  # impossible: CLS
    ef = prepare_eval_features(ds, tokenizer)
    assert ef.column_names == ["input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions",
                               "example_id", "offset_mapping", "length"]  # gold answers given: the Trainer's labels
    assert ef["start_positions"][:] == tf["start_positions"][:] and ef["end_positions"][:] == tf["end_positions"][:]
    assert ef["example_id"][:] == ["c1", "c2", "d1", "d2"]
    offsets = ef["offset_mapping"][1]
    types = ef["token_type_ids"][1]
    assert offsets[0] is None and offsets[-1] is None  # CLS, final SEP
    assert all((o is None) == (t == 0 or k == len(offsets) - 1) for k, (o, t) in enumerate(zip(offsets, types)))
    # run_qa.py strips the question's leading whitespace
    assert tokenizer.decode(ef["input_ids"][1]).startswith("[CLS] where was it sunny?")


def test_question_cut_to_max_query_length_and_windows(tmp_path, tokenizer):
    words = " ".join(f"word{i % 7} the" for i in range(30))  # ~60 words, many more tokens
    context = " ".join(f"Sentence {i} says nothing." for i in range(60)) + " The answer is Zanzibar."
    doc = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": context, "qas": [
        {"id": "long", "question": words + "?", "answers": [_answer(context, "Zanzibar")]}]}]}]}
    ds = read_squad(_write(tmp_path / "long.json", doc)).dataset()
    assert len(tokenizer(words + "?", add_special_tokens=False)["input_ids"]) > 64
    config = FeatureConfig(max_length=128, doc_stride=32, max_query_length=64)
    batch = {c: ds[c][:] for c in ds.column_names}
    tf = train_features(batch, tokenizer, config)
    ef = eval_features(batch, tokenizer, config)
    n = len(tf["input_ids"])
    assert n > 3 and ef["example_id"] == ["long"] * n
    for i in range(n):
        assert tf["token_type_ids"][i].count(0) == 64 + 2  # [CLS] + 64 question tokens + [SEP]
        assert len(tf["input_ids"][i]) <= 128
    # only the last window holds the answer
    assert [tf["start_positions"][i] > 0 for i in range(n)] == [False] * (n - 1) + [True]
    offsets = ef["offset_mapping"][n - 1]
    assert _decoded(context, offsets, tf["start_positions"][-1], tf["end_positions"][-1]) == "Zanzibar"
    for i in range(n - 1):  # consecutive windows share doc_stride context tokens
        a = [o for o in ef["offset_mapping"][i] if o is not None]
        b = [o for o in ef["offset_mapping"][i + 1] if o is not None]
        assert a[-32:] == b[:32]
    with pytest.raises(ValueError, match="doc_stride 100 must be smaller"):
        FeatureConfig(max_length=128, doc_stride=100)
    with pytest.raises(ValueError, match="fast tokenizer"):
        prepare_train_features(ds, object())


# --------------------------------------------------------------------------------------------------------------
# the real dev file

needs_dev = pytest.mark.skipif(not DEV.is_file(), reason="shared SQuAD dev-v1.1.json not present")


@pytest.fixture(scope="module")
def dev():
    return read_squad(DEV)


@needs_dev
def test_real_dev_counts(dev):
    assert dev.version == "1.1"
    assert dev.stats() == {"version": "1.1", "articles": 48, "paragraphs": 2067, "questions": 10570,
                           "answers": 34726, "impossible": 0}
    ds = dev.dataset()
    assert len(ds) == 10570 and ds.column_names == COLUMNS
    assert ds["id"][0] == "56be4db0acb8001400a502ec" and ds["title"][0] == "Super_Bowl_50"


@needs_dev
def test_real_dev_split_40_8(dev):
    train, held = split_by_article(dev, 8)
    assert (len(train), len(held)) == (40, 8) and split_by_article(read_squad(DEV), 8) == (train, held)
    dd = load_squad_split(DEV, 8)
    again = load_squad_split(DEV, 8)
    assert dd["train"]["id"][:] == again["train"]["id"][:] and dd["validation"]["id"][:] == again["validation"]["id"][:]
    assert len(dd["train"]) + len(dd["validation"]) == 10570
    assert not set(dd["train"]["title"][:]) & set(dd["validation"]["title"][:])
    assert not set(dd["train"]["context"][:]) & set(dd["validation"]["context"][:])
    seeded = load_squad_split(DEV, 8, seed=0)
    assert seeded["validation"]["id"][:] == load_squad_split(DEV, 8, seed=0)["validation"]["id"][:]
    assert len(set(seeded["validation"]["title"][:])) == 8
    assert not set(seeded["train"]["context"][:]) & set(seeded["validation"]["context"][:])


@needs_dev
def test_real_dev_features_decode_to_the_gold_answer(dev, tokenizer):
    ds = dev.dataset()
    lengths = [len(c) for c in ds["context"][:]]
    longest = sorted(range(len(ds)), key=lambda i: -lengths[i])[:12]  # contexts of several windows
    picked = ds.select(sorted(set(range(0, len(ds), 250)) | set(longest)))  # 43 + 12 questions
    tf = prepare_train_features(picked, tokenizer)
    ef = prepare_eval_features(picked, tokenizer)
    assert tf["input_ids"][:] == ef["input_ids"][:]  # the same windows
    contexts = dict(zip(picked["id"][:], picked["context"][:]))
    golds = dict(zip(picked["id"][:], picked["answers"][:]))
    inside = set()
    windows: dict[str, list[int]] = {}
    for i, (qid, offsets, s, e) in enumerate(zip(ef["example_id"][:], ef["offset_mapping"][:],
                                                 tf["start_positions"][:], tf["end_positions"][:])):
        windows.setdefault(qid, []).append(i)
        assert len(offsets) <= 384
        if s == 0:
            assert e == 0
            continue
        inside.add(qid)
        assert _decoded(contexts[qid], offsets, s, e) == golds[qid]["text"][0], qid
    assert len(inside) == len(picked)  # every answer is wholly inside at least one window
    several = [qid for qid, w in windows.items() if len(w) > 1]
    assert len(several) >= 5
    for qid in several:  # stride overlap: each window starts with the previous one's last 128 context tokens
        for a, b in zip(windows[qid], windows[qid][1:]):
            ctx_a = [o for o in ef["offset_mapping"][a] if o is not None]
            ctx_b = [o for o in ef["offset_mapping"][b] if o is not None]
            assert ctx_a[-128:] == ctx_b[:128]
