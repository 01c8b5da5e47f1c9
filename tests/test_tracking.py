"""MLflow runs whose process was killed are marked FAILED by the next top-level run."""

import socket
import subprocess

import pytest

mlflow = pytest.importorskip("mlflow")


def test_killed_runs_are_marked_failed_by_the_next_run(tmp_path, monkeypatch):
    from tasks import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    dead = subprocess.Popen(["true"])
    dead.wait()
    client = mlflow.MlflowClient()
    exp = mlflow.set_experiment(tracking.EXPERIMENT).experiment_id
    killed = client.create_run(exp, tags={tracking.HOST_TAG: socket.gethostname(), tracking.PID_TAG: str(dead.pid)})
    alive = client.create_run(exp, tags={tracking.HOST_TAG: socket.gethostname(), tracking.PID_TAG: "1"})
    with tracking.run("next"):
        pass
    assert client.get_run(killed.info.run_id).info.status == "FAILED"
    assert client.get_run(alive.info.run_id).info.status == "RUNNING"  # its process still exists
    finished = mlflow.search_runs([exp], filter_string="attributes.run_name = 'next'", output_format="list")
    assert finished[0].info.status == "FINISHED"


def test_untracked_stage_keeps_its_metrics_in_a_file(tmp_path, monkeypatch):
    """With tracking off nothing reaches MLflow; the stage's flat, finite metrics (its metrics file's too) go to the
    JSON file it is given."""
    import json

    from tasks import tracking

    monkeypatch.setenv(tracking.SWITCH, "off")
    extra = tmp_path / "m.json"
    extra.write_text(json.dumps({"dev": {"f1": 0.5}}))
    out = tmp_path / "untracked" / "stage-item.json"
    tracking.log_result({"metrics": {"loss": 1.5, "nan": float("nan"), "flag": True, "name": "x", "steps": 3},
                         "metrics_file": str(extra)}, out)
    assert json.loads(out.read_text()) == {"loss": 1.5, "steps": 3.0, "dev.f1": 0.5}
    tracking.log_result({"metrics": {"loss": 2.0}})  # no file asked for: nothing written, nothing raised
