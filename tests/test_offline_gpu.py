"""An offline GPU machine with torch and transformers only: the inputs bundle (benchmarks.gpu_bundle) and the untracked
run of every stage (`DISTILLERY_TRACKING=off python -m flows.stage all`) with MLflow, Prefect and DVC not importable."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

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

    first = stage("task_distillation", "--item", "micro:demo", "--upstream")  # that stage and all it needs, no more
    assert first.returncode == 0, first.stderr[-3000:]
    made = ("prepare_corpus", "finetune_teacher[demo]", "augment[demo]", "general_distillation[micro]",
            "task_distillation[micro:demo]")
    for name in made:
        assert f"{name}: done in" in first.stdout, first.stdout
    assert first.stdout.index("general_distillation[micro]") < first.stdout.index("task_distillation[micro:demo]")
    assert "evaluate" not in first.stdout and "baseline" not in first.stdout
    done = stage("all")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "register[micro:demo]: left out (DISTILLERY_TRACKING=off)" in done.stdout
    for name in made:
        assert f"{name}: cached" in done.stdout, done.stdout
    for name in ("evaluate[demo]", "report"):
        assert f"{name}: done in" in done.stdout, done.stdout
    summary = json.loads((project / "metrics" / "summary.json").read_text())
    assert summary["demo"]["micro"]["accuracy"] > 0
    assert not (project / "mlflow.db").exists() and not (project / "mlruns").exists()

    again = stage("all")  # every stage is fresh: cached, nothing trained
    assert again.returncode == 0 and "started" not in again.stdout and "report: cached" in again.stdout


def test_register_untracked_is_refused_before_it_starts(tmp_path):
    project = make_project(tmp_path / "p", ONE_STUDENT, dvc_yaml=False)
    refused = subprocess.run([sys.executable, "-c", WITHOUT_PIPELINE, "register", "--item", "micro:demo"], cwd=project,
                             env={**env_for(project), "DISTILLERY_TRACKING": "off"}, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: the register stage needs MLflow, and tracking is off (DISTILLERY_TRACKING=off): unset it"]
    assert not (project / ".prefect" / "stamps").exists()  # no `.started` stamp: nothing began


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

    assert gpu_bundle.sha256(there.parent / weights) == manifest["files"][weights]["sha256"]
    original = (beside.parent / weights).read_bytes()  # laid out as the original: the same header, then the tensors
    assert (there.parent / weights).read_bytes()[:100] == original[:100] and (there.parent / weights).stat().st_size == len(original)

    (there.parent / weights).write_bytes(original)  # a file there with the original's (or the manifest's) sha256 is kept
    gpu_bundle.unpack(out, install=False, root=there)
    assert (there.parent / weights).read_bytes() == original and "0 files" in capsys.readouterr().out


WEIGHTS = "shared/models/teacher/model.safetensors"


@pytest.fixture
def bundle(beside, tmp_path, monkeypatch):
    """A bundle of `beside`'s inputs, and the files a complete unpack writes (relative path: bytes)."""
    monkeypatch.chdir(beside)
    manifest = gpu_bundle.pack("params.yaml", tmp_path / "bundle", wheels=False, root=beside)
    (tmp_path / "clean" / "project").mkdir(parents=True)
    gpu_bundle.unpack(tmp_path / "bundle", install=False, root=tmp_path / "clean" / "project")
    return tmp_path / "bundle", {n: (tmp_path / "clean" / n).read_bytes() for n in manifest["files"]}


def unpacked(there):
    """The files under `there`'s parent but a killed unpack's temporary directory."""
    return {n: q.read_bytes() for q in there.parent.rglob("*")
            if q.is_file() and not (n := str(q.relative_to(there.parent))).startswith(".gpu_bundle.")}


#: `unpack` in a child process killed (SIGKILL: nothing cleans up) as it extracts the weights, as it restores them to
#: float32, or once it has renamed one file into place.
KILLED_UNPACK = """
import os, shutil, sys, tarfile
from pathlib import Path
from benchmarks import gpu_bundle
def die(): os.kill(os.getpid(), 9)
at, bundle, root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if at == "extraction":
    makefile = tarfile.TarFile.makefile
    def partly(self, member, target):
        if target.endswith(".safetensors"):
            Path(target).write_bytes(b"half"); die()
        makefile(self, member, target)
    tarfile.TarFile.makefile = partly
elif at == "restore":
    def partly(path, *args):
        path.write_bytes(path.read_bytes()[:1000]); die()
    gpu_bundle.restore = partly
else:
    replace, renamed = os.replace, []
    def once(src, dst):
        if ".gpu_bundle." not in str(dst):  # not the restore's rename in the temporary directory
            die() if renamed else renamed.append(dst)
        replace(src, dst)
    os.replace = once
gpu_bundle.unpack(bundle, install=False, root=root)
"""


@pytest.mark.parametrize("at", ["extraction", "restore", "rename"])
def test_a_killed_unpack_run_again_writes_the_float32_weights_bit_for_bit(bundle, tmp_path, at):
    out, clean = bundle
    there = tmp_path / "there" / "project"
    there.mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", KILLED_UNPACK, at, str(out), str(there)], cwd=gpu_bundle.ROOT,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert [n for n, b in unpacked(there).items() if b != clean.get(n)] == []  # never a half-written or float16 file
    gpu_bundle.unpack(out, install=False, root=there)
    assert unpacked(there) == clean


