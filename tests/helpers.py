"""Helpers shared by the tests; every test file imports them the same way, `from helpers import ...` (pytest puts
tests/ on sys.path). Fixtures live in tests/conftest.py. No test file imports from another test file.

- Training: a tiny WordPiece vocabulary, a learnable generated task, tiny BERTs, quiet Trainer arguments.
- Pipeline projects: the micro params (MICRO: one student per recipe, the end-to-end project; ONE_STUDENT: the
  TinyBERT student alone at the smallest sizes, for the tests of caching, scheduling, orchestration, DVC, Dask, the
  deployment worker and bad input; RESUME: ONE_STUDENT with resume points), a project directory holding copies of the
  pipeline files, the environment and runner of a pipeline command, the console's stage lines, and `scratch`: change
  a shared project and get it back as it was.
- Servers: a long-running command in its own process group (`Server`, on a `free_port`, in a `clean_env`), and the
  Prefect server this test process's pipeline commands report to (`prefect_server`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------ training

WORDS = [
    "the", "a", "cat", "dog", "house", "tree", "car", "sky", "river", "city", "book", "table", "chair",
    "runs", "sits", "sees", "likes", "finds", "takes", "red", "blue", "small", "big", "old", "new",
    "on", "in", "under", "near", "with", "good", "great", "bad", "awful",
]
CUES = {"good": 1, "great": 1, "bad": 0, "awful": 0}
NEUTRAL = [w for w in WORDS if w not in CUES]


def write_vocab(directory: Path) -> Path:
    path = Path(directory) / "vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path.write_text("\n".join(specials + WORDS) + "\n", encoding="utf-8")
    return path


def tokenizer(directory: Path):
    import transformers

    return transformers.BertTokenizerFast(vocab=str(write_vocab(directory)), do_lower_case=True)


def sentences(n: int, seed: int) -> tuple[list[str], list[int]]:
    """Sentiment-like task: the label is the polarity of the single cue word placed among neutral words."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(4, 9))]
        cue = rng.choice(sorted(CUES))
        words.insert(rng.randrange(len(words) + 1), cue)
        texts.append(" ".join(words))
        labels.append(CUES[cue])
    return texts, labels


def encoded(tok, n: int, seed: int, max_length: int = 16):
    import datasets

    texts, labels = sentences(n, seed)
    enc = tok(texts, truncation=True, max_length=max_length, padding="max_length")
    return datasets.Dataset.from_dict({**dict(enc), "labels": labels, "idx": list(range(n))})


def bert_config(vocab_size: int, layers: int, hidden: int = 32, heads: int = 2, inter: int = 64, **kw):
    import transformers

    return transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=64,
        **kw,
    )


def classifier(vocab_size: int, layers: int, seed: int = 0, **kw):
    import torch
    import transformers

    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(bert_config(vocab_size, layers, num_labels=2, **kw))


FAST = dict(disable_tqdm=True, logging_steps=5, save_total_limit=1, dataloader_num_workers=0)


def finetuned_teacher(tok, out: Path):
    """A 4-layer classifier fine-tuned on `encoded` data until it beats chance on dev: (teacher, train, dev)."""
    import transformers

    from distillery.training.finetune import finetune
    from distillery.training.metrics import accuracy
    from distillery.training.spec import TrainRun

    train, dev = encoded(tok, 256, seed=21), encoded(tok, 96, seed=22)
    path = finetune(classifier(tok.vocab_size, 4), TrainRun(
        out, train, dev, tokenizer=tok, compute_metrics=accuracy, main_score="accuracy",
        args={**FAST, "num_train_epochs": 4, "learning_rate": 3e-3, "per_device_train_batch_size": 16}))
    return transformers.AutoModelForSequenceClassification.from_pretrained(path), train, dev


def task_sections(lr: float = 3e-3, batch: int = 16, epochs: float = 3, **more):
    """`task_distillation` params whose every schedule trains at `lr`, `batch` and `epochs` (one grid point)."""
    from distillery.config import TaskDistillationSection

    grid = {"learning_rates": [lr], "batch_sizes": [batch], "epochs": epochs}
    return TaskDistillationSection(intermediate={"epochs": epochs, "learning_rate": lr, "batch_size": batch},
                                   prediction=grid, finetune=grid, **more)


