"""Inputs that can change, fingerprinted: a teacher from the MLflow registry by alias, a Hub teacher by the revision
it resolves to. (A task of your own over its life, run by a Prefect worker, its champion served over HTTP, each run's
change report and the fair promotion: tests/test_scale_out.py.)"""

from __future__ import annotations

import json

import pytest

from helpers import ONE_STUDENT


def test_a_registered_teacher_resolves_to_the_version_its_alias_names(tmp_path, monkeypatch):
    """`models:/<name>@<alias>` in params: the version the alias points at, its files in models/registered/; a new
    version is a new directory (a new content hash for the stage keys); a reference to nothing is one clear error."""
    import mlflow
    import transformers

    from distillery.preflight import load_params
    from distillery.errors import UserError
    from tasks import paths, registered

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
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


def test_registering_a_teacher_without_a_prefect_server_says_no_event_was_emitted(tmp_path, monkeypatch, capsys):
    """`python -m flows.teacher register DIR --name NAME` with no PREFECT_API_URL: a new version under the alias, one
    line saying no event was emitted; a directory that is not there: exit 2, one line naming it, nothing registered."""
    import mlflow
    import transformers

    import flows.teacher
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    cfg = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path / "teacher")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert flows.teacher.main(["register", str(tmp_path / "teacher"), "--name", "tiny", "--alias", "nightly"]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert out[-1] == ("registered teacher tiny version 1 (@nightly): models:/tiny@nightly; no Prefect server "
                           "(PREFECT_API_URL): no event emitted")
        assert flows.teacher.main(["register", str(tmp_path / "nope"), "--name", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == f"error: {tmp_path / 'nope'}: no such model directory", err
    client = mlflow.MlflowClient()
    assert [str(v.version) for v in client.search_model_versions("name = 'tiny'")] == ["1"]
    assert str(client.get_model_version_by_alias("tiny", "nightly").version) == "1"
