"""params.yaml validation: every problem is caught before any work, with the file and key named."""

from pathlib import Path

import pytest
import yaml

from distillery.config import ConfigError, parse_params
from distillery.preflight import load_params

ROOT = Path(__file__).resolve().parents[1]


def demo() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


@pytest.mark.parametrize("name", ["params.yaml"] + sorted(f"params/{p.name}" for p in (ROOT / "params").glob("*.yaml")))
def test_shipped_params_files_validate(name):
    p = load_params(ROOT / name)
    assert p.students and p.data.tasks


def test_the_squad_recipes_run_shares_the_squad_presets_teacher():
    """The extra run's rows sit beside the preset's TinyBERT rows: same data, teacher and teacher schedule (and so, in
    one clone, the same cached teacher)."""
    squad, extra = (yaml.safe_load((ROOT / "params" / f"{n}.yaml").read_text()) for n in ("squad", "squad-recipes"))
    for section in ("seed", "data", "teacher", "teacher_finetune", "augment", "evaluation"):
        assert extra[section] == squad[section], section
    assert {r["recipe"] for r in extra["students"].values()} == {"minilm", "distilbert", "mobilebert", "pkd"}


def test_the_gpu_recipes_run_keeps_the_cpu_runs_it_is_compared_with():
    """docs/squad.md sets its rows beside the CPU ones: squad-recipes' data, teacher and schedules, its students but
    MobileBERT (a larger pre-training budget and the extra step; beside it the same with the teacher's embedding
    width), the squad preset's TinyBERT student."""
    squad, cpu, gpu = (yaml.safe_load((ROOT / "params" / f"{n}.yaml").read_text())
                       for n in ("squad", "squad-recipes", "gpu-recipes"))
    for section in ("seed", "data", "teacher", "teacher_finetune", "augment", "task_distillation"):
        assert gpu[section] == cpu[section], section
    mobilebert = {**cpu["students"]["mobilebert-l6"], "transfer_epochs": 4, "task_distillation": True}
    e384 = {**mobilebert, "shape": {**mobilebert["shape"], "embedding": 384}, "ib_teacher": {"epochs": 1}}
    assert gpu["students"] == {"tinybert-l4": squad["students"]["tinybert-l4"], **cpu["students"],
                               "mobilebert-l6": {**mobilebert, "ib_teacher": {"epochs": 2}}, "mobilebert-l6-e384": e384}


def test_the_five_recipes_run_shares_the_local_presets_teacher_and_student():
    """Its TinyBERT row is the local preset's (one cache in one clone); the other four recipes sit beside it."""
    local, five = (yaml.safe_load((ROOT / "params" / f"{n}.yaml").read_text()) for n in ("local", "local-recipes"))
    for section in ("seed", "corpus", "teacher", "pretrain", "teacher_finetune", "word_vectors", "augment",
                    "evaluation", "per_task"):
        assert five[section] == local[section], section
    assert {k: v for k, v in five["data"].items() if k != "tasks"} == {k: v for k, v in local["data"].items()
                                                                        if k != "tasks"}
    assert five["students"]["tinybert-l3"] == local["students"]["minilm-l3"]
    assert five["task_distillation"] == local["task_distillation"]
    assert sorted(r["recipe"] for r in five["students"].values()) == ["distilbert", "minilm", "mobilebert", "pkd",
                                                                       "tinybert"]


def test_unknown_key_is_named():
    data = demo()
    data["teacher_finetune"]["rate"] = 1e-4
    with pytest.raises(ConfigError, match=r"params.yaml: teacher_finetune.rate: unknown key$"):
        parse_params(data)


def test_a_renamed_key_says_its_new_name():
    """An older params file (`finetune:`, `lr`, `lrs`) gets the key's new name; `finetune` means the teacher's section
    only where a section stood (top level, per task), never inside a student."""
    data = demo()
    data["finetune"] = data.pop("teacher_finetune")
    data["general_distillation"]["lr"] = data["general_distillation"].pop("learning_rate")
    data["task_distillation"]["prediction"]["lrs"] = data["task_distillation"]["prediction"].pop("learning_rates")
    data["per_task"] = {"demo": {"finetune": {"epochs": 1}}}
    with pytest.raises(ConfigError) as err:
        parse_params(data)
    assert set(str(err.value).splitlines()) == {
        "params.yaml: finetune: unknown key (now `teacher_finetune`)",
        "params.yaml: general_distillation.lr: unknown key (now `learning_rate`)",
        "params.yaml: task_distillation.prediction.lrs: unknown key (now `learning_rates`)",
        "params.yaml: per_task.demo.finetune: unknown key (now `teacher_finetune`)"}
    data = demo()
    data["students"]["tinybert-demo"]["finetune"] = {}
    with pytest.raises(ConfigError, match=r"students.tinybert-demo.finetune: unknown key$"):
        parse_params(data)


def test_unknown_section_is_named():
    data = demo()
    data["distil"] = {}
    with pytest.raises(ConfigError, match=r"distil: unknown key"):
        parse_params(data)


def test_wrong_type_is_named():
    data = demo()
    data["teacher_finetune"]["batch_size"] = "big"
    with pytest.raises(ConfigError, match=r"teacher_finetune.batch_size"):
        parse_params(data)


@pytest.mark.parametrize("section,key,value,match", [
    ("teacher_finetune", "learning_rate", -1.0, "teacher_finetune.learning_rate"),
    ("augment", "p_t", 1.5, "augment.p_t"),
    ("data", "max_length", 4096, "data.max_length"),
])
def test_impossible_values_are_named(section, key, value, match):
    data = demo()
    data[section][key] = value
    with pytest.raises(ConfigError, match=match):
        parse_params(data)


def test_impossible_grid_is_named():
    data = demo()
    data["task_distillation"]["prediction"]["learning_rates"] = [1e-5, 0.0]
    with pytest.raises(ConfigError, match=r"task_distillation.prediction.learning_rates: .*every learning rate"):
        parse_params(data)


def test_student_shape_needs_preset_or_numbers():
    data = demo()
    data["students"] = {"s": {"shape": {"layers": 2, "hidden": 30, "heads": 4, "intermediate": 64}}}
    with pytest.raises(ConfigError, match=r"students.s.shape.*divisible"):
        parse_params(data)
    data["students"] = {"s": {"shape": {"layers": 2}}}
    with pytest.raises(ConfigError, match=r"students.s.shape"):
        parse_params(data)


def test_local_source_needs_a_glue_dir():
    data = demo()
    data["data"]["source"] = "local"
    with pytest.raises(ConfigError, match=r"data: .*glue_dir"):
        parse_params(data)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="params file not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1,\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML"):
        load_params(bad)


def test_span_windows_that_cannot_work_are_one_error_before_any_stage(tmp_path):
    """A stride as long as a window's context (max_length - max_query_length - 3) is refused at load, naming the key
    where the task's windows are set, not as a traceback in the teacher's stage (met rehearsing the GPU run)."""
    data = yaml.safe_load((ROOT / "params" / "squad.yaml").read_text())
    data["per_task"] = {"squad": {"data": {"max_length": 128}}}  # doc_stride 128 from `data`, windows of 61 tokens
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"p.yaml: per_task.squad.data.doc_stride \(task squad\): doc_stride 128 must "
                                          r"be smaller than the context tokens of a window \(max_length 128 - "
                                          r"max_query_length 64 - 3 = 61\)$"):
        load_params(path)
    data["per_task"] = {}
    data["data"]["max_length"] = 128
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"p.yaml: data.doc_stride \(task squad\)"):
        load_params(path)
