"""BERT-PKD (Sun et al., 2019): the patient loss against its equation in float64, the layer maps of PKD-Skip and
PKD-Last, the recipe's params and checks, and its task stage end to end on tiny models."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
import yaml

from distillery.config import ConfigError, parse_params
from distillery.preflight import check_params
from distillery.objectives.pkd import hard_label_loss, patient_loss
from distillery.objectives.registry import TERMS
from distillery.recipes import RECIPES, RecipeError
from distillery.shape import Dims
from distillery.training.log import read_log
from distillery.training.spec import Grid, TrainRun

from helpers import FAST, bert_config, finetuned_teacher, task_of, task_sections, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)

PKD = RECIPES["pkd"]


def reference_patient_loss(student, teacher):
    """eq. 4 written out in float64: per example, the sum over layers of the squared distance between the
    L2-normalised [CLS] states; then the batch mean."""
    batch, per_example = len(student[0]), []
    for i in range(batch):
        total = 0.0
        for s_layer, t_layer in zip(student, teacher):
            s, t = [float(x) for x in s_layer[i]], [float(x) for x in t_layer[i]]
            ns, nt = math.sqrt(sum(x * x for x in s)), math.sqrt(sum(x * x for x in t))
            total += sum((a / ns - b / nt) ** 2 for a, b in zip(s, t))
        per_example.append(total)
    return sum(per_example) / batch


def test_patient_loss_matches_the_equation_in_float64():
    g = torch.Generator().manual_seed(0)
    student = [torch.randn(5, 7, generator=g, dtype=torch.float64) for _ in range(3)]
    teacher = [torch.randn(5, 7, generator=g, dtype=torch.float64) * 4 for _ in range(3)]
    got = patient_loss(student, teacher)
    assert got.dtype == torch.float64
    assert got.item() == pytest.approx(reference_patient_loss(student, teacher), rel=1e-12)
    # the official reduction is a mean over batch, layers and width: the paper's value / (M d)
    assert patient_loss(student, teacher, "official").item() == pytest.approx(got.item() / (3 * 7), rel=1e-12)
    # scale-free (normalised states), zero on equal directions, gradients reach the student only
    assert patient_loss([s * 9 for s in student], teacher).item() == pytest.approx(got.item(), rel=1e-12)
    assert patient_loss(teacher, [t * 0.5 for t in teacher]).item() == pytest.approx(0.0, abs=1e-12)
    s = [x.clone().requires_grad_(True) for x in student]
    t = [x.clone().requires_grad_(True) for x in teacher]
    patient_loss(s, t).backward()
    assert all(x.grad is not None for x in s) and all(x.grad is None for x in t)
    with pytest.raises(ValueError, match="equal width"):
        patient_loss([torch.randn(2, 4)], [torch.randn(2, 5)])


def test_hard_label_loss_is_the_gold_cross_entropy():
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.25]], dtype=torch.float64)
    labels = torch.tensor([0, 1])
    expected = -(math.log(math.exp(2) / (math.exp(2) + math.exp(-1))) +
                 math.log(math.exp(0.25) / (math.exp(0.5) + math.exp(0.25)))) / 2
    assert hard_label_loss(logits, labels).item() == pytest.approx(expected, rel=1e-12)
    assert hard_label_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([2.0, 2.0])).item() == pytest.approx(1.0)


def test_terms_are_registered_with_what_they_read():
    assert TERMS["patient_loss"].features == (("hidden", "states"),) and "prediction" in TERMS["patient_loss"].levels
    assert TERMS["hard_label_loss"].features == () and "prediction" in TERMS["hard_label_loss"].levels


def test_skip_and_last_layer_maps():
    skip = PKD(shape={"layers": 6, "hidden": 768, "heads": 12, "intermediate": 3072})
    assert [t for _, t in skip.map_layers(6, 12).hidden] == [2, 4, 6, 8, 10]  # the paper's PKD-Skip
    last = skip.model_copy(update={"strategy": "last"})
    assert [t for _, t in last.map_layers(6, 12).hidden] == [7, 8, 9, 10, 11]
    assert [s for s, _ in last.map_layers(6, 12).hidden] == [1, 2, 3, 4, 5]
    assert [t for _, t in skip.map_layers(3, 12).hidden] == [4, 8]


def demo_with_pkd(**student) -> dict:
    from pathlib import Path

    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    data["students"] = {"pkd": {"recipe": "pkd", "shape": {"layers": 2, "hidden": 128, "heads": 4,
                                                          "intermediate": 512}, **student}}
    return data


def test_recipe_params_and_checks():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = check_params(parse_params(demo_with_pkd()), "params.yaml", root)
    recipe = p.students["pkd"]
    assert dict(recipe.weights.weights) == {"hard_label_loss": 0.5, "prediction_loss": 0.5, "patient_loss": 100.0}
    assert recipe.stages(Dims(4, 128, 4, 512, 300)) == {}  # no general stage: it starts from the teacher's layers
    p = parse_params(demo_with_pkd(alpha=0.7, beta=500, temperature=5))
    assert dict(p.students["pkd"].weights.weights) == pytest.approx(
        {"hard_label_loss": 0.3, "prediction_loss": 0.7, "patient_loss": 500.0})
    with pytest.raises(ConfigError, match=r"students\.pkd\.shape: patient_loss compares \[CLS\] states of equal width"):
        check_params(parse_params(demo_with_pkd(init="random", shape={"layers": 2, "hidden": 64, "heads": 4,
                                                                        "intermediate": 256})), "params.yaml", root)
    with pytest.raises(ConfigError, match=r"students\.pkd\.objectives"):
        parse_params(demo_with_pkd(objectives={"attention_loss": 1}))
    for key in ("alpha", "beta", "temperature"):  # every float in params is finite (a YAML .inf or .nan)
        for value in (float("inf"), float("nan")):
            with pytest.raises(ConfigError, match=rf"students\.pkd\.{key}: Input should be a finite number"):
                parse_params(yaml.safe_load(yaml.safe_dump(demo_with_pkd(**{key: value}))))
    with pytest.raises(RecipeError, match="no intermediate layer"):
        PKD(shape={"layers": 1, "hidden": 128, "heads": 4, "intermediate": 512}).check(Dims(4, 128, 4, 512), "s")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("tok"))


def test_student_starts_from_the_first_k_teacher_layers(tok):
    teacher = transformers.BertForSequenceClassification(bert_config(tok.vocab_size, 4, num_labels=2))
    recipe = PKD(shape={"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64})
    student = recipe.start_student(teacher, tok, head="sequence-classification", num_labels=2)
    for j in range(2):
        assert torch.equal(student.bert.encoder.layer[j].output.dense.weight, teacher.bert.encoder.layer[j].output.dense.weight)


def test_task_stage_end_to_end(tok, tmp_path):
    """The recipe's task stage on a tiny fine-tuned teacher: every term logged, the student beats chance on dev."""
    from distillery.recipes import task_plan
    from distillery.training.plan import run_plan

    teacher, train, dev = finetuned_teacher(tok, tmp_path / "teacher")
    recipe = PKD(shape={"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64})
    sections = task_sections()
    done = run_plan(task_plan(recipe, Dims.of_config(teacher.config), sections), task_of(teacher, tok, train, dev),
                    sections, tmp_path / "student")
    grid = done.grid
    assert done.curve == grid.best_dir / "train_log.csv"
    rows = [r for r in read_log(grid.best_dir / "train_log.csv") if r.get("loss")]
    assert {"train_hard_label_loss", "train_prediction_loss", "train_patient_loss"} <= set(rows[0])
    assert float(rows[-1]["train_patient_loss"]) < float(rows[0]["train_patient_loss"])
    acc = json.loads((grid.best_dir / "metrics.json").read_text())["eval_accuracy"]
    assert acc > 0.7, acc


def test_the_extra_step_on_the_augmented_set_follows_patient_distillation(tok, tmp_path, monkeypatch):
    """`task_distillation: augmented`: after the patient grid (gold set, its own T), prediction-layer distillation of
    its best run on the augmented set at the prediction section's temperature; the better of the two on dev is the
    student."""
    from distillery.recipes import task_plan
    from distillery.training.plan import run_plan
    from distillery.training.task_data import Task

    teacher, train, dev = finetuned_teacher(tok, tmp_path / "teacher")
    augmented = train.select(range(0, len(train), 2))  # a different set, so the test sees which one was read
    read, loaded = [], []

    class Recorded(Task):
        def data(self, aug, unlabeled=False):
            read.append(aug)
            return super().data(aug, unlabeled)

        def load(self, path):
            loaded.append(path)
            return super().load(path)

    task = task_of(teacher, tok, train, dev, augmented=augmented)
    task = Recorded(**{f: getattr(task, f) for f in task.__dataclass_fields__})
    sections = task_sections(epochs=2)
    recipe = PKD(shape={"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}, task_distillation="augmented")
    plan = task_plan(recipe, Dims.of_config(teacher.config), sections)
    assert plan.augmented and recipe.loss_options().temperature == recipe.temperature == 10.0
    from distillery.training import grid as grid_module

    temperatures, real = [], grid_module.prediction_grid

    def spy(teacher, student, spec, run, g):
        temperatures.append(spec.options.temperature)
        return real(teacher, student, spec, run, g)
    monkeypatch.setattr(grid_module, "prediction_grid", spy)
    best = run_plan(plan, task, sections, tmp_path / "student").grid
    assert temperatures == [10.0, 1.0]  # PKD's own T in its grid, the prediction section's in the extra step

    def grid_best(folder):
        record = json.loads((tmp_path / "student" / folder / "grid.json").read_text())
        return next(r for r in record["results"] if r["name"] == record["best"])

    patient, extra = grid_best("grid"), grid_best("grid-distill")
    assert read == [False, True] and loaded == [Path(patient["model_dir"])]  # the extra step starts from PKD's best
    assert best.best["main"] == max(patient["main"], extra["main"])
    rows = [r for r in read_log(Path(extra["model_dir"]) / "train_log.csv") if r.get("loss")]
    assert "train_prediction_loss" in rows[0] and "train_patient_loss" not in rows[0]
