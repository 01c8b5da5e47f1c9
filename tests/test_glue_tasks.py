import pytest

from distillery.glue import GLUE_TASKS, TASKS, UnknownTaskError, get_task


def test_registry_covers_glue_and_demo_tasks():
    assert set(GLUE_TASKS) <= set(TASKS)
    assert {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli", "ax",
            "demo", "demo-pair"} == set(TASKS)
    for name, spec in TASKS.items():
        assert spec.name == name == name.lower()


def test_label_order_matches_official_processors():
    assert get_task("mnli").labels == ("contradiction", "entailment", "neutral")
    assert get_task("mnli-mm").labels == get_task("ax").labels == get_task("mnli").labels
    assert get_task("rte").labels == get_task("qnli").labels == ("entailment", "not_entailment")
    for name in ("cola", "sst2", "mrpc", "qqp", "wnli", "demo", "demo-pair"):
        assert get_task(name).labels == ("0", "1")
    assert get_task("mnli").label2id["entailment"] == 1 and get_task("mnli").id2label[0] == "contradiction"


def test_regression_pair_and_metrics():
    stsb = get_task("stsb")
    assert stsb.is_regression and stsb.num_labels == 1 and stsb.is_pair
    assert not get_task("sst2").is_pair and get_task("mnli").num_labels == 3
    assert get_task("cola").main_metric == "mcc"
    assert get_task("stsb").main_metric == "pearson_spearman"
    assert get_task("mrpc").main_metric == get_task("qqp").main_metric == "f1_accuracy"
    assert get_task("rte").main_metric == "accuracy"
    # MNLI is selected on matched dev, even when evaluating mismatched; AX comes from the MNLI model.
    assert get_task("mnli-mm").selection_task == "mnli" == get_task("ax").selection_task
    assert get_task("mnli").selection_task == "mnli"


def test_hub_label_names_are_aligned_with_registry_labels():
    for spec in TASKS.values():
        if spec.hub_config and not spec.is_regression:
            assert len(spec.hub_label_names) == len(spec.labels), spec.name
    assert get_task("wnli").hub_label_names == ("not_entailment", "entailment")


def test_get_task_aliases_and_unknown():
    assert get_task("SST-2").name == "sst2"
    assert get_task("STS-B").name == "stsb"
    assert get_task("MNLI-mm").name == "mnli-mm"
    assert get_task("diagnostic").name == "ax"
    assert get_task(get_task("rte")) is get_task("rte")
    with pytest.raises(UnknownTaskError, match="squad"):
        get_task("squad")
    with pytest.raises(ValueError):
        get_task("")


def test_tasks_evaluated_with_the_mnli_model():
    from distillery.glue import tasks_evaluated_with

    assert tasks_evaluated_with("mnli") == ("mnli", "mnli-mm", "ax")
    assert tasks_evaluated_with("mnli-mm") == ("mnli", "mnli-mm", "ax")
    assert tasks_evaluated_with("rte") == ("rte",)
