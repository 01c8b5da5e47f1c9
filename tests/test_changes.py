"""A task of your own over its life: its champion served over HTTP; each later run compares itself with the last
(reports/changes.md, one console line), re-runs only what changed, and promotes a challenger only over a champion
measured on the same dev data; a teacher from the MLflow registry by alias."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import ONE_STUDENT, make_project, reviews, run, stage_lines


def _changes(project) -> str:
    return (project / "reports" / "changes.md").read_text()


def _line(console: str) -> str:
    return next(line for line in stage_lines(console) if line.startswith("changes: "))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A task of your own (the demo task as a CSV with string labels) through one run: (project, its console)."""
    tmp = tmp_path_factory.mktemp("changes")
    (tmp / "reviews").mkdir()
    params = {**ONE_STUDENT,  # augmentation on: a task of your own is augmented as a GLUE one
              "data": {**ONE_STUDENT["data"], "tasks": ["reviews"], "custom": {"reviews": reviews(tmp / "reviews")}}}
    project = make_project(tmp / "project", params, dvc_yaml=False)
    return project, run([sys.executable, "-m", "flows.stage", "all"], project).stdout


def _registry(project) -> dict:
    return json.loads((project / "metrics" / "registry" / "micro-reviews.json").read_text())


@pytest.mark.xdist_group("changes")
def test_a_custom_tasks_champion_answers_a_raw_text_with_a_label_name_over_http(project):
    """A task of your own (a CSV with string labels) through the pipeline to the registry; `mlflow models serve` of
    its champion on 127.0.0.1 answers a raw sentence with one of the task's label names."""
    import os
    import signal
    import socket
    import subprocess
    import time

    import httpx

    from helpers import env_for

    project, _ = project
    # no direct baseline here: the first version is the champion (and stays it through the other test's runs)
    assert _registry(project)["champion"]["version"] == 1

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**env_for(project), "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"}
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/micro-reviews@champion",
                               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)], cwd=project, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "mlflow models serve did not answer /ping in 3 minutes"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        answer = httpx.post(f"http://127.0.0.1:{port}/invocations", timeout=60,
                            json={"dataframe_records": [{"text": "the movie was truly wonderful"},
                                                        {"text": "the plot was awful"}]})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert len(predictions) == 2 and all(p["label"] in ("pan", "praise") and 0.0 <= p["score"] <= 1.0
                                         for p in predictions), predictions


@pytest.mark.xdist_group("changes")
def test_a_run_says_what_changed_reruns_only_that_and_compares_champions_on_the_same_data(project):
    project, first = project
    all_ = [sys.executable, "-m", "flows.stage", "all"]
    assert _line(first).startswith("changes: First run")
    augmented = (project / "data" / "augmented" / "reviews.tsv").read_text().splitlines()
    # ONE_STUDENT augments its first 40 training rows: they and their variants
    assert len(augmented) - 1 > 40 and "augment[reviews]: done in" in first
    assert _registry(project)["alias"] == "champion"

    # (a) nothing changed: every stage cached, one line says so
    again = run(all_, project).stdout
    assert _line(again).startswith("changes: No change since the last run")
    assert "started" not in again and _changes(project).count("\n") <= 3

    # (b) rows appended to the training file: that task's stages run again; the report says what and how much
    train = project.parent / "reviews" / "train.csv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join(lines + ["the script was truly wonderful,praise", "the acting was dull,pan",
                                        "the ending felt so lovely,praise"]) + "\n")
    changed = run(all_, project).stdout
    assert _line(changed) == "changes: reports/changes.md (inputs, rows, params, stages, champions)"
    report = _changes(project)
    assert "`reviews` train: 3 rows added, 0 removed (200 -> 203)" in report
    assert f"`{train}`" in report  # the input file, old -> new hash
    ran = next(line for line in report.splitlines() if line.startswith("- ran ("))
    assert "prepare_task[reviews]" in ran and "finetune_teacher[reviews]" in ran and "augment[reviews]" in ran
    assert "prepare_corpus" not in ran and "word_vectors" not in ran
    assert "| micro-reviews | v1 " in report

    # (c) a challenger that cannot beat the champion by the margin: the champion stays, the version says why
    params = project / "params.yaml"
    params.write_text(params.read_text() + "registry: {promote_margin: 1.0}\n")
    dev = project.parent / "reviews" / "dev.csv"
    dev.write_text("\n".join(dev.read_text().splitlines()[:-10]) + "\n")  # and the dev split changes
    run(all_, project)
    record = _registry(project)
    assert record["alias"] == "candidate" and not record["promoted"] and record["champion"]["version"] == 1
    # the old champion was measured on the new dev split before the comparison
    assert record["reason"].startswith("the task data changed since the champion (version 1) was registered: "
                                       "re-evaluated on the new dev split")
    assert "does not beat the champion (version 1)" in record["reason"]
    report = _changes(project)
    assert "`reviews` dev: 0 rows added, 10 removed (60 -> 50)" in report
    assert "`registry.promote_margin`: 0.0 -> 1.0" in report
    assert "re-evaluated on the new dev split" in report


