"""Run one stage for one item: the body, its MLflow run, its training curve for DVC plots, its stamp."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tasks import paths, tracking
from tasks.stage import Stage, run_stage

from distillery.config import Params
from distillery.io import atomic_path


def curve_name(stage: Stage, item: str | None) -> str:
    return stage.name if item is None else f"{stage.name}-{item.replace(':', '-')}"


def execute(stage: Stage, params: Params, item: str | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    """Run `stage` for `item` inside a (nested) MLflow run; return a JSON-able result with output paths."""
    name = curve_name(stage, item)
    with tracking.run(name, params=stage.params(params, item), parent_run_id=parent_run_id,
                      tags={"stage": stage.name, "item": item or ""}):
        result = run_stage(stage, params, item)
        if result.get("curve") and Path(result["curve"]).is_file():
            with atomic_path(paths.curves(name)) as tmp:
                shutil.copyfile(result["curve"], tmp)
        tracking.log_result(result)
    result = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.items()}
    result["outs"] = [str(o) for o in stage.outs(params, item)]
    return result
