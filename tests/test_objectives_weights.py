"""ObjectiveWeights: names match the objective functions, config validation, weighted combination."""

import pytest
import torch

import distillery.objectives as objectives
from distillery.objectives import TERMS, ObjectiveConfigError, ObjectiveWeights


def test_names_match_functions_and_are_exported():
    import importlib

    for name in TERMS:  # each name is its equation's function, in the module that registers it
        fn = getattr(importlib.import_module(TERMS[name].compute.__module__), name)
        assert fn.__name__ == name and callable(fn)
    for module in ("tinybert", "minilm", "mobilebert", "distilbert"):  # the four papers' are exported here
        for name, term in TERMS.items():
            if term.compute.__module__ == f"distillery.objectives.{module}":
                assert getattr(objectives, name).__module__ == term.compute.__module__


def test_config_validation_names_the_key():
    with pytest.raises(ObjectiveConfigError, match="'attn_loss'"):
        ObjectiveWeights.from_config({"attn_loss": 1.0})
    with pytest.raises(ValueError, match="hidden_loss"):
        ObjectiveWeights.from_config({"hidden_loss": -1})
    with pytest.raises(ValueError, match="hidden_loss"):
        ObjectiveWeights.from_config({"hidden_loss": "x"})
    # preset names are gone: the paper weights live with the recipes
    with pytest.raises(ObjectiveConfigError, match="expected a mapping"):
        ObjectiveWeights.from_config("tinybert9")


def test_combine_weighted_sum_and_single_objective():
    w = ObjectiveWeights.from_config({"soft_target_loss": 5.0, "mlm_loss": 2.0, "cosine_loss": 1.0})
    assert w.active() == ("soft_target_loss", "mlm_loss", "cosine_loss")
    losses = {"soft_target_loss": torch.tensor(1.5), "mlm_loss": torch.tensor(2.0), "cosine_loss": torch.tensor(0.25)}
    assert w.combine(losses).item() == pytest.approx(5 * 1.5 + 2 * 2.0 + 0.25)
    alone = ObjectiveWeights.from_config({"mlm_loss": 1.0, "cosine_loss": 0.0})
    assert alone.active() == ("mlm_loss",) and alone["cosine_loss"] == 0.0
    assert alone.combine(losses).item() == pytest.approx(2.0)
    with pytest.raises(ObjectiveConfigError, match="no loss computed"):
        w.combine({"mlm_loss": torch.tensor(1.0)})
    with pytest.raises(ObjectiveConfigError, match="no objective"):
        ObjectiveWeights.from_config({}).combine(losses)


def test_one_spelling_per_objective():
    """Objectives have one name (the function's); short forms are unknown keys, not aliases."""
    w = ObjectiveWeights.from_config({"attention_loss": 1.0, "hidden_loss": 2.0, "embedding_loss": 0.5})
    assert w.active() == ("attention_loss", "hidden_loss", "embedding_loss")
    assert w["hidden_loss"] == 2.0
    with pytest.raises(ObjectiveConfigError, match="unknown key 'attention'"):
        ObjectiveWeights.from_config({"attention": 1.0})