def task_of(teacher, tok, train, dev, *, augmented=None, seed: int = 0, **more):
    """A plan's `Task` over in-memory sets (`distillery.training.task_data`): the gold `train` for every step, or
    `augmented` for the steps that read the augmented set; dev accuracy selects a grid's best run."""
    from distillery.training.metrics import accuracy
    from distillery.training.task_data import Task

    sets = {(False, False): (train, dev, {"gold": len(train or ()), "augmented": 0, "unlabeled": 0})}
    if augmented is not None:
        sets[(True, False)] = (augmented, dev, {"gold": len(train), "augmented": len(augmented), "unlabeled": 0})
    more.setdefault("train_args", dict(FAST))
    return Task(teacher=teacher, tokenizer=tok, labels={"num_labels": 2}, sets=sets, metrics=(accuracy, "accuracy"),
                augmented=augmented is not None, seed=seed, **more)


# ------------------------------------------------------------------------------------------------ pipeline projects

#: One student per recipe: the end-to-end project (tests/conftest.py::prefect_project), built once per session.
MICRO = {
    "seed": 7,
    "data": {"source": "demo", "tasks": ["demo"], "max_length": 24, "demo_train": 600, "demo_dev": 100,
             "demo_test": 40},
    "corpus": {"source": "demo", "demo_documents": 80},
    "teacher": {"init": "scratch", "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64},
                "vocab_size": 300},
    "pretrain": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 32, "max_length": 32},
    # passes the gate: 0.85 vs 0.5
    "teacher_finetune": {"epochs": 5, "learning_rate": 3e-3, "batch_size": 32, "warmup_ratio": 0.1},
    "word_vectors": {"source": "corpus", "dim": 8},
    "augment": {"n_aug": 2, "max_examples": 40},
    "students": {  # one student per recipe
        "micro": {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32}},
        "micro-minilm": {"recipe": "minilm", "shape": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32}},
        "micro-distilbert": {"recipe": "distilbert", "init": {"teacher_layers": [1]},
                             "shape": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "arch": "distilbert"}},
        "micro-mobilebert": {"recipe": "mobilebert", "shape": {"preset": "mobilebert-tiny", "layers": 2, "hidden": 32,
                                                               "heads": 2, "intermediate": 16, "intra": 8,
                                                               "embedding": 32},
                             "intermediate_step": True},  # as the demo's
        "micro-pkd": {"recipe": "pkd", "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}},
        # a budget instead of a shape: the search stage times both 1-layer candidates of the teacher's width in int8,
        # trains them (the FFN 32 one cut from its distilled FFN 64 twin, which the other one is) and keeps one, which
        # the registry serves in int8
        "micro-budget": {"recipe": "tinybert", "init": {"pruned": {"source": "student"}},
                         "budget": {"latency_ms": 1000, "depths": [1], "width_fractions": [1], "forms": ["int8"],
                                    "train_examples": 100}},
    },
    "general_distillation": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 32, "max_length": 32},
    "task_distillation": {"intermediate": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 32},
                          "prediction": {"learning_rates": [1e-3], "batch_sizes": [32], "epochs": 1},
                          "finetune": {"learning_rates": [1e-3], "batch_sizes": [32], "epochs": 1}},
    "evaluation": {"latency_batch_sizes": [1], "latency_seq_len": 16, "latency_rounds": 5},
}

#: The TinyBERT student alone, at the smallest sizes: every kind of stage still runs for real (data, MLM
#: pre-training, fine-tuning, augmentation, both distillations, evaluation, registry, report) for the tests of
#: caching, scheduling, orchestration, DVC, Dask, resume, the deployment worker and bad input. The teacher only has to
#: be no worse than trivial; no direct baselines, ONNX export or latency unless a test asks for them.
ONE_STUDENT = {
    **MICRO,
    "data": {**MICRO["data"], "demo_train": 200, "demo_dev": 60},
    "teacher_finetune": {"epochs": 2, "learning_rate": 3e-3, "batch_size": 32, "warmup_ratio": 0.1,
                         "min_gain_over_trivial": 0.0},
    "students": {"micro": MICRO["students"]["micro"]},
    "evaluation": {**MICRO["evaluation"], "baselines": False, "latency": False, "export_onnx": False},
}

