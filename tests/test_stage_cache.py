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


def _slower(params):
    """The params with the teacher's fine-tuning learning rate changed."""
    return params.model_copy(update={"teacher_finetune": params.teacher_finetune.model_copy(
        update={"learning_rate": 1e-5})})


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
              params=lambda p, i: {"teacher_finetune": p.teacher_finetune.model_dump()})
    base = stage_key(s, params, "demo")
    assert stage_key(s, params, "demo") == base
    assert stage_key(s, params, "other") != base
    changed = _slower(params)
    assert stage_key(s, changed, "demo") != base
    unrelated = params.model_copy(update={"augment": params.augment.model_copy(update={"k": 3})})
    assert stage_key(s, unrelated, "demo") == base
    dep.write_text("new data")
    assert stage_key(s, params, "demo") != base


def test_fresh_only_when_outputs_exist_and_were_made_by_this_key(tmp_path, params, monkeypatch):
    monkeypatch.setattr(stage_mod, "STAMPS", tmp_path / "stamps")
    out = tmp_path / "out.txt"

    def body(p, i):
        out.write_text(str(p.teacher_finetune.learning_rate))
        return {}

    s = Stage("toy", run=body, deps=lambda p, i: [], outs=lambda p, i: [out],
              params=lambda p, i: {"learning_rate": p.teacher_finetune.learning_rate})
    assert not is_fresh(s, params, None)
    run_stage(s, params, None)
    assert is_fresh(s, params, None)
    other = _slower(params)
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


def _toy(tmp_path, monkeypatch, body=None):
    from tasks import execute as execute_mod

    monkeypatch.setattr(stage_mod, "STAMPS", tmp_path / "stamps")
    monkeypatch.setattr(execute_mod, "STAMPS", tmp_path / "stamps")
    out = tmp_path / "run" / "model"
    calls = []

    def default(p, i):
        calls.append(p.teacher_finetune.learning_rate)
        out.mkdir(parents=True, exist_ok=True)
        (out / "weights.txt").write_text(str(p.teacher_finetune.learning_rate))
        return {}

    s = Stage("toy", run=body or default, deps=lambda p, i: [], outs=lambda p, i: [out],
              params=lambda p, i: {"learning_rate": p.teacher_finetune.learning_rate})
    return s, out, calls


def test_a_modified_output_is_stale(tmp_path, params, monkeypatch):
    s, out, _ = _toy(tmp_path, monkeypatch)
    run_stage(s, params, None)
    assert is_fresh(s, params, None)
    (out / "weights.txt").write_text("edited by hand")
    assert not is_fresh(s, params, None)
    run_stage(s, params, None)
    assert is_fresh(s, params, None)
    (out / "extra.bin").write_text("a file the stage did not write")
    assert not is_fresh(s, params, None)


def test_execute_skips_a_fresh_stage_and_says_one_line(tmp_path, params, monkeypatch, capsys):
    from tasks import execute as execute_mod

    monkeypatch.setattr(execute_mod.tracking, "run", lambda *a, **k: __import__("contextlib").nullcontext())
    monkeypatch.setattr(execute_mod.tracking, "log_result", lambda result, untracked=None: None)
    s, out, calls = _toy(tmp_path, monkeypatch)
    execute_mod.execute(s, params)
    assert execute_mod.execute(s, params)["cached"] is True
    assert len(calls) == 1  # the second call ran nothing (e.g. `dvc repro` after the Prefect flow)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "toy: started" and lines[1].startswith("toy: done in ") and lines[2] == "toy: cached"


def test_a_killed_run_leaves_nothing_that_misleads_the_next(tmp_path, params, monkeypatch):
    """Leftover temp files are removed; checkpoints resume only under the key that wrote them."""
    from tasks import execute as execute_mod

    s, out, _ = _toy(tmp_path, monkeypatch)
    ckpt = out.parent / "checkpoints" / "checkpoint-10"
    finished = out.parent / "grid" / "lr0.001-bs32" / "model"  # a finished step of the stage (e.g. a grid run)
    ckpt.mkdir(parents=True)
    leftover = out.parent / ".model.abc123.tmp"
    leftover.mkdir()
    execute_mod.prepare(s, params, None)  # the run that gets killed: no .started before, so no checkpoint is trusted
    assert not ckpt.exists() and not leftover.exists()
    ckpt.mkdir(parents=True)  # ... it writes a checkpoint and finishes a step, then dies
    finished.mkdir(parents=True)
    kept = execute_mod.prepare(s, params, None)  # same params, code and inputs: resume
    assert ckpt.is_dir() and finished.is_dir() and set(kept) == {out.parent / "checkpoints", out.parent / "grid"}
    other = _slower(params)
    assert execute_mod.prepare(s, other, None) == []  # changed learning rate: nothing old may be resumed
    assert not ckpt.exists() and not finished.exists()
    from tasks.stage import skipped, write_skipped

    write_skipped([out], "not supported yet")  # an earlier run skipped it; this one writes it
    execute_mod.prepare(s, other, None)
    assert skipped(out) is None


def test_every_stage_depends_on_the_code_that_holds_its_defaults(params):
    """Defaults live in distillery/config.py: editing one must rerun the stages in the flow and in `dvc repro`."""
    from flows.stages import STAGES

    for name, st in STAGES.items():
        assert "distillery/config.py" in st.code, name


def test_a_failed_run_leaves_the_earlier_good_run_fresh(tmp_path, params, monkeypatch):
    """A run that fails (its outputs are written atomically, so they are the earlier run's) keeps the earlier stamp:
    going back to the params of the good run finds it fresh instead of redoing it; the failed key is never fresh."""
    monkeypatch.setattr(stage_mod, "STAMPS", tmp_path / "stamps")
    out = tmp_path / "out.txt"

    def body(p, i):
        if p.teacher_finetune.learning_rate < 1e-4:
            raise RuntimeError("bad input")
        out.write_text(str(p.teacher_finetune.learning_rate))
        return {}

    s = Stage("toy", run=body, deps=lambda p, i: [], outs=lambda p, i: [out],
              params=lambda p, i: {"learning_rate": p.teacher_finetune.learning_rate})
    run_stage(s, params, None)
    failing = _slower(params)
    with pytest.raises(RuntimeError):
        run_stage(s, failing, None)
    assert is_fresh(s, params, None) and not is_fresh(s, failing, None)


def test_a_moved_or_copied_clone_keeps_its_cache(tmp_path, monkeypatch):
    """Stage keys and stamps hold paths relative to the project root: the same inputs under another root are the same
    key; a path outside the project (../shared data) is held as given."""
    from distillery.config import parse_params
    from tasks import stage as st

    shape = {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32}
    p = parse_params({"teacher": {"init": "scratch", "shape": shape},
                      "students": {"s": {"recipe": "tinybert", "shape": shape}}})
    outside = tmp_path / "shared.txt"
    outside.write_text("data")
    keys = []
    for root in (tmp_path / "clone-a", tmp_path / "moved" / "clone-b"):
        (root / "data").mkdir(parents=True)
        (root / "data" / "x.txt").write_text("the same bytes")
        monkeypatch.setattr(st, "ROOT", root)
        probe = st.Stage("probe", lambda q, i: {}, deps=lambda q, i, r=root: [r / "data" / "x.txt", outside],
                         outs=lambda q, i: [], params=lambda q, i: {})
        keys.append(st.stage_key(probe, p, None))
        assert st.project_relative(root / "data" / "x.txt") == "data/x.txt"
        assert st.project_relative(outside) == str(outside)
    assert keys[0] == keys[1]
