"""An offline GPU machine with torch and transformers only: the inputs bundle (benchmarks.gpu_bundle) and the untracked
run of every stage (`DISTILLERY_TRACKING=off python -m flows.stage all`) with MLflow, Prefect and DVC not importable."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import ONE_STUDENT, classifier, env_for, make_project, tokenizer
from safetensors.torch import load_file

from benchmarks import gpu_bundle
from distillery.errors import UserError

#: Runs flows.stage as `python -m flows.stage`, in a Python where these packages cannot be imported.
WITHOUT_PIPELINE = ("import runpy, sys; sys.modules.update(dict.fromkeys(('mlflow', 'prefect', 'dvc')));"
                    "sys.argv[0] = 'flows.stage'; runpy.run_module('flows.stage', run_name='__main__')")


def test_every_stage_runs_untracked_without_mlflow_prefect_or_dvc(tmp_path):
    project = make_project(tmp_path / "p", ONE_STUDENT, dvc_yaml=False)
    env = {**env_for(project), "DISTILLERY_TRACKING": "off"}

    def stage(*args):
        return subprocess.run([sys.executable, "-c", WITHOUT_PIPELINE, *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=600)

    done = stage("all")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "register[micro:demo]: left out (DISTILLERY_TRACKING=off)" in done.stdout
    for name in ("prepare_corpus", "finetune_teacher[demo]", "augment[demo]", "general_distillation[micro]",
                 "task_distillation[micro:demo]", "evaluate[demo]", "report"):
        assert f"{name}: done in" in done.stdout, done.stdout
    summary = json.loads((project / "metrics" / "summary.json").read_text())
    assert summary["demo"]["micro"]["accuracy"] > 0
    assert not (project / "mlflow.db").exists() and not (project / "mlruns").exists()

    again = stage("all")  # every stage is fresh: cached, nothing trained
    assert again.returncode == 0 and "started" not in again.stdout and "report: cached" in again.stdout

    refused = stage("register", "--item", "micro:demo")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: the register stage needs MLflow, and tracking is off (DISTILLERY_TRACKING=off): unset it"]


@pytest.fixture
def beside(tmp_path):
    """A project whose params read a teacher, a corpus and word vectors from `../shared`, as the gpu preset does."""
    project, shared = tmp_path / "here" / "project", tmp_path / "here" / "shared"
    teacher = shared / "models" / "teacher"
    teacher.mkdir(parents=True)
    classifier(vocab_size=len(tokenizer(teacher)), layers=2).save_pretrained(teacher)
    (shared / "corpus").mkdir(parents=True)
    (shared / "corpus" / "a.txt").write_text("a film . the film is good .\n" * 50)
    (shared / "vectors.txt").write_text("film 0.1 0.2\ngood 0.3 -0.4\n")
    params = {**ONE_STUDENT, "teacher": {"init": "pretrained", "name_or_path": "../shared/models/teacher"},
              "corpus": {"source": "files", "paths": ["../shared/corpus"]},
              "word_vectors": {"source": "file", "path": "../shared/vectors.txt"}}
    project.mkdir(parents=True)
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    return project


def test_bundle_carries_the_inputs_beside_the_project_and_unpacks_float32(beside, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(beside)
    out = tmp_path / "bundle"
    manifest = gpu_bundle.pack("params.yaml", out, wheels=False, root=beside)
    weights = "shared/models/teacher/model.safetensors"
    assert {weights, "shared/models/teacher/config.json", "shared/corpus/a.txt", "shared/vectors.txt"} <= set(
        manifest["files"])
    assert "of 64 (float16 weights: largest relative change" in capsys.readouterr().out

    there = tmp_path / "there" / "project"
    there.mkdir(parents=True)
    gpu_bundle.unpack(out, install=False, root=there)
    for name in manifest["files"]:
        if name != weights:
            assert (there.parent / name).read_bytes() == (beside.parent / name).read_bytes()
    original, restored = load_file(beside.parent / weights), load_file(there.parent / weights)
    assert restored.keys() == original.keys() and set(manifest["files"][weights]["float16"]) == {
        k for k, v in original.items() if v.dtype == torch.float32}
    worst = 0.0
    for k, v in original.items():
        assert restored[k].dtype == v.dtype
        if v.dtype == torch.float32:  # rounded to float16's 11 significant bits, relative to the tensor's largest
            worst = max(worst, ((restored[k] - v).abs().max() / v.abs().max()).item())
        else:
            assert torch.equal(restored[k], v)
    assert 0 < worst <= 2**-11 and worst == pytest.approx(manifest["files"][weights]["max_rel_change"])

    (there.parent / weights).write_bytes(b"kept")  # a second unpack never writes over what is there
    gpu_bundle.unpack(out, install=False, root=there)
    assert (there.parent / weights).read_bytes() == b"kept" and "already there, kept" in capsys.readouterr().out


def test_bundle_refuses_what_does_not_fit_or_lies_elsewhere(beside, tmp_path, monkeypatch):
    monkeypatch.chdir(beside)
    with pytest.raises(UserError, match=r"inputs [\d.]+ MiB, wheels 0.0 MiB, project 0.0 MiB: [\d.]+ MiB is over the "
                                        r"0.01 MiB one call carries"):
        gpu_bundle.pack("params.yaml", tmp_path / "bundle", limit_mib=0.01, wheels=False, root=beside)
    far = tmp_path / "far.txt"
    far.write_text("film 0.1 0.2\n")
    params = yaml.safe_load((beside / "params.yaml").read_text())
    params["word_vectors"]["path"] = str(far)
    (beside / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(UserError, match=f"{far} not beside the project"):
        gpu_bundle.pack("params.yaml", tmp_path / "bundle", wheels=False, root=beside)


def test_the_flow_refuses_to_run_untracked_and_names_what_runs(monkeypatch, capsys):
    from flows import pipeline

    monkeypatch.setenv("DISTILLERY_TRACKING", "off")
    result = pipeline._pipeline("params.yaml")  # the flow's body: stopped before any stage or MLflow run
    assert result["stopped"] == ["the pipeline needs MLflow, and tracking is off (DISTILLERY_TRACKING=off): unset it, "
                                 "or run its stages untracked with `python -m flows.stage all`"]
    assert "error: the pipeline needs MLflow" in capsys.readouterr().err