#: ONE_STUDENT with resume points in every long stage (tests/test_resume.py), long enough to be killed in the middle:
#: the one-student project that `dvc repro` builds once per session (tests/conftest.py::one_student_project).
RESUME = {
    **ONE_STUDENT,
    "data": {**ONE_STUDENT["data"], "demo_train": 300, "demo_dev": 60},
    "teacher_finetune": {"epochs": 6, "learning_rate": 5e-3, "batch_size": 32, "warmup_ratio": 0.1,
                         "min_gain_over_trivial": 0.0, "checkpoint_steps": 5},
    "augment": {"n_aug": 2, "max_examples": 60, "shard_size": 4},
    "general_distillation": {**MICRO["general_distillation"], "epochs": 2, "checkpoint_steps": 4},
    "task_distillation": {"intermediate": {"epochs": 1, "learning_rate": 1e-3, "batch_size": 32},
                          "prediction": {"learning_rates": [1e-3, 2e-3], "batch_sizes": [32], "epochs": 2,
                                         "checkpoint_steps": 4}},
    "evaluation": {"baselines": False, "latency": False, "export_onnx": False},
    "registry": {"enabled": False},
}


def reviews(directory: Path, n_train: int = 200, n_dev: int = 60) -> dict:
    """The demo task as a task of your own: `<directory>/{train,dev}.csv` with columns review, verdict (labels "pan",
    "praise"); returns its `data.custom` entry."""
    import csv

    from distillery.demo import make_demo_task

    raw = make_demo_task(directory / "raw", n_train=n_train, n_dev=n_dev, n_test=4, seed=3)
    for split in ("train", "dev"):
        rows = [line.split("\t") for line in (raw / f"{split}.tsv").read_text().splitlines()[1:]]
        with (directory / f"{split}.csv").open("w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([["review", "verdict"]] + [[t, ["pan", "praise"][int(y)]] for t, y in rows])
    return {"train": str(directory / "train.csv"), "validation": str(directory / "dev.csv"), "text": "review",
            "label": "verdict"}


def prefect_database() -> Path:
    """An empty Prefect database with every migration applied, made once per machine and Prefect version (by
    `prefect server database upgrade`, the first test worker to ask; the others wait on a lock). A project's first
    pipeline command migrates its own from scratch otherwise: ~15 s of CPU per test project (measured 2026-11-26)."""
    import fcntl
    import tempfile
    from importlib.metadata import version

    home = Path(tempfile.gettempdir()) / f"distillery-tests-prefect-{version('prefect')}-{os.getuid()}"
    home.mkdir(exist_ok=True)
    db = home / "prefect.db"
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not db.is_file():
            building = home / "building"
            shutil.rmtree(building, ignore_errors=True)
            building.mkdir()
            env = {**env_for(home, ephemeral=True), "PREFECT_HOME": str(building)}
            proc = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], cwd=home,
                                  env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            os.replace(building / "prefect.db", db)
    return db


@functools.cache
def compiled_packages() -> Path:
    """A directory holding this checkout's packages and nothing else, copied once per test process, their bytecode
    compiled: where PYTHONDONTWRITEBYTECODE is set (this machine sets it), every command in a project would otherwise
    compile them from source again. The copies keep their files' modification times, so the bytecode stays valid in a
    project's copy of this directory."""
    import atexit
    import compileall
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="distillery-tests-packages-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    for name in ("distillery", "tasks", "flows"):
        shutil.copytree(ROOT / name, home / name, ignore=shutil.ignore_patterns("__pycache__"))
        assert compileall.compile_dir(home / name, quiet=1), name
    return home


def make_project(tmp: Path, params: dict | None = None, *, dvc_yaml: bool = True) -> Path:
    """`tmp` holding copies of the pipeline's packages (`compiled_packages`) and its .dvcignore, a migrated Prefect
    database (`prefect_database`) in its PREFECT_HOME and `params` (MICRO by default) as params.yaml; with `dvc_yaml`,
    the dvc.yaml these params declare."""
    shutil.copytree(compiled_packages(), tmp, dirs_exist_ok=True)
    shutil.copyfile(ROOT / ".dvcignore", tmp / ".dvcignore")
    (tmp / ".prefect").mkdir(exist_ok=True)
    shutil.copyfile(prefect_database(), tmp / ".prefect" / "prefect.db")
    (tmp / "params.yaml").write_text(yaml.safe_dump(params or MICRO))
    if dvc_yaml:
        run([sys.executable, "-m", "flows.dvc"], tmp)  # dvc.yaml for these params, from the stage declarations
    return tmp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a server or command that must not see this process's Prefect or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(DO_NOT_TRACK="true", PREFECT_SERVER_ANALYTICS_ENABLED="false", MLFLOW_DISABLE_TELEMETRY="true",
               DVC_NO_ANALYTICS="1", **extra)
    env.setdefault("OMP_NUM_THREADS", "1")  # micro models: one intra-op thread (see env_for)
    return env


