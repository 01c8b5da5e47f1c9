"""MLflow tracking for stages: one parent run per pipeline run, a nested run per stage.

The tracking URI defaults to `sqlite:///<project>/mlflow.db` (tasks.env); MLFLOW_TRACKING_URI overrides it.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
from pathlib import Path
from typing import Any, Iterator

EXPERIMENT = "distillery"


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v if not isinstance(v, (list, tuple)) else json.dumps(v)
    return out


@contextlib.contextmanager
def run(name: str, *, params: dict[str, Any] | None = None, parent_run_id: str | None = None,
        tags: dict[str, str] | None = None) -> Iterator[Any]:
    import mlflow

    mlflow.set_experiment(EXPERIMENT)
    kwargs = {"parent_run_id": parent_run_id, "nested": True} if parent_run_id else {}
    with mlflow.start_run(run_name=name, tags=tags, **kwargs) as active:
        if params:
            mlflow.log_params({k: str(v)[:6000] for k, v in _flatten(params).items()})
        yield active


def log_result(result: dict[str, Any]) -> None:
    """Log what a stage returned: flat metrics, a metrics JSON file, a per-step CSV curve, artifacts."""
    import mlflow

    metrics = dict(result.get("metrics") or {})
    if result.get("metrics_file") and Path(result["metrics_file"]).is_file():
        metrics.update(json.loads(Path(result["metrics_file"]).read_text()))
    finite = {k: float(v) for k, v in _flatten(metrics).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if finite:
        mlflow.log_metrics(finite)
    if result.get("curve") and Path(result["curve"]).is_file():
        log_curve(Path(result["curve"]))
    for artifact in result.get("artifacts") or []:
        if Path(artifact).is_file():
            mlflow.log_artifact(str(artifact))
        elif Path(artifact).is_dir():
            mlflow.log_artifacts(str(artifact), artifact_path=Path(artifact).name)


def log_curve(path: Path) -> None:
    """Per-step losses from a training log CSV (a `step` column and numeric columns)."""
    import mlflow
    from mlflow.entities import Metric

    timestamp = int(path.stat().st_mtime * 1000)
    metrics = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            try:
                step = int(float(row.get("step") or 0))
            except ValueError:
                continue
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                try:
                    v = float(value)
                except ValueError:
                    continue
                if math.isfinite(v):
                    metrics.append(Metric(f"train/{key}", v, timestamp, step))
    client = mlflow.tracking.MlflowClient()
    run_id = mlflow.active_run().info.run_id
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
