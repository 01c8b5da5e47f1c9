"""`per_task.<task>`: a task's own finetune / augment / task_distillation settings, merged over the run's, reach
exactly that task's stages (their bodies, cache keys and dvc.yaml params) and no other's."""

from pathlib import Path

import pytest
import yaml

from distillery.config import ConfigError, augment_sections, parse_params

ROOT = Path(__file__).resolve().parents[1]


def two_tasks(per_task: dict | None = None) -> dict:
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["data"].update(source="local", glue_dir="glue", tasks=["sst2", "cola"])
    if per_task is not None:
        data["per_task"] = per_task
    return data


SST2 = {"sst2": {"teacher_finetune": {"epochs": 1},
                 "task_distillation": {"student_dropout": 0.1, "prediction": {"epochs": 1}}}}


def test_a_tasks_settings_merge_over_the_runs_key_by_key():
    p = parse_params(two_tasks(SST2))
    sst2, cola = p.for_task("sst2"), p.for_task("cola")
    # the rest of the section is the run's
    assert sst2.teacher_finetune.epochs == 1 and sst2.teacher_finetune.learning_rate == p.teacher_finetune.learning_rate
    assert sst2.task_distillation.student_dropout == 0.1
    assert sst2.task_distillation.prediction.epochs == 1
    assert sst2.task_distillation.prediction.learning_rates == p.task_distillation.prediction.learning_rates  # merged one level down too
    assert sst2.task_distillation.intermediate == p.task_distillation.intermediate
    assert sst2.per_task == {} and sst2.for_task("sst2") is sst2  # applied once
    assert cola is p and p.teacher_finetune.epochs != 1 and p.task_distillation.student_dropout is None
    assert p.for_task(None) is p


def test_stages_of_a_task_see_its_settings_and_no_other_stage_does(monkeypatch, tmp_path):
    from flows.stages import STAGES
    from tasks.stage import stage_key

    p, plain = parse_params(two_tasks(SST2)), parse_params(two_tasks())
    baseline, finetune = STAGES["baseline"], STAGES["finetune_teacher"]
    assert baseline.params(p, "tinybert-demo:sst2")["student_dropout"] == 0.1
    assert baseline.params(p, "tinybert-demo:cola")["student_dropout"] is None
    assert finetune.params(p, "sst2")["teacher_finetune"]["epochs"] == 1
    # the cache keys: only the overridden task's stages change
    assert stage_key(finetune, p, "sst2") != stage_key(finetune, plain, "sst2")
    assert stage_key(finetune, p, "cola") == stage_key(finetune, plain, "cola")
    assert stage_key(STAGES["task_distillation"], p, "tinybert-demo:cola") == \
        stage_key(STAGES["task_distillation"], plain, "tinybert-demo:cola")
    assert stage_key(STAGES["general_distillation"], p, "tinybert-demo") == \
        stage_key(STAGES["general_distillation"], plain, "tinybert-demo")

    seen = {}
    stage = STAGES["task_distillation"]
    from dataclasses import replace

    from tasks import stage as stages

    monkeypatch.setattr(stages, "STAMPS", tmp_path)  # the body runs as `run_stage` runs it, which stamps
    def spy_body(q, item):
        seen[item] = q.task_distillation.prediction.epochs
        return {}

    spy = replace(stage, run=spy_body, outs=lambda q, item: [])
    stages.run_stage(spy, p, "tinybert-demo:sst2", key="k")
    stages.run_stage(spy, p, "tinybert-demo:cola", key="k")
    assert seen == {"tinybert-demo:sst2": 1, "tinybert-demo:cola": p.task_distillation.prediction.epochs}


def test_augmentation_off_for_one_task():
    from flows.stages import items

    p = parse_params(two_tasks({"cola": {"augment": {"enabled": False}}}))
    assert items("augment", p) == ["sst2"] and items("word_vectors", p) == [None]
    assert [a.enabled for a in augment_sections(p)] == [True, False]
    p = parse_params(two_tasks({"sst2": {"augment": {"enabled": False}}, "cola": {"augment": {"enabled": False}}}))
    assert items("augment", p) == [] and items("word_vectors", p) == []


