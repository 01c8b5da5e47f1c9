"""Run one stage for one item: the body, its MLflow run, its training curve for DVC plots, its stamp.

A fresh stage (`tasks.stage.is_fresh`) is not run again. Before a stage runs, what a killed earlier run left
behind is cleaned: temporary files of atomic writes, and resume state (Trainer checkpoints, finished steps and grid
runs, finished shards) that was written under another key (other params, code or inputs), so a run resumes only
from work its own key made; the console line says what it resumes.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tasks import paths, tracking
from tasks.stage import SKIPPED, STAMPS, Stage, is_fresh, precision_used, stage_key, staged

from distillery.config import Params
from distillery.errors import disk_full
from distillery.io import atomic_path, write_text
from distillery.training.saving import CHECKPOINTS, MODEL


def curve_name(stage: Stage, item: str | None) -> str:
    return stage.name if item is None else f"{stage.name}-{item.replace(':', '-')}"


def label(stage: Stage, item: str | None) -> str:
    return stage.name if item is None else f"{stage.name}[{item}]"


_CONSOLE = threading.Lock()


def say(line: str) -> None:
    """One line on the console for a stage event (started / cached / done), whole even when stages run at once
    (`print` writes the text and its newline separately)."""
    with _CONSOLE:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def execute(stage: Stage, params: Params, item: str | None = None, parent_run_id: str | None = None,
            *, say_cached: bool = True, key: str | None = None) -> dict[str, Any]:
    """Run `stage` for `item` inside a (nested) MLflow run, unless it is fresh; return a JSON-able result with
    output paths (and `"cached": True` when nothing ran). The stage's key is computed once here (or given, as the
    Prefect task computed it for its cache) and used for the freshness check, the resume state and the stamp."""
    key = key or stage_key(stage, params, item)
    if is_fresh(stage, params, item, key):
        if say_cached:
            say(f"{label(stage, item)}: cached")
        return {"cached": True, "outs": [str(o) for o in stage.outs(params, item)]}
    name = curve_name(stage, item)
    resumed = prepare(stage, params, item, key)
    say(f"{label(stage, item)}: started" + (f" (resuming: {', '.join(_rel(p) for p in resumed)})" if resumed else ""))
    started = time.perf_counter()
    logged = stage.params(params, item)
    if stage.device:
        logged["precision_used"] = precision_used(stage, params)
    with tracking.run(name, params=logged, parent_run_id=parent_run_id,
                      tags={"stage": stage.name, "item": item or ""}):
        try:
            with staged(stage, params, item, key) as run:
                run.result = run.body(run.params, item)
            result = run.result
        except Exception as exc:
            writing = ", ".join(_rel(Path(o)) for o in stage.outs(params, item))  # PyTorch's writer names no file
            if (full := disk_full(exc, paths.ROOT, writing)) is not None:  # one line, not the writer's traceback
                raise full from exc
            raise
        if result.get("skipped"):
            write_text(paths.curves(name), "step,loss\n")  # no training step (and the plot dvc.yaml declares exists)
        if result.get("curve") and Path(result["curve"]).is_file():
            with atomic_path(paths.curves(name)) as tmp:
                shutil.copyfile(result["curve"], tmp)
        tracking.log_result(result, paths.untracked(name))
    _started_file(stage, item).unlink(missing_ok=True)
    seconds = time.perf_counter() - started
    say(f"{label(stage, item)}: " + (f"skipped: {result['skipped']}" if result.get("skipped") else
                                     f"done in {seconds:.0f} s"))
    result = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.items()}
    result["outs"] = [str(o) for o in stage.outs(params, item)]
    result["seconds"] = round(seconds, 2)
    return result


def _rel(path: Path) -> str:
    return str(path.relative_to(paths.ROOT)) if path.is_relative_to(paths.ROOT) else str(path)


def _started_file(stage: Stage, item: str | None) -> Path:
    return STAMPS / f"{stage.name}@{item or '-'}.started"


def prepare(stage: Stage, params: Params, item: str | None, key: str | None = None) -> list[Path]:
    """Clean up after a killed run of this stage: leftover temporary files of atomic writes (`.NAME.*.tmp`,
    `.NAME.old`), a skip record in a directory output, and the resume state that another key made; record the key
    this run starts under. Returns the resume state kept (this key's own interrupted work)."""
    key = key or stage_key(stage, params, item)
    started = _started_file(stage, item)
    same_key = started.is_file() and started.read_text().strip() == key
    outs = [Path(o) for o in stage.outs(params, item)]
    kept = []
    for out in outs:
        _remove_leftovers(out)
        if out.is_dir():  # a skip record of an earlier run: this run writes the output, or a new record
            (out / SKIPPED).unlink(missing_ok=True)
        for state in resume_state(out, outs):
            if same_key:
                kept.append(state)
            elif state.is_dir():
                shutil.rmtree(state, ignore_errors=True)
            else:
                state.unlink(missing_ok=True)
    write_text(started, key + "\n")
    return kept


def _remove_leftovers(out: Path) -> None:
    places = [out.parent] + ([out] if out.is_dir() else [])
    for place in places:
        if not place.is_dir():
            continue
        pattern = f".{out.name}.*" if place == out.parent else ".*.*"
        candidates = place.glob(pattern) if place == out.parent else place.rglob(pattern)
        for leftover in list(candidates):
            if leftover.name.endswith((".tmp", ".old")):
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)


def shards_dir(out: Path) -> Path:
    """Where a stage that writes one file keeps the shards it has finished: `<dir>/checkpoints/<file name>/`."""
    return out.parent / CHECKPOINTS / out.name


def resume_state(out: Path, outs: list[Path]) -> list[Path]:
    """What an interrupted run left to resume from. A training output `<dir>/model`: everything else in `<dir>`
    (Trainer checkpoints, finished steps, grid runs, layer stages, caches); a file: its finished shards; a directory:
    Trainer checkpoints inside it."""
    if out.name == MODEL:
        return sorted(p for p in out.parent.iterdir() if p not in outs) if out.parent.is_dir() else []
    if out.is_dir():
        return [d for d in out.rglob(CHECKPOINTS) if d.is_dir()]
    return [shards_dir(out)] if shards_dir(out).is_dir() else []
