"""dvc.yaml is generated from the stage declarations (`python -m flows.dvc`): committed == generated, DVC parses it,
and it follows the params (items, per-item deps, params keys)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from distillery.preflight import load_params
from flows import dvc as gen
from flows.stages import STAGES, items
from tasks.execute import curve_name
from tasks.distill import run_student_stage

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rendered() -> str:
    return gen.render(ROOT / "params.yaml")


def expected_stages(params_path: Path) -> dict[str, tuple[str, str | None]]:
    p = load_params(params_path)
    return {curve_name(st, item): (name, item) for name, st in STAGES.items() for item in items(name, p)}


def test_committed_dvc_yaml_is_generated(rendered):
    committed = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    assert committed == rendered, ("dvc.yaml differs from the stage declarations and params.yaml: "
                                   "run `python -m flows.dvc` and commit dvc.yaml")
    assert gen.main(["--check"]) == 0


def test_dvc_parses_every_stage_and_item(rendered, tmp_path):
    from dvc.repo import Repo

    (tmp_path / "dvc.yaml").write_text(rendered, encoding="utf-8")
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    Repo.init(str(tmp_path), no_scm=True).close()
    with Repo(str(tmp_path)) as repo:
        stages = {s.name: s for s in repo.index.stages}
        repo.index.check_graph()  # no overlapping outputs, no cycles
    expected = expected_stages(ROOT / "params.yaml")
    assert set(stages) == set(expected)
    p = load_params(ROOT / "params.yaml")
    for key, (name, item) in expected.items():
        st, stage = stages[key], STAGES[name]
        assert st.cmd == f"python -m flows.stage {name}" + (f" --item {item}" if item else "")
        deps = {str(d.def_path) for d in st.deps if not hasattr(d, "params")}
        assert set(stage.code) <= deps, f"{key}: deps lack the stage's code {set(stage.code) - deps}"
        assert {gen._rel(d) for d in stage.deps(p, item)} <= deps
        outs = {str(o.def_path) for o in st.outs}
        assert {gen._rel(o) for o in stage.outs(p, item)} <= outs
        if stage.curve:
            assert f"metrics/curves/{key}.csv" in outs


def test_params_keys_exist_in_the_params_file(rendered):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    for key, spec in yaml.safe_load(rendered)["stages"].items():
        for dotted in spec.get("params", []):
            assert gen._present(raw, dotted) == dotted, f"{key}: {dotted} is not in params.yaml (DVC would fail)"


def test_student_without_assistant_gets_no_teacher_assistant_stage(tmp_path):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    assistants = items("teacher_assistant", load_params(ROOT / "params.yaml"))
    assert assistants, "the demo params should have a student with a teacher assistant"
    student = assistants[0]
    raw["students"][student]["teacher_assistant"] = "off"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")

    stages = yaml.safe_load(gen.render(params))["stages"]
    assert f"teacher_assistant-{student}" not in stages
    general = stages[f"general_distillation-{student}"]
    assert f"models/assistant/{student}/model" not in general["deps"]
    assert set(stages) == set(expected_stages(params))
    # the stages run with that params file, and DVC tracks its keys
    assert general["cmd"].endswith(f"--params {gen._rel(params)}")
    assert general["params"] == [{gen._rel(params): ["seed", f"students.{student}", "general_distillation", "precision"]}]


def test_unmapped_params_key_is_an_error():
    with pytest.raises(ValueError, match="PARAM_KEYS"):
        gen.param_keys("some_stage", {"not_a_section": 1}, None, {})
    assert gen.param_keys("s", {"student": {}, "max_length": 32, "teacher": None}, "a:b",
                          {"students": {"a": {}}, "data": {"max_length": 32}, "teacher": {}}) == ["students.a", "data.max_length"]
    # a key left at its default (absent from the file) is tracked through its section: DVC fails on missing keys
    assert gen.param_keys("s", {"max_words": 10}, None, {"word_vectors": {"dim": 50}}) == ["word_vectors"]


def test_paths_are_relative_to_the_project_root():
    assert gen._rel(ROOT / "data" / "tasks" / "sst2") == "data/tasks/sst2"
    assert gen._rel(ROOT.parent / "shared" / "data" / "glue" / "SST-2") == "../shared/data/glue/SST-2"


def test_curve_stages_are_the_stages_that_return_a_curve():
    # the student stages (recipe bodies) all return their curve through tasks.distill.run_student_stage
    returns_curve = {name for name, st in STAGES.items()
                     if '"curve"' in inspect.getsource(st.run) or "run_student_stage(" in inspect.getsource(st.run)}
    assert '"curve"' in inspect.getsource(run_student_stage)
    assert returns_curve == {name for name, st in STAGES.items() if st.curve}


@pytest.mark.parametrize("preset", sorted(p.name for p in (ROOT / "params").glob("*.yaml")))
def test_every_preset_renders_with_keys_its_file_has(preset):
    """A preset's tasks (SQuAD's windows and length grouping too) render a dvc.yaml whose params keys the file has
    (else `python -m flows.pipeline --preset NAME` fails at its end, recording dvc.lock)."""
    path = ROOT / "params" / preset
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    from distillery.errors import InputNotFoundError

    try:
        stages = yaml.safe_load(gen.render(path))["stages"]
    except InputNotFoundError as exc:  # the paper preset's corpus and GloVe file are the user's
        pytest.skip(f"{preset}: {exc}")
    for key, spec in stages.items():
        for entry in spec.get("params", []):
            for dotted in next(iter(entry.values())) if isinstance(entry, dict) else [entry]:
                assert gen._present(raw, dotted) == dotted, f"{preset} {key}: {dotted}"


def test_the_flow_records_what_it_completed_in_dvc_lock(tmp_path, monkeypatch):
    """`flows.dvc.record` (the flow's last step in a DVC project): the stages that completed go into dvc.lock, the
    others do not; a run that completed every stage of dvc.yaml commits it as one target (DVC rewrites dvc.lock once
    per target: 31 targets took 18 s on the micro project, one 2 s); a dvc.yaml not generated for these params is
    left alone, with a line that says so."""
    import subprocess

    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True)
    stages = {"prepare_corpus": None, "prepare_task-demo": "demo"}
    spec = {name: {"cmd": f"echo {name} > {name}.txt", "outs": [f"{name}.txt"]} for name in stages}
    text = yaml.safe_dump({"stages": spec})
    (tmp_path / "dvc.yaml").write_text(text)
    for name in stages:
        (tmp_path / f"{name}.txt").write_text(name + "\n")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "render", lambda params_path: text)
    commands, real_run = [], subprocess.run

    def recorded(cmd, **kwargs):
        commands.append(cmd[cmd.index("commit"):])
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(subprocess, "run", recorded)

    def locked() -> set[str]:
        return set(yaml.safe_load((tmp_path / "dvc.lock").read_text())["stages"])

    assert gen.record("params.yaml", [("prepare_corpus", None)]) is None
    assert locked() == {"prepare_corpus"} and commands[-1][-1] == "prepare_corpus"
    assert gen.record("params.yaml", [("prepare_corpus", None), ("prepare_task", "demo")]) is None
    assert locked() == set(stages) and commands[-1][-1] == "dvc.yaml"
    monkeypatch.setattr(gen, "render", lambda params_path: text + "# another params file\n")
    assert gen.record("params.yaml", [("prepare_corpus", None)]).startswith("dvc.lock not updated: dvc.yaml is not")
    assert len(commands) == 2
