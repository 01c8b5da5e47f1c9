"""kill -9 in the middle of a long stage, then run it again: it resumes from the work its key left, and ends with
the same output as the uninterrupted run.

One micro project (the TinyBERT student alone, with resume points: helpers.RESUME) runs every stage once,
uninterrupted: the session's `one_student_project`, built by `dvc repro` (tests/conftest.py); this module works on a
copy of it, whose outputs are the reference. Each test then deletes one stage's output, starts that stage as DVC does
(`python -m flows.stage`), SIGKILLs it (with its process group) as soon as it has written its first resume point,
re-runs it to the end and compares with the reference. All four comparisons are bit-identical (on one machine and thread count the CPU
computation is deterministic, and the Trainer restores its RNG and data order on resume): the weights
(`model.safetensors`, the projection in `distill_state.safetensors`), the config and the dev metrics (timings
left out); the augmented file byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from helpers import ONE_STUDENT, env_for, make_project, run

OUTS = {"finetune_teacher": "models/teacher/demo/model", "augment": "data/augmented/demo.tsv",
        "general_distillation": "models/general/micro/model", "task_distillation": "models/students/micro-demo/model"}


@pytest.fixture(scope="module")
def project(one_student_project, tmp_path_factory):
    """A copy of the session's one-student project (no cache hit is needed: each test runs its stage itself)."""
    project = tmp_path_factory.mktemp("resume") / "project"
    shutil.copytree(one_student_project.project, project, symlinks=True)
    for out in OUTS.values():  # the uninterrupted run's outputs
        src, dst = project / out, project / "reference" / out
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, dst)
    return project


def _checkpoint_in(directory: Path) -> bool:
    """A Trainer checkpoint under `directory` whose state file is written (the state is saved last)."""
    return any(directory.glob("checkpoint-*/trainer_state.json"))


def kill_then_resume(project: Path, stage: str, item: str, ready: Callable[[], bool]) -> str:
    """Run `stage` for `item` from scratch, SIGKILL it once `ready()`, check it was killed mid-run (no output),
    run it again to the end; return the console of the re-run."""
    out = project / OUTS[stage]
    shutil.rmtree(out) if out.is_dir() else out.unlink()
    (project / ".prefect" / "stamps" / f"{stage}@{item}").unlink()
    cmd = [sys.executable, "-m", "flows.stage", stage, "--item", item]
    proc = subprocess.Popen(cmd, cwd=project, env=env_for(project), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ready():
            assert proc.poll() is None, f"{stage} ended (exit {proc.returncode}) before the test could kill it"
            assert time.monotonic() < deadline, f"{stage}: no resume point appeared"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists(), f"{stage} had finished: not killed mid-run"
    console = run(cmd, project).stdout
    assert f"{stage}[{item}]: started (resuming: " in console, console
    return console


def assert_same_as_uninterrupted(project: Path, stage: str) -> None:
    out, ref = project / OUTS[stage], project / "reference" / OUTS[stage]
    if ref.is_file():
        assert out.read_bytes() == ref.read_bytes()
        return
    for name in ("model.safetensors", "distill_state.safetensors", "config.json"):
        if (ref / name).exists():
            assert (out / name).read_bytes() == (ref / name).read_bytes(), f"{stage}: {name} differs"

    def dev(d: Path) -> dict:
        metrics = json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").is_file() else {}
        return {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}

    assert dev(out) == dev(ref)


@pytest.mark.slow
def test_teacher_fine_tuning_resumes_after_kill(project):
    kill_then_resume(project, "finetune_teacher", "demo", lambda: _checkpoint_in(project / "models/teacher/demo/checkpoints"))
    assert_same_as_uninterrupted(project, "finetune_teacher")
    assert not (project / "models/teacher/demo/checkpoints").exists()  # dropped once the model is exported


@pytest.mark.slow
def test_augmentation_resumes_at_its_first_missing_shard(project):
    shards = project / "data/augmented/checkpoints/demo.tsv"
    console = kill_then_resume(project, "augment", "demo", lambda: any(shards.glob("part-*.tsv")))
    assert "data/augmented/checkpoints/demo.tsv" in console
    assert_same_as_uninterrupted(project, "augment")
    assert not shards.exists()


@pytest.mark.slow
def test_general_distillation_resumes_after_kill(project):
    kill_then_resume(project, "general_distillation", "micro",
                     lambda: _checkpoint_in(project / "models/general/micro/checkpoints"))
    assert_same_as_uninterrupted(project, "general_distillation")


@pytest.mark.slow
def test_task_distillation_resumes_inside_the_grid(project):
    """Killed in the grid's second run: step 1 and the first run are kept, the second continues from its checkpoint."""
    student = project / "models/students/micro-demo"
    console = kill_then_resume(project, "task_distillation", "micro:demo",
                               lambda: _checkpoint_in(student / "grid/lr0.002-bs32/checkpoints"))
    assert "models/students/micro-demo/grid" in console and "models/students/micro-demo/intermediate" in console
    assert_same_as_uninterrupted(project, "task_distillation")


@pytest.mark.slow
def test_a_killed_flow_skips_every_completed_stage(tmp_path):
    """kill -9 the whole flow (and its Prefect server) once some stages are done: the re-run says `cached` once for
    each completed stage and runs the rest."""
    params = {**ONE_STUDENT, "augment": {"enabled": False}, "registry": {"enabled": False}}
    project = make_project(tmp_path, params, dvc_yaml=False)
    stamps = project / ".prefect" / "stamps"
    proc = subprocess.Popen([sys.executable, "-m", "flows.pipeline"], cwd=project, env=env_for(project),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (stamps / "finetune_teacher@demo").is_file():
            assert proc.poll() is None, f"the flow ended (exit {proc.returncode}) before the test could kill it"
            assert time.monotonic() < deadline, "no stage completed"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    completed = {p.name for p in stamps.iterdir() if "." not in p.name}  # not the `.started` of the killed stage
    assert "finetune_teacher@demo" in completed and "report@-" not in completed
    console = run([sys.executable, "-m", "flows.pipeline"], project).stdout
    for stamp in sorted(completed):
        name, item = stamp.split("@")
        label = name if item == "-" else f"{name}[{item}]"
        assert console.count(f"{label}: cached") == 1 and f"{label}: started" not in console, console
    assert "task_distillation[micro:demo]: started" in console and "report: done in" in console
    # general distillation runs beside the teacher's fine-tuning: it ran now unless it had finished before the kill
    assert ("general_distillation[micro]: started" in console) != ("general_distillation@micro" in completed), console
