"""The Prefect API server dies in the middle of a run (issue 27, item 8): the stages go on and keep their outputs, the
console says so once, no traceback; a re-run skips every stage that finished."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from helpers import ONE_STUDENT, ROOT, env_for, make_project, run, stage_lines


def connect_error() -> httpx.ConnectError:
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as exc:
            raise httpx.ConnectError("[Errno 111] Connection refused") from exc
    except httpx.ConnectError as exc:
        return exc


def test_unreachable_finds_a_connection_failure_in_the_chain():
    from flows.api_server import unreachable

    assert unreachable(connect_error())
    try:
        try:
            raise connect_error()
        except httpx.ConnectError as exc:
            raise RuntimeError("set_state failed") from exc
    except RuntimeError as wrapped:
        assert unreachable(wrapped)
    assert not unreachable(ValueError("bad value")) and not unreachable(None)


def record(name: str, msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, (), (type(exc), exc, None) if exc else None)


def test_the_filter_lets_one_line_through_and_drops_the_rest():
    from flows.api_server import ServerGone

    gone = ServerGone()
    unrelated = record("prefect.task_runs", "Task run failed: ValueError")
    assert gone.filter(unrelated) and unrelated.getMessage() == "Task run failed: ValueError"
    first = record("prefect.events.clients", "Unable to connect to 'ws://127.0.0.1:8051/api/events/in'. Please check")
    assert gone.filter(first)
    assert "is not answering" in first.getMessage() and first.levelno == logging.WARNING and first.exc_info is None
    later = [record("prefect._internal.concurrency", "Service 'EventsWorker' failed to process item Event(...)"),
             record("prefect.flow_runs", "Encountered exception during execution", connect_error()),
             record("EventsWorker", "Still processing items: 2 items remaining...")]
    assert not any(gone.filter(r) for r in later)
    assert gone.filter(record("prefect.task_runs", "another, unrelated"))


def test_a_run_stopped_by_the_lost_server_says_to_rerun_in_one_line(monkeypatch, capsys):
    import flows.pipeline as pipeline

    def lost(_params_file):
        raise connect_error()

    monkeypatch.setattr(pipeline, "pipeline", lost)
    assert pipeline.main(["--params", str(ROOT / "params.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the Prefect API server") and "run the same command again" in err[0]


@pytest.mark.slow
def test_the_run_survives_its_server_dying_and_a_rerun_skips_what_finished(tmp_path):
    """SIGKILL the ephemeral Prefect server the flow started, once the teacher is fine-tuned: the remaining stages run,
    the console says once that the server is gone, exit 0; the re-run says `cached` for every stage."""
    params = {**ONE_STUDENT, "augment": {"enabled": False}, "registry": {"enabled": False}}
    project = make_project(tmp_path, params, dvc_yaml=False)
    # its own ephemeral server, to kill; the client's retries: ~1 min with the default 5
    env = {**env_for(project, ephemeral=True), "PREFECT_CLIENT_MAX_RETRIES": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.pipeline"], cwd=project, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (project / ".prefect" / "stamps" / "finetune_teacher@demo").is_file():
            assert proc.poll() is None, f"the flow ended (exit {proc.returncode}) before its server could be killed"
            assert time.monotonic() < deadline, "the teacher was not fine-tuned in time"
            time.sleep(0.05)
        servers = subprocess.run(["pgrep", "-g", str(proc.pid), "-f", "prefect.server.api.server:create_app"],
                                 capture_output=True, text=True).stdout.split()
        assert len(servers) == 1, servers
        os.kill(int(servers[0]), signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    assert "report: done in" in out and (project / "metrics" / "summary.json").is_file()
    noise = stage_lines(err)
    assert len(noise) == 1 and "is not answering" in noise[0], "\n".join(noise)[-4000:]
    assert "Traceback" not in err and "--- Error logging to API ---" not in err

    console = run([sys.executable, "-m", "flows.pipeline"], project).stdout
    stamps = sorted(p.name for p in (project / ".prefect" / "stamps").iterdir() if "." not in p.name)
    for stamp in stamps:
        name, item = stamp.split("@")
        label = name if item == "-" else f"{name}[{item}]"
        assert f"{label}: cached" in console and f"{label}: started" not in console, console
    assert len(stamps) >= 7, stamps
