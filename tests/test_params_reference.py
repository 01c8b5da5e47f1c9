"""The params reference page is generated from the schema: every key there, with its type, default and comment."""

from distillery.config import Params
from distillery.params_reference import render, rows


def test_every_key_of_the_schema_is_a_row_with_its_default_and_the_comment_the_source_gives_it():
    table = {key: (tp, default, text) for key, tp, default, text in rows(Params)}
    assert table["task_distillation.prediction.learning_rates"][1] == "`[1e-05, 2e-05, 3e-05]`"
    assert table["precision"][0] == "auto \\| fp32 \\| bf16" and "bf16 autocast" in table["precision"][2]
    assert table["teacher"][1] == "required"
    # a recipe's own keys under its name, the keys every recipe has once
    assert "students.<name>[pkd].beta" in table and "students.<name>.shape" in table
    assert "students.<name>[tinybert].shape" not in table
    # a section met before points to where it is spelled out
    assert "teacher.shape" in table["students.<name>.shape"][2]
    assert "students.<name>.shape.layers" not in table
    page = render()
    assert page.startswith("# Params reference") and "| `evaluation.latency_rounds` | int | `20` |" in page


def test_every_key_says_what_it_means():
    missing = [key for key, _, _, text in rows(Params) if not text]
    assert not missing, f"params keys without a comment in the schema: {missing}"
