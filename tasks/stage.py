"""The stage abstraction shared by the Prefect flow and the DVC stages.

A stage declares, for a given item (a task, a student, a student-task pair or nothing), its inputs, its
outputs and the params that matter. From those, one content-addressed cache key is derived:

    key = sha256(stage, item, code version, the params that matter, fingerprints of every input)

The stamp a stage writes after it ran (`.prefect/stamps/<stage>@<item>`) is the one record of freshness: the
key that made the outputs and a fingerprint of each output as written. A stage is fresh when the key is the
same and every output still has that fingerprint, so a deleted, modified or foreign output is stale. The
Prefect flow uses the key as its task cache key and runs no body for a fresh stage even when Prefect's own
result store misses (e.g. after `dvc repro`); `python -m flows.stage`, which DVC calls, skips a fresh stage
the same way. DVC reaches the same decision from `dvc.yaml` (same deps, same params, same outs).

A body with nothing to do for its item (its task's teacher failed the gate) raises `SkipStage`: the stage succeeds
without running, each output becomes a skip record that says why (`write_skipped`, read back with `skipped`), and it
is stamped like any run, so the flow, `python -m flows.stage` and `dvc repro` (which needs every declared output)
agree, and a re-run finds it fresh until its inputs or params change.

`staged` gives a body the params of its item's task (`for_item`) and, for a stage declared `distributed` with
`distributed.nproc_per_node` > 1, the call that runs it on that many torchrun ranks (`launch`; a rank:
`tasks.launch`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from tasks.env import ROOT

from distillery.config import Params
from distillery.errors import UserError
from distillery.io import atomic_dir, write_json, write_text

STAMPS = ROOT / ".prefect" / "stamps"
SKIPPED = "skipped.json"  # the skip record inside a skipped directory output


class SkipStage(Exception):
    """Raised by a stage body that has nothing to do for its item; `reason` is the short line the console shows."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


def write_skipped(outs: list[Path], reason: str) -> None:
    """Each output of a skipped stage as a skip record `{"skipped": reason}`: a file output (a name with a suffix)
    holds it, a directory output holds it as `skipped.json`."""
    record = {"skipped": reason}
    for out in map(Path, outs):
        if out.suffix:
            write_json(out, record)
        else:
            with atomic_dir(out) as tmp:
                write_json(tmp / SKIPPED, record)


def skipped(out: Path) -> str | None:
    """Why a stage skipped this directory output (`write_skipped`), or None when it holds the stage's work."""
    record = Path(out) / SKIPPED
    if not record.is_file():
        return None
    return json.loads(record.read_text(encoding="utf-8")).get("skipped") or "skipped"


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Params, str | None], dict[str, Any]]
    deps: Callable[[Params, str | None], list[Path]]
    outs: Callable[[Params, str | None], list[Path]]
    params: Callable[[Params, str | None], dict[str, Any]]
    code: tuple[str, ...] = field(default=())  # the source files/packages whose content is the stage's code version
    #: How the stage uses the device when the flow runs stages concurrently: "" reads and writes files (runs beside
    #: anything; uses no global random state), "shared" computes on it (training, MLM inference: one device slot),
    #: "exclusive" measures on it (latency: every slot).
    device: Literal["", "shared", "exclusive"] = ""
    #: The body returns a training curve (`result["curve"]`), which the pipeline copies to metrics/curves/.
    curve: bool = False
    #: The body trains through the Trainer and runs on `distributed.nproc_per_node` processes when that is over 1
    #: (`launch`), the `distributed` section then one of its params (another reduction order, other dropout masks).
    distributed: bool = False

    def __post_init__(self) -> None:
        # every stage reads its params through distillery/config.py, where their defaults live: editing a default
        # reruns the stage in the flow (its key) and in `dvc repro` (a dep of every stage in dvc.yaml)
        object.__setattr__(self, "code", tuple(dict.fromkeys((*self.code, "distillery/config.py"))))
        if self.device or self.distributed:  # how it computes: params of the stage (its key, dvc.yaml)
            object.__setattr__(self, "params", _with_compute(self.params, self.device != "", self.distributed))
        # a task's stages (item "<task>" or "<student>:<task>") see its `per_task` settings, in every use of the stage
        # (the body's params are scoped by `staged`)
        for name in ("deps", "outs", "params"):
            object.__setattr__(self, name, _for_item(getattr(self, name)))


