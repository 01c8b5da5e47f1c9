"""Content-addressed stage keys: what changes a key, and when a cached result may be reused."""

import yaml
from pathlib import Path

import pytest

from distillery.config import parse_params
from tasks import stage as stage_mod
from tasks.stage import Stage, fingerprint, is_fresh, run_stage, stage_key

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def params():
    return parse_params(yaml.safe_load((ROOT / "params.yaml").read_text()))


def test_fingerprint_is_content_not_name(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "x.txt").write_text("same")
    assert fingerprint(a) == fingerprint(b)
    (b / "x.txt").write_text("other")
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(tmp_path / "missing") == "missing"


def test_key_depends_on_the_params_that_matter_only(tmp_path, params):
    dep = tmp_path / "in.txt"
    dep.write_text("data")
    s = Stage("finetune_x", run=lambda p, i: {}, deps=lambda p, i: [dep], outs=lambda p, i: [],
              params=lambda p, i: {"finetune": p.finetune.model_dump()})
    base = stage_key(s, params, "demo")
    assert stage_key(s, params, "demo") == base
    assert stage_key(s, params, "other") != base
    changed = params.model_copy(update={"finetune": params.finetune.model_copy(update={"lr": 1e-5})})
    assert stage_key(s, changed, "demo") != base
    unrelated = params.model_copy(update={"augment": params.augment.model_copy(update={"k": 3})})
    assert stage_key(s, unrelated, "demo") == base
    dep.write_text("new data")
    assert stage_key(s, params, "demo") != base


def test_fresh_only_when_outputs_exist_and_were_made_by_this_key(tmp_path, params, monkeypatch):
    monkeypatch.setattr(stage_mod, "STAMPS", tmp_path / "stamps")
    out = tmp_path / "out.txt"

    def body(p, i):
        out.write_text(str(p.finetune.lr))
        return {}

    s = Stage("toy", run=body, deps=lambda p, i: [], outs=lambda p, i: [out],
              params=lambda p, i: {"lr": p.finetune.lr})
    assert not is_fresh(s, params, None)
    run_stage(s, params, None)
    assert is_fresh(s, params, None)
    other = params.model_copy(update={"finetune": params.finetune.model_copy(update={"lr": 1e-5})})
    assert not is_fresh(s, other, None)  # output was written under the other params
    run_stage(s, other, None)
    assert not is_fresh(s, params, None) and is_fresh(s, other, None)
    out.unlink()
    assert not is_fresh(s, other, None)


def test_every_stage_declares_its_dependencies(params):
    from flows.stages import STAGES, items

    for name, st in STAGES.items():
        for item in items(name, params):
            assert st.outs(params, item), name
            stage_key(st, params, item)  # computable before anything ran


def test_code_version_is_per_stage(params):
    from flows.stages import STAGES

    assert stage_mod.code_version(STAGES["register"].code) != stage_mod.code_version(STAGES["report"].code)
