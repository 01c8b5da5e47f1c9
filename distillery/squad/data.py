"""Read SQuAD (Rajpurkar et al. 2016; v2.0: 2018): the official JSON files, the Hugging Face Hub datasets, and a
by-article split of one file.

Every loader returns `datasets.Dataset`s with the columns of the Hub `squad` / `squad_v2` datasets:

    id, title, context, question, answers = {"text": [...], "answer_start": [...]}

one row per question, in file order. A v2.0 impossible question has empty answer lists (as `squad_v2` stores it);
`is_impossible` and `plausible_answers` are read (and checked for consistency) but not kept.

The official layout is ``{"version": "1.1" | "v2.0", "data": [{"title", "paragraphs": [{"context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}], "is_impossible" (v2.0), "plausible_answers" (v2.0)}]}]}]}``.
A file is checked whole before anything is returned: invalid UTF-8 or JSON (line and column named), a missing or
mistyped key, a duplicate question id, an empty context, an answer whose `answer_start` does not point at its
`text` in the context, and a v2.0 file read as v1.1 (a question marked impossible or without answers) each raise one
`SquadFileError` naming the file and the question id (or the place in the file when there is no id yet). Contexts
are kept byte for byte (no whitespace stripped: answer offsets count every character).

The version is the `version` argument when given, else the file's own `version` field ("1.1", "v2.0"), else v2.0
when any question has an `is_impossible` key and v1.1 otherwise.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import datasets
import numpy as np
import pyarrow as pa

from distillery.errors import InputNotFoundError, UserError

Version = Literal["1.1", "2.0"]
VERSIONS: tuple[str, ...] = ("1.1", "2.0")

HUB_PATHS: dict[str, str] = {"1.1": "rajpurkar/squad", "2.0": "rajpurkar/squad_v2"}
HUB_SPLITS = ("train", "validation")
COLUMNS = ("id", "title", "context", "question", "answers")

FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "title": datasets.Value("string"),
    "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
})  # as the Hub's squad / squad_v2 declare it: a struct of two lists

LAYOUT = ('{"version": ..., "data": [{"title": ..., "paragraphs": [{"context": ..., "qas": [{"id": ..., '
          '"question": ..., "answers": [{"text": ..., "answer_start": ...}]}]}]}]}')


class SquadFileError(UserError, ValueError):
    """A malformed SQuAD file (or Hub split): the message names the file and the question id (or line and column)."""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[tuple[str, int], ...]  # (text, answer_start); empty for a v2.0 impossible question


@dataclass(frozen=True)
class Paragraph:
    context: str
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Article:
    title: str
    paragraphs: tuple[Paragraph, ...]


@dataclass(frozen=True)
class SquadFile:
    """A checked SQuAD file: its source (path), version and articles in file order."""

    source: str
    version: str
    articles: tuple[Article, ...]

    def dataset(self, articles: Iterable[int] | None = None) -> datasets.Dataset:
        """The questions of all articles (or of the article indices given, in that order) as a Dataset."""
        chosen = self.articles if articles is None else [self.articles[i] for i in articles]
        return to_dataset(chosen)

    def stats(self) -> dict:
        """{"version", "articles", "paragraphs", "questions", "answers", "impossible"} (answers: gold answers in
        all, impossible: v2.0 questions without an answer)."""
        paragraphs = [p for a in self.articles for p in a.paragraphs]
        questions = [q for p in paragraphs for q in p.questions]
        return {"version": self.version, "articles": len(self.articles), "paragraphs": len(paragraphs),
                "questions": len(questions), "answers": sum(len(q.answers) for q in questions),
                "impossible": sum(1 for q in questions if not q.answers)}


def to_dataset(articles: Iterable[Article]) -> datasets.Dataset:
    """Articles -> one row per question with the Hub `squad` columns (through a typed Arrow table)."""
    rows: dict[str, list] = {c: [] for c in COLUMNS}
    for article in articles:
        for paragraph in article.paragraphs:
            for q in paragraph.questions:
                rows["id"].append(q.id)
                rows["title"].append(article.title)
                rows["context"].append(paragraph.context)
                rows["question"].append(q.question)
                rows["answers"].append({"text": [t for t, _ in q.answers],
                                        "answer_start": [s for _, s in q.answers]})
    schema = FEATURES.arrow_schema
    table = pa.table({name: pa.array(rows[name], type=schema.field(name).type) for name in COLUMNS}, schema=schema)
    return datasets.Dataset(table)


# ----------------------------------------------------------------------------------------------------------------
# reading and checking


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise InputNotFoundError(f"SQuAD file {path} not found")
    if not path.is_file():
        raise SquadFileError(f"{path}: not a file; give the path of a SQuAD JSON file (e.g. dev-v1.1.json)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SquadFileError(f"{path}:{line}: byte 0x{data[exc.start]:02x} is not UTF-8; a SQuAD file is UTF-8 "
                             "JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SquadFileError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None


def normalize_version(value: Any) -> str | None:
    """"1.1" / "v1.1" -> "1.1", "2.0" / "v2.0" -> "2.0"; anything else None."""
    text = str(value).strip().lower().removeprefix("v")
    return text if text in VERSIONS else None


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise SquadFileError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise SquadFileError(f"{where}: missing key {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON true/false are Python bools, which are ints: an answer_start of `true` is not a number
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise SquadFileError(f"{where}: {key!r} must be a {names}, got {type(value).__name__}")
    return value


def check_question(source: str, qid: str, context: str, answers: Sequence[tuple[str, int]], version: str,
                   is_impossible: bool | None = None) -> None:
    """The per-question rules shared by files and Hub splits: a non-empty context, every answer at its offset, an
    answer for every v1.1 question, and (v2.0) `is_impossible` agreeing with the answers."""
    where = f"{source}: question {qid}"
    if not context.strip():
        raise SquadFileError(f"{where}: empty context; every question needs the paragraph it is asked about")
    if version == "1.1" and (is_impossible or not answers):
        why = "is marked is_impossible" if is_impossible else "has no answer"
        raise SquadFileError(f"{where}: {why}, which only SQuAD v2.0 allows; this looks like a v2.0 file read as "
                             "v1.1: read it as version 2.0")
    if version == "2.0" and is_impossible is not None and bool(is_impossible) == bool(answers):
        why = "is_impossible is true but it has answers" if is_impossible else \
            "is_impossible is false but it has no answer"
        raise SquadFileError(f"{where}: {why}")
    for n, (text, start) in enumerate(answers, 1):
        if not text:
            raise SquadFileError(f"{where}: answer {n} has an empty text")
        if start < 0 or context[start:start + len(text)] != text:
            found = context[max(start, 0):max(start, 0) + len(text)]
            raise SquadFileError(f"{where}: answer {n} {text!r} is not at its answer_start {start} in the context "
                                 f"(the context has {found!r} there)")


def _parse_question(source: str, qa: Any, where: str, context: str, version: str) -> Question:
    qid = _need(qa, "id", str, where)
    qwhere = f"{source}: question {qid}"
    question = _need(qa, "question", str, qwhere)
    answers_raw = _need(qa, "answers", list, qwhere)
    answers = []
    for n, ans in enumerate(answers_raw, 1):
        text = _need(ans, "text", str, f"{qwhere}: answer {n}")
        start = _need(ans, "answer_start", int, f"{qwhere}: answer {n}")
        answers.append((text, start))
    is_impossible = None
    if "is_impossible" in qa:
        is_impossible = _need(qa, "is_impossible", bool, qwhere)
    check_question(source, qid, context, answers, version, is_impossible)
    return Question(qid, question, tuple(answers))


def parse_squad(obj: Any, source: str, version: str | None = None) -> SquadFile:
    """Check a parsed SQuAD JSON object (see the module docstring) and return its articles."""
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise SquadFileError(f"{source}: no top-level 'data' list; the official SQuAD layout is {LAYOUT}")
    data = obj["data"]
    if version is not None:
        if normalize_version(version) is None:
            raise ValueError(f"version must be one of {list(VERSIONS)}, got {version!r}")
        version = normalize_version(version)
    else:
        version = normalize_version(obj.get("version"))
        if version is None:
            impossible = any(isinstance(qa, dict) and "is_impossible" in qa
                             for a in data if isinstance(a, dict) for p in a.get("paragraphs") or ()
                             if isinstance(p, dict) for qa in p.get("qas") or ())
            version = "2.0" if impossible else "1.1"
    articles, seen = [], {}
    for i, art in enumerate(data):
        awhere = f"{source}: data[{i}]"
        title = _need(art, "title", str, awhere)
        paragraphs = []
        for j, par in enumerate(_need(art, "paragraphs", list, awhere)):
            pwhere = f"{awhere}.paragraphs[{j}]"
            context = _need(par, "context", str, pwhere)
            questions = []
            for k, qa in enumerate(_need(par, "qas", list, pwhere)):
                q = _parse_question(source, qa, f"{pwhere}.qas[{k}]", context, version)
                if q.id in seen:
                    raise SquadFileError(f"{source}: question {q.id}: duplicate question id (also at {seen[q.id]}); "
                                         "ids key the predictions, so each must be unique")
                seen[q.id] = f"data[{i}].paragraphs[{j}].qas[{k}]"
                questions.append(q)
            paragraphs.append(Paragraph(context, tuple(questions)))
        articles.append(Article(title, tuple(paragraphs)))
    if not seen:
        raise SquadFileError(f"{source}: no questions; the official SQuAD layout is {LAYOUT}")
    return SquadFile(source, version, tuple(articles))


def read_squad(path: str | os.PathLike, version: str | None = None) -> SquadFile:
    """Read and check an official SQuAD JSON file (v1.1 or v2.0; see the module docstring)."""
    path = Path(path)
    return parse_squad(_read_json(path), str(path), version)


def load_squad_file(path: str | os.PathLike, version: str | None = None) -> datasets.Dataset:
    """An official SQuAD JSON file as a Dataset with the Hub `squad` columns."""
    return read_squad(path, version).dataset()


def squad_stats(path: str | os.PathLike, version: str | None = None) -> dict:
    """Counts of a SQuAD file: {"version", "articles", "paragraphs", "questions", "answers", "impossible"}."""
    return read_squad(path, version).stats()


# ----------------------------------------------------------------------------------------------------------------
# a split of one file by article


def article_groups(squad: SquadFile) -> list[list[int]]:
    """Article indices grouped so that articles sharing a title or a context are in one group (a split by group
    never puts a paragraph on both sides); groups in file order of their first article."""
    parent = list(range(len(squad.articles)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, article in enumerate(squad.articles):
        for key in [("title", article.title)] + [("context", p.context) for p in article.paragraphs]:
            j = first.setdefault(key, i)
            parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(squad.articles)):
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def split_by_article(squad: SquadFile, eval_articles: int, seed: int | None = None) -> tuple[list[int], list[int]]:
    """(train, eval) article indices: the last `eval_articles` articles of the file go to eval (seed=None), or the
    articles at the end of a permutation of the file's article groups seeded by `seed`. Articles that share a title
    or a context stay together (`article_groups`), so eval can get a few more than asked; both sides keep file
    order. The same file, count and seed give the same split."""
    if eval_articles < 1:
        raise ValueError(f"eval_articles must be >= 1, got {eval_articles}")
    groups = sorted(article_groups(squad), key=lambda g: g[-1])  # the group of the file's last article last
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(groups))
        groups = [groups[i] for i in order]
    held: list[int] = []
    while groups and len(held) < eval_articles:
        held.extend(groups.pop())
    train = sorted(i for g in groups for i in g)
    if not train:
        raise SquadFileError(f"{squad.source}: {len(squad.articles)} articles cannot give {eval_articles} to "
                             "evaluation and keep some for training; ask for fewer evaluation articles")
    return train, sorted(held)


def load_squad_split(path: str | os.PathLike, eval_articles: int, seed: int | None = None,
                     version: str | None = None) -> datasets.DatasetDict:
    """One SQuAD file split by article (`split_by_article`): {"train": ..., "validation": ...}; e.g. the CPU
    preset's 40 training and 8 evaluation articles of dev-v1.1.json with eval_articles=8."""
    squad = read_squad(path, version)
    train, held = split_by_article(squad, eval_articles, seed)
    return datasets.DatasetDict({"train": squad.dataset(train), "validation": squad.dataset(held)})