class Server:
    """A server (or any long-running command) in its own process group, killed (group and all) by stop(); with a
    `health` URL, up once that URL answers."""

    def __init__(self, cmd: list[str], health: str | None, env: dict[str, str], log: Path, cwd: Path):
        self.log = log
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if health is None:
            return
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{cmd[0]} exited:\n{log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(health, timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.stop()
        raise AssertionError(f"{health} not up after 180 s:\n{log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break


@functools.cache
def prefect_server() -> str:
    """The API URL of this test process's Prefect server (`prefect server start`, API only, no services: what the
    ephemeral server a pipeline starts without PREFECT_API_URL runs), started on first use and stopped at exit. A
    pipeline command on it skips the ephemeral server's start-up: ~8 s of CPU per command (a cached micro pipeline
    took 21 s, 12 s on a running server; 2026-11-28)."""
    import atexit
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="distillery-tests-prefect-server-"))
    shutil.copyfile(prefect_database(), home / "prefect.db")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    atexit.register(shutil.rmtree, home, ignore_errors=True)  # after the server stops (atexit runs last-in first)
    server = Server([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
                     "--no-services", "--no-ui"], f"{url}/health", clean_env(PREFECT_HOME=str(home)),
                    home / "server.log", home)
    atexit.register(server.stop)
    return url


def env_for(project: Path, *, ephemeral: bool = False) -> dict[str, str]:
    """The environment of a pipeline command in `project` (the project's own PREFECT_HOME and MLflow database), its
    micro models on one intra-op thread: as fast as two on an idle 2-core machine, and many times faster on a busy
    one (two OpenMP threads that share a core with another process wait on each other at every operation). Its flow
    runs report to this test process's Prefect server (`prefect_server`), or with `ephemeral` to the ephemeral server
    the command starts itself, as a pipeline run without PREFECT_API_URL does."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["PYTHONPATH"] = str(project)
    env.setdefault("OMP_NUM_THREADS", "1")
    if not ephemeral:
        env["PREFECT_API_URL"] = prefect_server()
    return env


def run(cmd: list[str], cwd: Path, timeout: int = 900, *, ephemeral: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env_for(cwd, ephemeral=ephemeral), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def stamp_times(project: Path) -> dict[str, int]:
    """Each stage stamp of `project` and its modification time: a stage that runs again rewrites its stamp."""
    return {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()}


@contextlib.contextmanager
def scratch(project: Path) -> Iterator[Path]:
    """`project`, free to change until the block ends; then it is back as it was. A stage's cache key holds the
    absolute paths of its inputs, so a copy elsewhere would find every stage stale: the copy takes the project's
    place, the original waits beside it and comes back afterwards."""
    kept = project.with_name(project.name + ".kept")
    project.rename(kept)
    try:
        shutil.copytree(kept, project, symlinks=True)
        yield project
    finally:
        shutil.rmtree(project, ignore_errors=True)
        kept.rename(project)


#: What a pipeline's console may print besides progress bars: the precision it runs at (distillery.precision, once),
#: stage events, a budget search's steps, the registry's decisions, the change report's line, the result in words
#: (and a budgeted student's), the summary.
EVENT_LINE = re.compile(r"^(precision: (bf16|fp32) .+|[a-z_]+(\[[^]]+\])?: (started|done in \d+ s)|"
                        r"register \S+ version \d+: .+|changes: .+|\S+: best student .+|search\[\S+\]: .+|"
                        r"\S+: budget .+|pipeline finished in .+)$")


def stage_lines(console: str) -> list[str]:
    """The console's lines other than progress bars (tqdm redraws with carriage returns)."""
    lines = [line.strip() for line in console.replace("\r", "\n").splitlines()]
    return [line for line in lines if line and not any(bar in line for bar in ("it/s]", "s/it]", "ex/s]", "%|"))]
