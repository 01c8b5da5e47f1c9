"""distillery.training.compiled: the compile switch, and a compiled distillation step equal to the eager one."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from distillery.layer_map import build_layer_map
from distillery.models import student_config
from distillery.shape import Dims
from distillery.training import compiled
from distillery.training.distill import Distiller, make_projection
from distillery.training.spec import DistillSpec


def test_setting_resolves_per_device():
    assert not compiled.enabled("cpu") and compiled.enabled("cuda")  # auto, without a setting in force
    assert not compiled.enabled("cuda", evaluates=True)  # auto leaves a run that evaluates (a task run) eager
    with compiled.use("on"):
        assert compiled.enabled("cuda", evaluates=True)
    with compiled.use("on"):
        assert compiled.enabled("cpu")
    with compiled.use("off"):
        assert not compiled.enabled("cuda")
    with compiled.use("auto"):
        assert not compiled.enabled(torch.device("cpu"))
    with pytest.raises(ValueError, match="compile: expected one of auto, on, off"):
        with compiled.use("yes"):
            pass


def _bert(dims: Dims) -> transformers.BertForSequenceClassification:
    config = student_config(dims, 300, num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # the two runs see the same function
    return transformers.BertForSequenceClassification(config)


@pytest.mark.xdist_group("compile")
def test_compiled_step_equals_eager():
    """TinyBERT's intermediate step (capture hooks on the compiled modules, eqs. 7-9) with teacher, student and
    objectives compiled: the same terms, student and projection gradients as eager, within float32 rounding;
    compiling twice is a no-op."""
    torch.manual_seed(0)
    teacher, student = _bert(Dims(2, 32, 2, 64)).eval(), _bert(Dims(1, 16, 2, 32))
    lm = build_layer_map("uniform", 1, 2)
    spec = DistillSpec({"attention_loss": 1.0, "hidden_loss": 1.0, "embedding_loss": 1.0}, "intermediate", lm)
    proj = make_projection(student, teacher, lm)
    eager = Distiller(student, teacher, spec, copy.deepcopy(proj))
    fused = Distiller(copy.deepcopy(student), copy.deepcopy(teacher), spec, copy.deepcopy(proj))
    with compiled.use("off"):
        assert not compiled.compile_step(fused)
    with compiled.use("on"):
        assert compiled.compile_step(fused, device="cpu")
        fn = fused._compiled_objectives
        assert compiled.compile_step(fused, device="cpu") and fused._compiled_objectives is fn  # compiled once
    ids = torch.randint(1, 300, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    runs = []
    for d in (eager, fused):
        out = d.train()(input_ids=ids, attention_mask=mask)
        out.loss.backward()
        # a parameter no term reads (pooler, classifier) has no gradient eager and a zero one compiled
        runs.append((out.terms, {n: torch.zeros_like(p) if p.grad is None else p.grad
                                 for n, p in d.named_parameters()}))
    (eager_terms, eager_grads), (comp_terms, comp_grads) = runs
    for name in eager_terms:
        torch.testing.assert_close(comp_terms[name], eager_terms[name], rtol=1e-4, atol=1e-6)
    assert eager_grads.keys() == comp_grads.keys()
    assert any(bool(g.abs().sum() > 0) for g in eager_grads.values())
    for name in eager_grads:
        torch.testing.assert_close(comp_grads[name], eager_grads[name], rtol=1e-3, atol=1e-5)
