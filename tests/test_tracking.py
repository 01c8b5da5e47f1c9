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