def _with_compute(fn: Callable[[Params, str | None], dict[str, Any]], device: bool,
                  distributed: bool) -> Callable[[Params, str | None], dict[str, Any]]:
    """`fn`'s params and what decides how the body computes: the precision of what runs on the device, the
    `distributed` section when the body runs on several processes (one process keeps the key it had)."""

    @functools.wraps(fn)
    def params(p: Params, item: str | None) -> dict[str, Any]:
        compute = {"precision": p.precision} if device else {}
        if device and p.compile != "auto":  # auto keeps the key it had before the switch existed
            compute["compile"] = p.compile
        if distributed and p.distributed.nproc_per_node > 1:
            compute["distributed"] = p.distributed.model_dump(mode="json")
        return {**fn(p, item), **compute}

    return params


def precision_used(stage: Stage, params: Params) -> str | None:
    """What a device stage computes in on this machine (`distillery.precision`: `auto` resolved); None for a file
    stage. Part of the stage's key: an `auto` run on another machine may compute in another precision."""
    from distillery.precision import resolve

    return resolve(params.precision) if stage.device else None


def for_item(p: Params, item: str | None) -> Params:
    """The params of the item's task (`Params.for_task`; other items: the run's). A student named like a task would
    get that task's sections, which no student stage reads."""
    return p.for_task(item.rpartition(":")[2]) if item else p


def _for_item(fn: Callable[[Params, str | None], Any]) -> Callable[[Params, str | None], Any]:
    """`fn` given the params of the item's task (`for_item`)."""
    if getattr(fn, "for_item", False):
        return fn

    @functools.wraps(fn)
    def scoped(p: Params, item: str | None) -> Any:
        return fn(for_item(p, item), item)

    scoped.for_item = True
    return scoped


@lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file's bytes, memoised by (path, size, mtime): a stage's key is needed several times
    per run (freshness check, Prefect cache key, stamp) and must not re-read model weights each time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest(path: Path) -> str:
    st = path.stat()
    return _file_digest(str(path.resolve()), st.st_size, st.st_mtime_ns)


def fingerprint(path: str | Path) -> str:
    """Content hash of a file or directory (relative names + bytes); 'missing' when absent."""
    path = Path(path)
    if path.is_file():
        return _digest(path)
    if not path.is_dir():
        return "missing"
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.name.startswith("."):
            h.update(str(p.relative_to(path)).encode())
            h.update(_digest(p).encode())
    return h.hexdigest()


def _source(entry: str) -> Path:
    """'distillery/...' resolves inside the imported library (wherever it is installed), else the project."""
    import distillery

    if entry == "distillery" or entry.startswith("distillery/"):
        return Path(distillery.__file__).parent / entry[len("distillery/"):]
    return ROOT / entry


@lru_cache(maxsize=None)
def code_version(code: tuple[str, ...]) -> str:
    """Hash of a stage's source files (and the torch/transformers versions): editing one stage's code
    reruns that stage and what depends on its outputs, not the whole pipeline."""
    import torch
    import transformers

    h = hashlib.sha256(f"{torch.__version__}|{transformers.__version__}".encode())
    for entry in code:
        path = _source(entry)
        if not path.exists():
            raise FileNotFoundError(f"stage code {entry!r} not found at {path}")
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f"{entry}/{f.relative_to(path) if path.is_dir() else ''}".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def stage_key(stage: Stage, params: Params, item: str | None) -> str:
    payload = {
        "stage": stage.name,
        "item": item,
        "code": code_version(stage.code),
        "params": stage.params(params, item),
        "deps": {project_relative(p): fingerprint(p) for p in stage.deps(params, item)},
    }
    if stage.device:
        payload["precision_used"] = precision_used(stage, params)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _stamp_path(stage: Stage, item: str | None) -> Path:
    return STAMPS / f"{stage.name}@{item or '-'}"


def project_relative(path: str | Path) -> str:
    """A path as stage keys and stamps hold it: relative to the project root when inside it, so a moved or copied
    clone keeps its cache (a path outside the project, e.g. ../shared data, as it is given)."""
    path = Path(path)
    try:
        return path.resolve().relative_to(ROOT.resolve()).as_posix()
    except ValueError:
        return str(path)


def _outputs(stage: Stage, params: Params, item: str | None) -> dict[str, str]:
    return {project_relative(o): fingerprint(o) for o in stage.outs(params, item)}