def test_dvc_stages_track_their_tasks_keys_only():
    from flows.dvc import param_keys
    from flows.stages import STAGES

    raw = two_tasks(SST2)
    p = parse_params(raw)

    def keys(stage, item):
        return param_keys(stage, STAGES[stage].params(p, item), item, raw)

    assert "per_task.sst2.task_distillation.student_dropout" in keys("baseline", "tinybert-demo:sst2")
    assert "per_task.sst2.task_distillation" not in keys("baseline", "tinybert-demo:sst2")  # not its grid
    assert "per_task.sst2.task_distillation" in keys("task_distillation", "tinybert-demo:sst2")
    assert "per_task.sst2.teacher_finetune" in keys("finetune_teacher", "sst2")
    assert not any(k.startswith("per_task") for k in keys("baseline", "tinybert-demo:cola")
                   + keys("finetune_teacher", "cola") + keys("augment", "sst2") + keys("report", None))


def test_a_task_encodes_and_times_at_its_own_length():
    """SQuAD's 384-token windows beside GLUE's 128 in one run: a task's data/evaluation keys reach its stages, their
    cache keys and their dvc.yaml params, and no other task's."""
    from flows.dvc import param_keys
    from flows.stages import STAGES
    from tasks.stage import stage_key

    over = {"sst2": {"data": {"max_length": 96, "group_by_length": True}, "evaluation": {"latency_seq_len": 96}}}
    raw = two_tasks(over)
    p, plain = parse_params(raw), parse_params(two_tasks())
    sst2, cola = p.for_task("sst2"), p.for_task("cola")
    assert (sst2.data.max_length, sst2.data.group_by_length, sst2.evaluation.latency_seq_len) == (96, True, 96)
    assert sst2.data.tasks == p.data.tasks and sst2.evaluation.latency_batch_sizes == p.evaluation.latency_batch_sizes
    assert cola.data.max_length == p.data.max_length != 96
    finetune = STAGES["finetune_teacher"]
    assert stage_key(finetune, p, "sst2") != stage_key(finetune, plain, "sst2")
    assert stage_key(finetune, p, "cola") == stage_key(finetune, plain, "cola")
    keys = param_keys("finetune_teacher", finetune.params(p, "sst2"), "sst2", raw)
    assert "per_task.sst2.data.max_length" in keys
    assert not any(k.startswith("per_task") for k in param_keys("finetune_teacher", finetune.params(p, "cola"),
                                                                  "cola", raw))


@pytest.mark.parametrize("per_task,match", [
    ({"sst2": {"data": {"source": "hub"}}}, r"params.yaml: per_task.sst2.data: .*'source'.* cannot differ per task"),
    ({"sst2": {"evaluation": {"latency": False}}}, r"per_task.sst2.evaluation: .*cannot differ per task"),
    ({"qnli": {"teacher_finetune": {"epochs": 1}}}, r"params.yaml: per_task: 'qnli' is not in data.tasks \(sst2, cola\)"),
    ({"sst2": {"teacher_finetune": {"epochs": 0}}}, r"params.yaml: per_task.sst2.teacher_finetune.epochs: .*greater than 0"),
    ({"sst2": {"teacher_finetune": {"epoch": 1}}}, r"params.yaml: per_task.sst2.teacher_finetune.epoch: unknown key"),
    ({"sst2": {"pretrain": {"epochs": 1}}}, r"params.yaml: per_task.sst2.pretrain: unknown key"),
    ({"sst2": {"task_distillation": {"student_dropout": 1.5}}},
     r"params.yaml: per_task.sst2.task_distillation.student_dropout: .*less than 1"),
    ({"sst2": {"task_distillation": {"prediction": {"learning_rates": [0.0]}}}},
     r"params.yaml: per_task.sst2.task_distillation.prediction.learning_rates: .*every learning rate"),
])
def test_bad_per_task_settings_name_the_key(per_task, match):
    with pytest.raises(ConfigError, match=match):
        parse_params(two_tasks(per_task))


def test_a_tasks_batch_sizes_must_split_across_the_processes():
    data = two_tasks({"cola": {"task_distillation": {"prediction": {"batch_sizes": [31]}}}})
    data["distributed"] = {"nproc_per_node": 2}
    with pytest.raises(ConfigError, match=r"per_task.cola: nproc_per_node=2 does not divide "
                                          r"task_distillation.prediction.batch_sizes \(31\)"):
        parse_params(data)


def test_the_mlm_of_augmentation_is_checked_for_every_task():
    from distillery.preflight import check_params

    data = two_tasks({"cola": {"augment": {"enabled": True}}})
    data["augment"]["enabled"] = False
    data["pretrain"]["enabled"] = False
    with pytest.raises(ConfigError, match=r"augment.mlm: 'teacher' is the pre-training stage's MLM"):
        check_params(parse_params(data), root=ROOT)
