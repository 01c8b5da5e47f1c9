"""The matmul ceiling at a model's shapes, the FLOPs a training step counts, and each run's share of the ceiling."""

from __future__ import annotations

import pytest
import torch

from distillery.efficiency.ceiling import StepFlops, layer_shapes, matmul_ceiling, matmul_pass, utilisation
from distillery.efficiency.flops import flops_breakdown, flops_per_example
from distillery.report import render_markdown, stage_utilisation
from distillery.training.log import read_log, write_log

from helpers import bert_config, classifier

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_layers_forward_shapes_are_the_flop_counts_linear_part():
    cfg = bert_config(100, 3, hidden=48, heads=4, inter=80)
    tokens = 5 * 16
    forward = sum(2 * m * k * n for m, k, n in layer_shapes(48, 80, tokens, training=False))
    assert 3 * forward == flops_breakdown(cfg, 16, head="none").linear * 5
    # training: every product also as its input gradient and its weight gradient, the same FLOPs each
    assert sum(2 * m * k * n for m, k, n in layer_shapes(48, 80, tokens)) == 3 * forward


def test_a_step_counts_the_students_forward_three_times_and_the_teachers_once_when_it_runs():
    student, teacher = classifier(100, 2), classifier(100, 4)
    ids = torch.randint(5, 100, (4, 12))
    mask = torch.ones_like(ids)
    mask[:, 9:] = 0
    s, t = flops_per_example(student.config, 12), flops_per_example(teacher.config, 12)
    runs = {"yes": True}
    count = StepFlops(student, teacher, lambda inputs: runs["yes"])
    assert count({"input_ids": ids, "attention_mask": mask}) == 4 * (3 * s + t)
    runs["yes"] = False  # cached teacher logits: the teacher did not run
    assert count({"input_ids": ids, "attention_mask": mask}) == 4 * 3 * s
    assert (count.steps, count.tokens, count.padded) == (2, 96, 24)
    assert count({"labels": torch.zeros(4)}) == 0.0 and count.steps == 2  # nothing the counter knows
    unpadded = StepFlops(student, teacher, unpadded=True)  # the layers ran on the 9 real tokens of 12 alone
    assert unpadded({"input_ids": ids, "attention_mask": mask}) == pytest.approx(4 * (3 * s + t) * 9 / 12)


def test_the_ceiling_is_measured_once_per_process_and_a_runs_share_of_it_is_reported():
    shapes = layer_shapes(32, 64, 64)
    a = matmul_ceiling(shapes)
    assert a.flops_per_s > 0 and a.dtype == "float32" and a.threads == torch.get_num_threads()
    assert matmul_ceiling(shapes).flops_per_s == a.flops_per_s  # cached: one measurement per process
    with pytest.raises(ValueError, match="positive"):
        matmul_ceiling([(0, 4, 4)])
    student = classifier(100, 2)
    count = StepFlops(student)
    ids = torch.randint(5, 100, (4, 16))
    count({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    u = utilisation(count, 0.5, bf16=False)
    assert u["padded_share"] == 0.0
    assert u["train_tflops"] == pytest.approx(count.flops / 0.5 / 1e12, rel=1e-3)
    assert u["mfu"] == pytest.approx(count.flops / 0.5 / matmul_ceiling(layer_shapes(32, 64, 64)).flops_per_s,
                                     rel=1e-3, abs=1e-4)
    assert utilisation(StepFlops(student), 1.0, bf16=False) == {}  # nothing counted: nothing to report


def test_a_pass_over_the_shapes_runs_each_matmul_once_per_time_it_appears(monkeypatch):
    shapes = [(8, 4, 6), (6, 8, 4), (8, 4, 6)]
    flops, run = matmul_pass(shapes)
    assert flops == 2 * (2 * 8 * 4 * 6 + 6 * 8 * 4)
    calls, real = [], torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b, out: calls.append((*a.shape, b.shape[1])) or real(a, b, out=out))
    run()
    assert calls == shapes


def test_the_report_shows_each_training_runs_utilisation(tmp_path):
    with_mfu = write_log(tmp_path / "a.csv", [{"step": 5, "loss": 1.0},
                                              {"step": 10, "train_runtime": 2.0, "train_tflops": 0.05,
                                               "ceiling_tflops": 0.2, "mfu": 0.25, "padded_share": 0.4}])
    without = write_log(tmp_path / "b.csv", [{"step": 5, "loss": 1.0}])
    util = stage_utilisation({"task_distillation-x-sst2": with_mfu, "pretrain": without})
    assert util == {"task_distillation-x-sst2": {"train_tflops": 0.05, "ceiling_tflops": 0.2, "mfu": 0.25,
                                                 "padded_share": 0.4}}
    text = render_markdown(["sst2"], [], utilisation=util)
    assert "| task_distillation-x-sst2 | 0.05 | 0.2 | 25% | 40% |" in text
    assert read_log(with_mfu)[-1]["mfu"] == 0.25