def is_fresh(stage: Stage, params: Params, item: str | None, key: str | None = None) -> bool:
    """True when the stamp says this key made the outputs and every output is still as it was written (``key``: the
    stage's key when the caller has it already)."""
    stamp = _stamp_path(stage, item)
    if not stamp.is_file():
        return False
    try:
        recorded = json.loads(stamp.read_text())
    except ValueError:  # an old plain-key stamp, or a damaged one: not fresh
        return False
    if not isinstance(recorded, dict) or recorded.get("key") != (key or stage_key(stage, params, item)):
        return False
    outputs = _outputs(stage, params, item)
    return "missing" not in outputs.values() and recorded.get("outputs") == outputs


@dataclass
class StageRun:
    """A stage body's run inside `staged`: the params of its item's task, the body to call with them (`launch` on N
    ranks, or the stage's own), and the result it returned (`{"skipped": reason}` once it skipped)."""

    params: Params
    body: Callable[[Params, str | None], dict[str, Any]]
    result: dict[str, Any] | None = None


@contextmanager
def staged(stage: Stage, params: Params, item: str | None, key: str | None = None) -> Iterator[StageRun]:
    """Around a stage body's call (``run.result = run.body(run.params, item)``): the seed, precision and compile of
    the run, the item's task's params; a body that raises SkipStage leaves skip records as its outputs and the result
    `{"skipped": reason}`; then the stamp, the outputs with the key that made them and their fingerprints."""
    key = key or stage_key(stage, params, item)
    # an earlier run's stamp stays until this run stamps: it is valid only for its key and while every output is as
    # it recorded, so a failed or killed run (atomic outputs) leaves the earlier good run fresh, and never looks
    # fresh itself
    if stage.device:
        from transformers import set_seed

        # A device stage starts from the same random state (random heads and students, dropout), whatever ran before
        # it in this process: the flow runs many stages in one process, `dvc repro` one per process; both must agree.
        # (File stages use their own seeded generators: they may run beside a training stage and must not reseed it.)
        set_seed(params.seed)
    from distillery import precision
    from distillery.training import compiled

    p = for_item(params, item)
    run = StageRun(p, functools.partial(launch, stage.run) if _on_ranks(stage, p) else stage.run)
    try:
        with precision.use(params.precision), compiled.use(params.compile):
            yield run
    except SkipStage as exc:
        write_skipped(stage.outs(params, item), exc.reason)
        run.result = {"skipped": exc.reason}
    write_text(_stamp_path(stage, item), json.dumps({"key": key, "outputs": _outputs(stage, params, item)},
                                                    indent=1, sort_keys=True) + "\n")


def run_stage(stage: Stage, params: Params, item: str | None, key: str | None = None) -> dict[str, Any]:
    """Run a stage body `staged`, as `tasks.execute.execute` does, without its MLflow run and console lines."""
    with staged(stage, params, item, key) as run:
        run.result = run.body(run.params, item)
    return run.result


def split_item(item: str) -> tuple[str, str]:
    """A student-task item "student:task" -> (student, task)."""
    student, task = item.split(":", 1)
    return student, task


def _on_ranks(stage: Stage, p: Params) -> bool:
    """The body goes to `launch`: a distributed stage on N > 1 processes, called outside a rank."""
    if not (stage.distributed and p.distributed.nproc_per_node > 1):
        return False
    from distillery.training.distributed import launched

    return not launched()


def launch(body: Callable[[Params, str | None], dict[str, Any]], p: Params, item: str | None) -> dict[str, Any]:
    """Run `body` (a module-level stage body) on N = `distributed.nproc_per_node` processes under torchrun, each a
    rank of `tasks.launch`; return rank 0's result. A skip or a user error in the ranks is raised here as in one
    process."""
    target, n = f"{body.__module__}:{body.__name__}", p.distributed.nproc_per_node
    with tempfile.TemporaryDirectory(prefix="distillery-launch-") as tmp:
        params_file, result_file = Path(tmp) / "params.json", Path(tmp) / "result.json"
        params_file.write_text(p.model_dump_json(), encoding="utf-8")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
               "-m", "tasks.launch", target, "--params", str(params_file), "--result", str(result_file)]
        if item is not None:
            cmd += ["--item", item]
        returncode = subprocess.run(cmd, cwd=ROOT).returncode
        result = json.loads(result_file.read_text(encoding="utf-8")) if result_file.is_file() else {}
    if "skipped" in result:  # the body found nothing to do, in every rank alike
        raise SkipStage(result["message"], result["skipped"])
    if "error" in result:
        raise UserError(result["error"])
    if returncode != 0 or "result" not in result:
        raise RuntimeError(f"{target} on {n} processes (torchrun) exited with status {returncode}; the ranks' "
                           "output is above")
    return result["result"]
