"""The ablation command's variants: one recipe switch each, params that validate, and the table it writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from distillery.config import parse_params
from flows.ablation import ablation_params, render, table, variants

ROOT = Path(__file__).resolve().parents[1]


def demo():
    return parse_params(yaml.safe_load((ROOT / "params.yaml").read_text()), "params.yaml")


def test_each_variant_changes_one_switch_of_the_student():
    p = demo()
    v = variants(p, "tinybert-demo")
    assert sorted(v) == ["tinybert-demo-no-attn", "tinybert-demo-no-da", "tinybert-demo-no-gd", "tinybert-demo-no-step1"]
    base = p.students["tinybert-demo"]
    assert base.runs_general and not v["tinybert-demo-no-gd"].runs_general
    assert not v["tinybert-demo-no-da"].augmentation and v["tinybert-demo-no-da"].intermediate_step
    assert not v["tinybert-demo-no-step1"].intermediate_step
    weights = v["tinybert-demo-no-attn"].weights
    assert weights["attention_loss"] == 0 and weights["hidden_loss"] == base.weights["hidden_loss"] > 0


def test_no_gd_variant_only_where_the_student_has_general_distillation():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["students"]["tinybert-demo"]["init"] = {"teacher_layers": "auto"}
    raw["students"]["tinybert-demo"]["shape"] = {"layers": 2, "hidden": 128, "heads": 4, "intermediate": 512}
    p = parse_params(raw, "params.yaml")
    assert "tinybert-demo-no-gd" not in variants(p, "tinybert-demo")


def test_ablation_params_validate_and_keep_only_the_ablated_student():
    data = ablation_params(demo(), "tinybert-demo")
    p = parse_params(data, "ablation.yaml")
    assert set(p.students) == {"tinybert-demo", *variants(demo(), "tinybert-demo")}
    assert not p.evaluation.baselines and not p.registry.enabled
    assert p.teacher == demo().teacher and p.task_distillation == demo().task_distillation


def test_table_reads_each_variant_and_the_delta_against_the_full_student():
    p = parse_params(ablation_params(demo(), "tinybert-demo"), "ablation.yaml")
    scores = {"tinybert-demo": 0.9, "tinybert-demo-no-gd": 0.8, "tinybert-demo-no-da": 0.85,
              "tinybert-demo-no-step1": 0.88, "tinybert-demo-no-attn": 0.86}
    summary = {"demo": {name: {"accuracy": s} for name, s in scores.items()}}
    tasks, rows = table(p, "tinybert-demo", summary)
    assert rows[0][:2] == ("tinybert-demo", "full") and rows[0][2] == [pytest.approx(0.9)]
    md = render(tasks, rows)
    assert "| w/o GD | tinybert-demo-no-gd | 80.0 | 80.0 | -10.0 |" in md