# ----------------------------------------------------------------------------------------------------------------
# the Hugging Face Hub


def load_hub(version: str = "1.1", splits: Iterable[str] | None = None, cache_dir: str | os.PathLike | None = None,
             path: str | None = None) -> datasets.DatasetDict:
    """The Hub dataset `squad` (version "1.1") or `squad_v2` ("2.0"), splits "train" and "validation", checked
    with the file rules (`check_question`) and cast to `FEATURES`. `path` overrides the Hub id (a mirror)."""
    v = normalize_version(version)
    if v is None:
        raise ValueError(f"version must be one of {list(VERSIONS)}, got {version!r}")
    path = path or HUB_PATHS[v]
    wanted = list(HUB_SPLITS) if splits is None else list(splits)
    for split in wanted:
        if split not in HUB_SPLITS:
            raise ValueError(f"SQuAD: unknown split {split!r}; splits: {list(HUB_SPLITS)}")
    from distillery.io import hub_dataset

    raw = datasets.load_dataset(hub_dataset(path), cache_dir=None if cache_dir is None else str(cache_dir))
    out = {}
    for split in wanted:
        if split not in raw:
            raise KeyError(f"Hub dataset {path} has no split {split!r} (has {list(raw)})")
        out[split] = _from_hub_split(raw[split], f"{path}[{split}]", v)
    return datasets.DatasetDict(out)


def _from_hub_split(ds: datasets.Dataset, source: str, version: str) -> datasets.Dataset:
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise KeyError(f"{source}: missing columns {missing} (has {ds.column_names})")
    ds = ds.select_columns(list(COLUMNS))
    seen: set[str] = set()
    for qid, context, answers in zip(ds["id"][:], ds["context"][:], ds["answers"][:]):
        if qid in seen:
            raise SquadFileError(f"{source}: question {qid}: duplicate question id")
        seen.add(qid)
        pairs = list(zip(answers["text"], answers["answer_start"]))
        if len(pairs) != len(answers["text"]) or len(pairs) != len(answers["answer_start"]):
            raise SquadFileError(f"{source}: question {qid}: answers text and answer_start differ in length")
        check_question(source, qid, context, pairs, version)
    return ds if ds.features == FEATURES else ds.cast(FEATURES)


def gold_answers(ds: datasets.Dataset) -> dict[str, list[str]]:
    """{question id: gold answer texts} of a Dataset with the Hub `squad` columns (empty: a v2.0 impossible
    question), in row order."""
    return {qid: list(a["text"]) for qid, a in zip(ds["id"][:], ds["answers"][:])}
