"""Data stages: prepare a task, prepare the general corpus, word vectors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tasks import paths
from tasks.stage import Stage

from distillery.config import Params
from distillery.errors import InputNotFoundError
from distillery.io import atomic_dir, write_json


def _subset(ds, n: int | None, seed: int):
    return ds if n is None or len(ds) <= n else ds.shuffle(seed=seed).select(range(n))


def _unlabeled(p: Params, task: str, train):
    """The task's unlabelled rows (`distillery.unlabeled`): the rest of its training split, or a file's texts."""
    from distillery import unlabeled

    d = p.data  # the task's own (a stage's params are `Params.for_task`'s)
    if d.unlabeled == "rest":
        return unlabeled.rest_rows(train, task, d.max_train_examples, p.seed, d.max_unlabeled_examples,
                                   f"data.unlabeled (task {task})")
    return unlabeled.read_file(resolve(d.unlabeled), task, d.custom.get(task), d.max_unlabeled_examples)


def run_prepare_task(p: Params, task: str) -> dict[str, Any]:
    from distillery import unlabeled
    from distillery.task_kinds import task_kind

    dsd = task_kind(task, p.data).load(p.data, paths.ROOT, paths.raw_task(task), p.seed)
    if "train" in dsd:
        if p.data.unlabeled is not None:
            dsd[unlabeled.SPLIT] = _unlabeled(p, task, dsd["train"])
        dsd["train"] = _subset(dsd["train"], p.data.max_train_examples, p.seed)
    # test stays whole: the GLUE server wants every row
    for split in [s for s in dsd if s not in ("train", unlabeled.SPLIT) and not s.endswith("test")]:
        dsd[split] = _subset(dsd[split], p.data.max_eval_examples, p.seed)
    save_task(p, task, dsd)
    return {split: len(ds) for split, ds in dsd.items()}


def save_task(p: Params, task: str, dsd) -> None:
    """The prepared task: its splits (`paths.task_data`) and beside them its trivial baseline's dev metrics
    (`paths.trivial`), which the teacher gate and the evaluation read instead of computing them in every stage."""
    from distillery.task_kinds import task_kind

    with atomic_dir(paths.task_data(task)) as tmp:
        dsd.save_to_disk(str(tmp))
        write_json(tmp / paths.trivial(task).name, task_kind(task, p.data).trivial(dsd))


def run_prepare_corpus(p: Params, _: str | None) -> dict[str, Any]:
    from distillery import corpus, demo

    if p.corpus.source == "demo":
        demo.make_demo_corpus(paths.raw_corpus(), n_documents=p.corpus.demo_documents, seed=p.seed,
                              contrast=p.data.demo_contrast)  # the demo task's language
        sources = [paths.raw_corpus()]
    else:
        sources = _corpus_files(p)
    return corpus.prepare_corpus(sources, paths.corpus(), max_sentences=p.corpus.max_sentences)


def _local_task_dir(p: Params, task: str) -> Path:
    from distillery import glue

    return glue.task_dir(task, resolve(p.data.glue_dir))


def _corpus_files(p: Params) -> list[Path]:
    files: list[Path] = []
    for entry in p.corpus.paths:
        path = Path(os.path.expanduser(entry))
        if not path.is_absolute():
            path = paths.ROOT / path
        if path.is_dir():
            files += sorted(f for f in path.rglob("*.txt") if "LICENSE" not in f.name)
        elif path.is_file():
            files.append(path)
        else:
            raise InputNotFoundError(f"params: corpus.paths: {entry} not found ({path})")
    return files


def run_word_vectors(p: Params, _: str | None) -> dict[str, Any]:
    """Learn vectors from the corpus, or take a GloVe/word2vec file; either way build the binary cache
    that augmentation reloads (so augmentation never writes into this stage's output)."""
    from distillery import corpus
    from distillery.augment import load_word_vectors

    if p.word_vectors.source == "corpus":
        corpus.learn_word_vectors(paths.corpus(), paths.word_vectors(), dim=p.word_vectors.dim)
    source = vectors_path(p)
    vectors = load_word_vectors(source, max_words=p.word_vectors.max_words, cache_dir=paths.word_vectors_dir() / "cache")
    info = {"source": str(source), "words": len(vectors), "dim": vectors.dim}
    write_json(paths.word_vectors_dir() / "vectors.json", info)
    return {"metrics": {"words": len(vectors), "dim": vectors.dim}}


def resolve(path: str | None) -> Path:
    """A params path: absolute, ~-expanded, or relative to the project root."""
    if path is None:
        raise ValueError("a path is required here")
    from distillery.io import resolve_path

    return resolve_path(path, paths.ROOT)


def vectors_path(p: Params) -> Path:
    return paths.word_vectors() if p.word_vectors.source == "corpus" else resolve(p.word_vectors.path)


def _task_inputs(p: Params, task: str) -> list[Path]:
    """The files a task is prepared from (a changed file is a changed input): for a Hub dataset, the local snapshot of
    the revision this run reads (`distillery.io.hub_dataset`: a new revision is a changed input); none for the demo
    (or a Hub dataset neither cached nor reachable: the stage's load says why)."""
    from distillery.io import hub_dataset
    from distillery.task_kinds import task_kind

    if (hub := task_kind(task, p.data).hub_dataset_id(p.data)) is not None:
        local = Path(hub_dataset(hub))
        return [local] if local.is_dir() else []
    extra = [resolve(p.data.unlabeled)] if p.data.unlabeled not in (None, "rest") else []
    if task in p.data.custom:
        from distillery import custom_tasks

        return custom_tasks.inputs(p.data.custom[task], paths.ROOT) + extra
    if p.data.source != "local":
        return extra
    return [resolve(p.data.squad_file) if task == "squad" else _local_task_dir(p, task)] + extra


PREPARE_TASK = Stage(
    "prepare_task", run_prepare_task,
    deps=_task_inputs,
    outs=lambda p, t: [paths.task_data(t)],
    params=lambda p, t: {"seed": p.seed, "data": p.data.model_dump(mode="json")},
    code=("distillery/glue", "distillery/squad/data.py", "distillery/squad/metrics.py", "distillery/demo.py",
          "distillery/custom_tasks.py", "distillery/task_kinds.py", "distillery/unlabeled.py", "tasks/data.py"),
)
PREPARE_CORPUS = Stage(
    "prepare_corpus", run_prepare_corpus,
    deps=lambda p, _: _corpus_files(p) if p.corpus.source == "files" else [],
    outs=lambda p, _: [paths.corpus()],
    params=lambda p, _: {"seed": p.seed, "corpus": p.corpus.model_dump(mode="json"),
                         **({"demo_contrast": p.data.demo_contrast} if p.corpus.source == "demo" else {})},
    code=("distillery/corpus.py", "distillery/demo.py", "tasks/data.py"),
)
WORD_VECTORS = Stage(
    "word_vectors", run_word_vectors,
    deps=lambda p, _: [paths.corpus()] if p.word_vectors.source == "corpus" else [resolve(p.word_vectors.path)],
    outs=lambda p, _: [paths.word_vectors_dir()],
    params=lambda p, _: {"word_vectors": p.word_vectors.model_dump(mode="json")},
    code=("distillery/corpus.py", "distillery/augment/glove.py", "tasks/data.py"),
)