def test_unpack_replaces_a_file_whose_sha256_is_not_the_manifests(bundle, tmp_path, capsys):
    out, clean = bundle
    there = tmp_path / "there" / "project"
    (there.parent / WEIGHTS).parent.mkdir(parents=True)
    there.mkdir()
    with tarfile.open(out / gpu_bundle.INPUTS) as tar:  # the float16 file an earlier unpack left (issue 38)
        (there.parent / WEIGHTS).write_bytes(tar.extractfile(WEIGHTS).read())
    gpu_bundle.unpack(out, install=False, root=there)
    assert unpacked(there) == clean

    (there.parent / WEIGHTS).unlink()
    (there.parent / WEIGHTS).mkdir()  # not a file: refused, nothing written
    with pytest.raises(UserError, match="model.safetensors: not a file, where the bundle has one; nothing was written"):
        gpu_bundle.unpack(out, install=False, root=there)


def rewrite_inputs(out, *extra: tarfile.TarInfo):
    """The bundle's inputs.tar.xz with `extra` members added."""
    path = out / gpu_bundle.INPUTS
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w:xz") as tar:
        for m, data in members + [(m, b"x" * m.size) for m in extra]:
            tar.addfile(m, io.BytesIO(data))


def member(name, *, link=None):
    m = tarfile.TarInfo(name)
    if link:
        m.type, m.linkname = tarfile.SYMTYPE, link
    else:
        m.size = 1
    return m


BAD_BUNDLES = {  # what is done to the bundle: the error line's end
    "truncated": (lambda out: (out / "inputs.tar.xz").write_bytes((out / "inputs.tar.xz").read_bytes()[:3000]),
                  "inputs.tar.xz: not a complete .tar.xz"),
    "missing": (lambda out: (out / "inputs.tar.xz").unlink(), "inputs.tar.xz: missing"),
    "not xz": (lambda out: (out / "inputs.tar.xz").write_text("film 0.1\n"), "inputs.tar.xz: not a complete .tar.xz"),
    "empty": (lambda out: (out / "inputs.tar.xz").write_bytes(b""), "inputs.tar.xz: not a complete .tar.xz"),
    "invalid json": (lambda out: (out / "manifest.json").write_text("{files"), "manifest.json: not valid JSON"),
    "a list": (lambda out: (out / "manifest.json").write_text("[]"), "manifest.json: not a bundle's manifest"),
    "dot-dot member": (lambda out: rewrite_inputs(out, member("../evil.txt")),
                       "inputs.tar.xz: member '../evil.txt' is not in the manifest; nothing was written"),
    "absolute symlink": (lambda out: rewrite_inputs(out, member("shared/link", link="/etc/passwd")),
                         "inputs.tar.xz: member 'shared/link' is a link; nothing was written"),
    "absolute member": (lambda out: rewrite_inputs(out, member("/tmp/evil.txt")),
                        "inputs.tar.xz: member '/tmp/evil.txt' is not in the manifest; nothing was written"),
}


def test_a_bad_bundle_is_one_error_line_and_nothing_written(bundle, tmp_path, monkeypatch, capsys):
    out, _ = bundle
    there = tmp_path / "there" / "project"
    there.mkdir(parents=True)
    monkeypatch.setattr(gpu_bundle, "ROOT", there)
    for case, (damage, message) in BAD_BUNDLES.items():
        bad = tmp_path / case.replace(" ", "-")
        shutil.copytree(out, bad)
        damage(bad)
        capsys.readouterr()
        assert gpu_bundle.main(["unpack", "--bundle", str(bad), "--no-install"]) == 2, case
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {bad}/") and message in err[0], (case, err)
        assert os.listdir(there.parent) == ["project"] and not os.listdir(there), case


def test_a_failed_pack_leaves_the_previous_bundle(bundle, beside, tmp_path, monkeypatch):
    out, _ = bundle
    before = {q.name: q.read_bytes() for q in out.iterdir() if q.is_file()}

    def offline(dest, python_version):
        raise UserError("pip download of datasets==4.0.0 for Python 3.12 failed: ERROR: No matching distribution")

    monkeypatch.setattr(gpu_bundle, "download_wheels", offline)
    with pytest.raises(UserError, match="pip download"):
        gpu_bundle.pack("params.yaml", out, root=beside)
    with pytest.raises(UserError, match="is over the 0.01 MiB one call carries"):
        gpu_bundle.pack("params.yaml", out, limit_mib=0.01, wheels=False, root=beside)
    assert {q.name: q.read_bytes() for q in out.iterdir() if q.is_file()} == before
    assert sorted(q.name for q in out.parent.iterdir()) == ["bundle", "clean", "here"]  # no temporary left beside it
    with pytest.raises(UserError, match="over the"):  # a refused first pack writes no --out
        gpu_bundle.pack("params.yaml", tmp_path / "new", limit_mib=0.01, wheels=False, root=beside)
    assert not (tmp_path / "new").exists()
    with pytest.raises(UserError, match="holds params.yaml, not a bundle; it is left as it is"):
        gpu_bundle.pack("params.yaml", beside, wheels=False, root=beside)


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


def test_a_teacher_float16_on_disk_while_its_config_says_float32_warns(beside, tmp_path):
    import warnings

    from distillery.models import load_teacher

    teacher = beside.parent / "shared" / "models" / "teacher"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # float32 on disk: not a word
        load_teacher(teacher, num_labels=2)
    gpu_bundle.halve(teacher / "model.safetensors", tmp_path / "half.safetensors")  # left halved, as by issue 38's unpack
    shutil.move(tmp_path / "half.safetensors", teacher / "model.safetensors")
    with pytest.warns(UserWarning, match=r"model.safetensors: \d+ tensors are half precision on disk while .*config.json "
                                         "expects float32: the teacher loads as half precision"):
        load_teacher(teacher, num_labels=2)
