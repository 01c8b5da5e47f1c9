"""MLflow tracking for stages: one parent run per pipeline run, a nested run per stage.

The tracking URI defaults to `sqlite:///<project>/mlflow.db` (tasks.env); MLFLOW_TRACKING_URI overrides it.
`DISTILLERY_TRACKING=off` runs stages untracked, for a machine with the library but not the `pipeline` extra (an
offline GPU box: `benchmarks.gpu_bundle`): no MLflow run is opened and nothing is logged to MLflow; the stages' files
are the same, each stage's flat metrics go to `metrics/untracked/` (`tasks.paths.untracked`), and the register stage,
which needs the registry, refuses to run.
Each run carries the host and process id that own it, so a run whose process was killed (it stays RUNNING
forever otherwise) is marked FAILED when the next top-level run starts on that host. A top-level run is tagged
with its provenance: the git commit and what `dvc.lock` records of its inputs (tasks.provenance).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import socket
from pathlib import Path
from typing import Any, Iterator

from tasks.lock import alive

EXPERIMENT = "distillery"
HOST_TAG, PID_TAG = "distillery.host", "distillery.pid"
SWITCH = "DISTILLERY_TRACKING"


def enabled() -> bool:
    """Whether stages are tracked in MLflow (`DISTILLERY_TRACKING` is not `off`)."""
    return os.environ.get(SWITCH, "on").strip().lower() != "off"


def require(what: str, otherwise: str = "") -> None:
    """Refuse `what` (something that needs MLflow itself, not only a log) while tracking is off; `otherwise` says
    what else the user can run."""
    if not enabled():
        from distillery.errors import UserError

        raise UserError(f"{what} needs MLflow, and tracking is off ({SWITCH}=off): unset it"
                        + (f", or {otherwise}" if otherwise else ""))


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
    """A (nested) MLflow run around a stage or a pipeline; None, and nothing logged, while tracking is off."""
    if not enabled():
        yield None
        return
    import mlflow

    experiment = mlflow.set_experiment(EXPERIMENT)
    if not parent_run_id:
        close_orphans(experiment.experiment_id)
    kwargs = {"parent_run_id": parent_run_id, "nested": True} if parent_run_id else {}
    owner = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
    from tasks.provenance import run_tags

    provenance = {} if parent_run_id else run_tags()  # nested runs share their parent's
    with mlflow.start_run(run_name=name, tags={**(tags or {}), **provenance, **owner}, **kwargs) as active:
        if params:
            mlflow.log_params({k: str(v)[:6000] for k, v in _flatten(params).items()})
        yield active


def close_orphans(experiment_id: str) -> list[str]:
    """Mark FAILED the RUNNING runs of this host whose process is gone (killed); return their ids."""
    import mlflow

    client = mlflow.MlflowClient()
    host = socket.gethostname()
    closed = []
    for r in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000):
        tags = r.data.tags
        if tags.get(HOST_TAG) == host and tags.get(PID_TAG, "").isdigit() and not alive(int(tags[PID_TAG])):
            client.set_tag(r.info.run_id, "distillery.killed", "the process that ran it ended without closing it")
            client.set_terminated(r.info.run_id, status="FAILED")
            closed.append(r.info.run_id)
    return closed


def log_result(result: dict[str, Any], untracked: Path | None = None) -> None:
    """Log what a stage returned: flat metrics, a metrics JSON file, a per-step CSV curve, artifacts; a skip reason as
    the run's tag `skipped`. With tracking off, the flat metrics go to the JSON file `untracked` (when given) and
    nothing else is logged."""
    metrics = dict(result.get("metrics") or {})
    if result.get("metrics_file") and Path(result["metrics_file"]).is_file():
        metrics.update(json.loads(Path(result["metrics_file"]).read_text()))
    finite = {k: float(v) for k, v in _flatten(metrics).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if not enabled():
        if untracked is not None:
            from distillery.io import write_text

            write_text(untracked, json.dumps(finite, indent=1, sort_keys=True) + "\n")
        return
    import mlflow

    if result.get("skipped"):
        mlflow.set_tag("skipped", str(result["skipped"])[:5000])
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