def test_a_registered_teacher_resolves_to_the_version_its_alias_names(tmp_path, monkeypatch):
    """`models:/<name>@<alias>` in params: the version the alias points at, its files in models/registered/; a new
    version is a new directory (a new content hash for the stage keys); a reference to nothing is one clear error."""
    import mlflow
    import transformers

    from distillery.config import load_params
    from distillery.errors import UserError
    from tasks import paths, registered

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(paths, "MODELS", tmp_path / "models")
    registered.resolve_registered.cache_clear()
    for width in (16, 32):
        cfg = transformers.BertConfig(vocab_size=40, hidden_size=width, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=32)
        transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path / f"teacher-{width}")
    assert registered.register_teacher(tmp_path / "teacher-16", "tiny") == 1
    first = registered.resolve_registered("models:/tiny@champion")
    assert first == tmp_path / "models" / "registered" / "tiny" / "v1" and (first / "config.json").is_file()
    params = {**ONE_STUDENT, "teacher": {"init": "pretrained", "name_or_path": "models:/tiny@champion"},
              "pretrain": {"enabled": False}, "augment": {"enabled": False}}
    (tmp_path / "params.yaml").write_text(__import__("yaml").safe_dump(params))
    assert load_params(tmp_path / "params.yaml", inputs=True, root=tmp_path).teacher.name_or_path.startswith("models:/")

    assert registered.register_teacher(tmp_path / "teacher-32", "tiny") == 2
    assert registered.resolve_registered("models:/tiny@champion") == first  # one run, one version
    registered.resolve_registered.cache_clear()  # the next run
    second = registered.resolve_registered("models:/tiny@champion")
    assert second.name == "v2" and json.loads((second / "config.json").read_text())["hidden_size"] == 32
    assert registered.resolve_registered("models:/tiny/1") == first
    with pytest.raises(UserError, match="models:/tiny@nightly: no such registered model version"):
        registered.resolve_registered("models:/tiny@nightly")
    with pytest.raises(UserError, match="not a registered model reference"):
        registered.resolve_registered("models:/a/b/c")


def test_a_hub_teacher_is_keyed_by_the_revision_it_resolves_to(tmp_path, monkeypatch):
    """Offline, a Hub id resolves to the cached revision's files (what refs/main names); when the cache moves to a new
    revision, the stages that read the teacher get new keys; an uncached id stays a name (no dependency)."""
    import huggingface_hub.constants
    import transformers

    from distillery.config import parse_params
    from tasks import teacher
    from tasks.stage import stage_key

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = cache / "models--org--tiny"
    for revision, width in (("a" * 40, 16), ("b" * 40, 32)):
        cfg = transformers.BertConfig(vocab_size=40, hidden_size=width, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32)
        transformers.BertForMaskedLM(cfg).save_pretrained(repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    p = parse_params({**ONE_STUDENT, "teacher": {"init": "pretrained", "name_or_path": "org/tiny"},
                      "augment": {"enabled": False}})
    keys = []
    for revision in ("a" * 40, "b" * 40):
        (repo / "refs" / "main").write_text(revision)
        teacher.hub_snapshot.cache_clear()
        assert teacher.teacher_name(p) == str(repo / "snapshots" / revision)
        assert teacher.PRETRAIN.deps(p, None)[-1] == repo / "snapshots" / revision
        keys.append(stage_key(teacher.PRETRAIN, p, None))
    assert keys[0] != keys[1]
    teacher.hub_snapshot.cache_clear()
    assert teacher.model_ref("org/not-cached") == "org/not-cached"
