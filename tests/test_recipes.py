"""Student recipes: typed params, initialisation, each recipe training through the public API, and every bad
recipe stopped before any stage runs with one line naming the params key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from distillery.config import ConfigError, parse_params
from distillery.preflight import check_params
from distillery.layer_map import build_layer_map
from distillery.shape import Dims
from distillery.recipes import (
    CheckpointMismatchError,
    DistilBertRecipe,
    MiniLMRecipe,
    TinyBertRecipe,
    official_teacher_layers,
)
from distillery.recipes.mobilebert import MobileBertRecipe
from distillery.recipes.pkd import PKDRecipe
from distillery.training.distill import distill
from distillery.training.spec import TrainRun
from distillery.training.log import read_log
from distillery.training.masking import SmoothedMaskingCollator, masking_weights, token_counts

from helpers import FAST, bert_config, encoded, finetuned_teacher, task_of, task_sections, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def demo() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def losses(model_dir: Path) -> list[float]:
    return [float(r["loss"]) for r in read_log(model_dir / "train_log.csv") if r.get("loss")]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("tok"))


def mlm_teacher(vocab: int, layers: int = 4, hidden: int = 32, heads: int = 2, inter: int = 64):
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(bert_config(vocab, layers, hidden=hidden, heads=heads, inter=inter)).eval()


# ------------------------------------------------------------------------------------------------ params


def test_demo_has_one_student_per_recipe():
    p = parse_params(demo())
    assert {r.recipe for r in p.students.values()} == {"tinybert", "minilm", "distilbert", "mobilebert", "pkd"}
    assert isinstance(p.students["distilbert-demo"], DistilBertRecipe)
    # paper defaults come from the recipe when params give none
    assert dict(p.students["distilbert-demo"].weights.weights) == {"soft_target_loss": 5.0, "mlm_loss": 2.0,
                                                                     "cosine_loss": 1.0}
    assert p.students["distilbert-demo"].temperature == 2.0
    assert dict(p.students["minilm-demo"].weights.weights) == {"attention_kl": 1.0, "value_relation_kl": 1.0}
    assert p.students["tinybert-demo"].weights.active() == ("attention_loss", "hidden_loss", "embedding_loss")
    mobile = p.students["mobilebert-demo"]
    assert (mobile.transfer, mobile.lower_layer_lr_scale, mobile.alpha, mobile.ib_teacher.init) == (
        "progressive", 0.1, 0.5, "convert")
    assert mobile.weights.active() == ("feature_map_loss", "attention_transfer_loss")


def test_student_without_recipe_is_tinybert():
    data = demo()
    data["students"] = {"s": {"shape": {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 256}}}
    assert isinstance(parse_params(data).students["s"], TinyBertRecipe)


BAD = [
    # (student edits, expected key, expected words)
    ({"objectives": {"attentoin": 1}}, "students.tinybert-demo.objectives", "unknown key 'attentoin'"),
    ({"objectives": {"cosine_loss": 1}}, "students.tinybert-demo.objectives", "cannot be computed by the tinybert"),
    ({"objectives": {"attention_loss": -1}}, "students.tinybert-demo.objectives", ">= 0"),
    ({"recipe": "tinybert", "layer_map": "sideways"}, "students.tinybert-demo.layer_map", "'uniform'"),
    ({"recipe": "bert-of-theseus"}, "students.tinybert-demo", "recipe"),
    ({"init": "pretrained"}, "students.tinybert-demo.init", "random"),
    ({"shape": {"layers": 6, "hidden": 64, "heads": 4, "intermediate": 256}}, "students.tinybert-demo.shape",
     "more than the teacher's 4"),
    ({"shape": {"layers": 2, "hidden": 64, "heads": 8, "intermediate": 256}}, "students.tinybert-demo.layer_map",
     "equal head counts"),
    ({"shape": {"layers": 2, "hidden": 30, "heads": 4, "intermediate": 64}}, "students.tinybert-demo.shape",
     "divisible"),
    ({"shape": {"preset": "tinybert9"}}, "students.tinybert-demo.shape", "unknown shape preset"),
    ({"task_distillation": True}, "students.tinybert-demo.task_distillation", "prediction-layer distillation already"),
]


@pytest.mark.parametrize("edit,key,words", BAD)
def test_bad_tinybert_recipe_names_the_key(edit, key, words):
    data = demo()
    data["students"]["tinybert-demo"].update(edit)
    with pytest.raises(ConfigError) as err:
        check_params(parse_params(data), "params.yaml", ROOT)
    msg = str(err.value)
    assert msg.startswith(f"params.yaml: {key}") and words in msg and "\n" not in msg, msg


@pytest.mark.parametrize("student,edit,key,words", [
    ("distilbert-demo", {"shape": {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 256}},
     "students.distilbert-demo.init", "teacher's width"),
    ("distilbert-demo", {"init": "random", "shape": {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 256}},
     "students.distilbert-demo.shape", "cosine_loss needs the teacher's hidden size 128"),
    ("distilbert-demo", {"init": {"teacher_layers": [0, 7]}}, "students.distilbert-demo.init.teacher_layers",
     "layer 7 does not exist"),
    ("distilbert-demo", {"init": {"teacher_layers": [0, 1, 2]}}, "students.distilbert-demo.init.teacher_layers",
     "3 layers for a 2-layer student"),
    ("minilm-demo", {"objectives": {"relation_kl": 1}, "relation_heads": 5}, "students.minilm-demo.relation_heads",
     "do not divide"),
    ("minilm-demo", {"shape": {"layers": 2, "hidden": 64, "heads": 8, "intermediate": 256}},
     "students.minilm-demo.objectives", "compare heads one by one"),
    ("minilm-demo", {"objectives": {"attention_loss": 1}}, "students.minilm-demo.objectives",
     "cannot be computed by the minilm"),
    ("minilm-demo", {"init": {"checkpoint": "./no/such/dir"}}, "students.minilm-demo.init.checkpoint",
     "not found"),
])
def test_bad_minilm_and_distilbert_recipes_name_the_key(student, edit, key, words):
    data = demo()
    data["students"][student].update(edit)
    with pytest.raises(ConfigError) as err:
        check_params(parse_params(data), "params.yaml", ROOT)
    msg = str(err.value)
    assert msg.startswith(f"params.yaml: {key}") and words in msg and "\n" not in msg, msg


def test_distilbert_needs_an_mlm_teacher():
    data = demo()
    data["pretrain"]["enabled"] = False
    data["augment"]["mlm"] = "some/mlm"
    with pytest.raises(ConfigError, match=r"students.distilbert-demo: pre-training distillation needs a teacher with"):
        check_params(parse_params(data), "params.yaml", ROOT)


def test_pipeline_stops_on_a_bad_recipe_before_any_stage(tmp_path):
    """The CLI: exit 2, one line naming the file and key, nothing written."""
    data = demo()
    data["students"]["minilm-demo"]["objectives"] = {"attentoin_kl": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    outputs = ("data", "models", "metrics", "reports")
    before = {d for d in outputs if (ROOT / d).exists()}
    proc = subprocess.run([sys.executable, "-m", "flows.pipeline", "--params", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "students.minilm-demo.objectives: unknown key 'attentoin_kl'" in lines[0], proc.stderr
    assert {d for d in outputs if (ROOT / d).exists()} == before  # no stage ran


# ------------------------------------------------------------------------------------------------ stages


def test_teacher_assistant_when_sizes_call_for_it():
    teacher = Dims(12, 768, 12, 3072, 30522)
    small = Dims(6, 384, 12, 1536)
    recipe = MiniLMRecipe(shape={"preset": "minilm-l6-h384"})
    assert recipe.shape.resolve() == small
    assert recipe.assistant_dims(teacher) == Dims(12, 384, 12, 1536, 30522, "bert")
    wide = MiniLMRecipe(shape={"layers": 6, "hidden": 512, "heads": 8, "intermediate": 2048})
    assert wide.assistant_dims(teacher) is None  # d' > d/2
    assert recipe.model_copy(update={"teacher_assistant": "off"}).assistant_dims(teacher) is None


def test_pipeline_items_follow_the_recipes():
    from flows.stages import items
    from flows.stages import STAGES

    _general_deps = STAGES["general_distillation"].deps
    p = parse_params(demo())
    assert items("teacher_assistant", p) == ["minilm-demo"]  # demo: 2 x 64 student of a 4 x 128 teacher
    assert set(items("general_distillation", p)) == {"tinybert-demo", "minilm-demo", "distilbert-demo",
                                                     "mobilebert-demo"}
    assert items("ib_teacher", p) == items("knowledge_transfer", p) == ["mobilebert-demo"]
    mobile = [str(d) for d in _general_deps(p, "mobilebert-demo")]  # pre-training distillation after the transfer
    assert any("ib-teacher" in d for d in mobile) and any("transfer" in d for d in mobile)
    assert any("assistant" in str(d) for d in _general_deps(p, "minilm-demo"))  # distilled from the assistant
    assert not any("assistant" in str(d) for d in _general_deps(p, "tinybert-demo"))


def test_checkpoint_init_skips_general_distillation(tmp_path, tok):
    """A released general student (here a local directory in the Hub layout) starts the task stage directly;
    one with another vocabulary is a clear error at load time."""
    from flows.stages import items

    ckpt = tmp_path / "general-student"
    transformers.BertModel(bert_config(tok.vocab_size, 2)).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    data = demo()
    data["students"]["tinybert-demo"]["init"] = {"checkpoint": str(ckpt)}
    p = check_params(parse_params(data), "params.yaml", ROOT)
    assert "tinybert-demo" not in items("general_distillation", p)
    teacher = transformers.BertForSequenceClassification(bert_config(tok.vocab_size, 4))
    model = p.students["tinybert-demo"].start_student(teacher, tok, head="sequence-classification", num_labels=2)
    assert torch.equal(model.bert.embeddings.word_embeddings.weight,
                       transformers.BertModel.from_pretrained(ckpt).embeddings.word_embeddings.weight)
    other = transformers.BertTokenizerFast(vocab={**tok.get_vocab(), "zebra": tok.vocab_size})
    with pytest.raises(CheckpointMismatchError, match="vocabulary"):
        p.students["tinybert-demo"].start_student(teacher, other, head="base")


def test_distilbert_init_has_the_teachers_layers(tok):
    teacher = mlm_teacher(tok.vocab_size, layers=4)
    recipe = DistilBertRecipe(shape={"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "arch": "distilbert"},
                              init={"teacher_layers": [0, 3]})
    student = recipe.start_student(teacher, tok, head="mlm")
    assert isinstance(student, transformers.DistilBertForMaskedLM)
    for j, i in enumerate([0, 3]):
        s, t = student.distilbert.transformer.layer[j], teacher.bert.encoder.layer[i]
        assert torch.equal(s.attention.q_lin.weight, t.attention.self.query.weight)
        assert torch.equal(s.ffn.lin2.weight, t.output.dense.weight)
        assert torch.equal(s.output_layer_norm.weight, t.output.LayerNorm.weight)
    assert torch.equal(student.distilbert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight)
    assert torch.equal(student.vocab_transform.weight, teacher.cls.predictions.transform.dense.weight)
    assert official_teacher_layers(12, 6) == [0, 2, 4, 7, 9, 11]  # the released DistilBERT's choice


@pytest.mark.parametrize("recipe, options, layers", [
    (TinyBertRecipe, {}, [1, 3, 5]),  # what its uniform map aligns student layers 0, 1, 2 with
    (TinyBertRecipe, {"layer_map": "top"}, [3, 4, 5]),
    (DistilBertRecipe, {}, [0, 3, 5]),  # evenly spread, the first and the last kept
    (PKDRecipe, {}, [0, 1, 2]),  # the paper's first k
])
def test_teacher_layers_auto_is_the_recipes_choice_for_layer_and_pruned_inits(tok, recipe, options, layers):
    teacher = transformers.BertModel(bert_config(tok.vocab_size, 6, hidden=32, heads=2)).eval()
    shape = {"layers": 3, "hidden": 32, "heads": 2, "intermediate": 64}
    whole = recipe(shape=shape, init="teacher_layers", **options)
    cut = recipe(shape={**shape, "intermediate": 32}, init="pruned", **options)
    from distillery.recipes.base import teacher_layers

    assert teacher_layers(whole, 6, 3) == teacher_layers(cut, 6, 3) == layers
    student = whole.start_student(teacher, tok, head="base")
    pruned = cut.start_student(teacher, tok, head="base", data=encoded(tok, 8, seed=1))
    for j, i in enumerate(layers):
        t = teacher.encoder.layer[i].attention.self.query.weight
        assert torch.equal(student.encoder.layer[j].attention.self.query.weight, t)
        assert torch.equal(pruned.encoder.layer[j].attention.self.query.weight, t)  # full width: every head kept


# ------------------------------------------------------------------------------------------------ training


def test_distilbert_pretraining_distillation_trains(tok, tmp_path):
    teacher = mlm_teacher(tok.vocab_size)
    recipe = DistilBertRecipe(shape={"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "arch": "distilbert"})
    student = recipe.start_student(teacher, tok, head="mlm")
    train = encoded(tok, 256, seed=3).select_columns(["input_ids"])
    weights = masking_weights(token_counts(train["input_ids"], len(tok)), recipe.mask_smoothing, tok.all_special_ids)
    spec = recipe.layer_wise_spec(2, 4)  # the recipe's own 5/2/1 at T = 2, last hidden states for L_cos
    assert spec.options.temperature == 2.0 and dict(spec.objectives.weights) == dict(recipe.weights.weights)
    out = distill(teacher, student, spec, TrainRun(
        tmp_path / "pd", train, tokenizer=tok, data_collator=SmoothedMaskingCollator(tok, weights, seed=0),
        args={**FAST, "logging_steps": 2, **recipe.optimizer_options(), "learning_rate": 5e-3,
              "per_device_train_batch_size": 16, "num_train_epochs": 3}))
    rows = [r for r in read_log(out / "train_log.csv") if r.get("loss")]
    assert {"train_soft_target_loss", "train_mlm_loss", "train_cosine_loss"} <= set(rows[0])
    def mean(key, part):
        return sum(float(r[key]) for r in part) / len(part)

    # the teacher is random and the words are random: L_mlm sits near the vocabulary's entropy, the total still
    # falls, and the cosine term (the student's own hidden states moving to the teacher's) falls clearly
    assert mean("loss", rows[-3:]) < mean("loss", rows[:3])
    assert mean("train_cosine_loss", rows[-3:]) < 0.8 * mean("train_cosine_loss", rows[:3])
    reloaded = transformers.AutoModelForMaskedLM.from_pretrained(out)  # a plain HF student, tied head intact
    assert reloaded.vocab_projector.weight.data_ptr() == reloaded.distilbert.embeddings.word_embeddings.weight.data_ptr()


@pytest.mark.parametrize("objectives", [{"attention_kl": 1.0, "value_relation_kl": 1.0}, {"relation_kl": 1.0}])
def test_minilm_general_distillation_trains_a_narrower_student(tok, tmp_path, objectives):
    teacher = transformers.BertModel(bert_config(tok.vocab_size, 4, hidden=32, heads=2)).eval()
    recipe = MiniLMRecipe(shape={"layers": 2, "hidden": 16, "heads": 2, "intermediate": 32}, objectives=objectives,
                          relation_heads=4)
    student = recipe.start_student(teacher, tok, head="base")
    train = encoded(tok, 256, seed=4).select_columns(["input_ids", "attention_mask"])
    spec = recipe.layer_wise_spec(2, 4)
    assert spec.layer_map == build_layer_map("last", 2, 4) and spec.options.n_relation_heads == 4
    out = distill(teacher, student, spec, TrainRun(tmp_path / "gd", train, tokenizer=tok, args={
        **FAST, "logging_steps": 2, "learning_rate": 5e-3, "per_device_train_batch_size": 16, "num_train_epochs": 3}))
    values = losses(out)
    assert sum(values[-3:]) < 0.8 * sum(values[:3]), values


def test_masking_follows_the_official_rates(tok):
    ids = encoded(tok, 512, seed=5)["input_ids"]
    rows = [[i for i in r if i != tok.pad_token_id] for r in ids]
    counts = token_counts(rows, len(tok))
    weights = masking_weights(counts, 0.7, tok.all_special_ids)
    batch = SmoothedMaskingCollator(tok, weights, 0.15, seed=0)([{"input_ids": r} for r in rows])
    chosen = batch["labels"] != -100
    n_tokens = int(batch["attention_mask"].sum())
    assert int(chosen.sum()) == -(-15 * n_tokens // 100)  # ceil(0.15 * tokens)
    assert not bool(chosen[:, 0].any())  # [CLS] is never a target
    masked = (batch["input_ids"][chosen] == tok.mask_token_id).float().mean().item()
    assert 0.72 < masked < 0.88
    # smoothing: a rare token is more likely to be chosen than a frequent one
    rare = weights[torch.as_tensor([i for i in range(len(tok)) if counts[i] > 0])]
    assert rare.max() > rare.min()


def test_student_dropout_reaches_the_task_stage_students(tok):
    from distillery.recipes.steps import student_start
    from distillery.training.plan import start_factory

    teacher = transformers.BertForSequenceClassification(bert_config(len(tok), 4))

    def start(data):
        p = parse_params(data)
        task = task_of(teacher, tok, None, None)
        return p, start_factory(student_start(p.students["tinybert-demo"]), task, {}, p.task_distillation)()

    data = demo()
    p, model = start(data)
    assert p.task_distillation.student_dropout is None  # unset: the config's (BERT's 0.1)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    data["task_distillation"]["student_dropout"] = 0.0
    _, model = start(data)
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.0}
    assert model.config.hidden_dropout_prob == model.config.attention_probs_dropout_prob == 0.0


@pytest.mark.parametrize("tuned, distilled, kept, mode", [(0.85, 0.83, "grid", True),
                                                           (0.83, 0.85, "grid-distill", "augmented"),
                                                           (0.84, 0.84, "grid-distill", True)])
def test_the_extra_step_is_kept_only_when_it_is_not_worse_on_dev(monkeypatch, tmp_path, tuned, distilled, kept, mode):
    """`task_distillation: true`: the extra step's runs join the fine-tuning grid's candidates; the student is the
    better on dev (a tie keeps the extra step), so an extra step that hurts on dev (DistilBERT on SST-2: 84.9 -> 83.6)
    no longer replaces the fine-tuned student. `augmented`: the same step on the augmented set (the task stage then
    depends on it), the fine-tuning grid on the gold set."""
    from distillery.recipes import task_plan
    from distillery.training import grid as grid_module, plan as plan_module
    from distillery.training.grid import GridResult

    def result(folder, main):
        run = {"name": "lr0.0001-bs32", "main": main, "model_dir": str(tmp_path / folder / "model")}
        return GridResult(best_dir=tmp_path / folder / "model", best=run, results=[run])

    started = []

    def grid(step, start, loss, out, shared_logits):
        if step.name == "grid-distill":
            started.append((start(), step.augmented))
        return result(step.name, distilled if step.name == "grid-distill" else tuned)

    # a grid step's inputs are the step itself here, which the grid below reads
    monkeypatch.setattr(plan_module, "_grid", lambda step, task, sections, out, shared: (step, out, shared))
    monkeypatch.setattr(grid_module, "prediction_grid", grid)
    student = {**demo()["students"]["distilbert-demo"], "task_distillation": mode}
    p = parse_params({**demo(), "students": {"d": student}})
    recipe = p.students["d"]
    plan = task_plan(recipe, Dims(4, 128, 4, 512, 500, "bert"), p.task_distillation)
    assert plan.augmented is (mode == "augmented")
    task = task_of(None, None, None, None)
    task.load = lambda path: path
    done = plan_module.run_plan(plan, task, p.task_distillation, tmp_path)
    assert started == [(tmp_path / "grid" / "model", mode == "augmented")]  # from the best fine-tuned run
    assert done.grid.best_dir == tmp_path / kept / "model" and done.curve == done.grid.best_dir / "train_log.csv"


def test_mobilebert_intermediate_step_transfers_feature_maps_and_attention_on_the_task(tok, tmp_path):
    """`intermediate_step: true` for MobileBERT (a CPU-budget option; the paper fine-tunes only): eqs. 2-3 from the
    fine-tuned teacher on the task's training set, then fine-tuning from that model; refused where the student's layers
    do not match the teacher's, and by a recipe without a layer-wise task step (DistilBERT)."""
    from distillery.recipes import RecipeError, task_plan
    from distillery.training.plan import run_plan

    teacher, train, dev = finetuned_teacher(tok, tmp_path / "teacher")
    dims = Dims.of_config(teacher.config)
    shape = {"preset": "mobilebert-tiny-no-opt", "layers": dims.layers, "hidden": dims.hidden, "heads": dims.heads,
             "intermediate": 32, "intra": 16, "embedding": dims.hidden}
    recipe = MobileBertRecipe(shape=shape, general_distillation=False, intermediate_step=True)
    sections = task_sections()
    plan = task_plan(recipe, dims, sections)
    assert [s.name for s in plan.steps] == ["intermediate", "grid"]
    assert set(plan.steps[0].loss.objectives.active()) == {"feature_map_loss", "attention_transfer_loss"}
    task = task_of(teacher, tok, train, dev, train_args={**FAST, "logging_steps": 2})
    done = run_plan(plan, task, sections, tmp_path / "student")
    rows = [r for r in read_log(done.curve) if r.get("loss")]
    assert {"train_feature_map_loss", "train_attention_transfer_loss"} <= set(rows[0])
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"]), rows
    wide = {**shape, "hidden": 2 * dims.hidden, "embedding": 2 * dims.hidden}
    wide = MobileBertRecipe(shape=wide, general_distillation=True, intermediate_step=True)
    with pytest.raises(RecipeError, match="intermediate_step"):
        wide.check(dims, "students.mb")
    with pytest.raises(RecipeError, match="intermediate_step"):
        DistilBertRecipe(shape={"layers": 2, "hidden": dims.hidden, "heads": dims.heads, "intermediate": 64},
                         intermediate_step=True).check(dims, "students.db")


def test_an_augmented_extra_step_makes_the_task_stage_read_the_augmented_set():
    """`task_distillation: augmented` puts the augmented set among the task stage's inputs (its cache key and
    dvc.yaml deps); `true` does not."""
    from tasks import paths
    from tasks.distill import task_inputs

    data = demo()
    assert data["augment"]["enabled"]
    for mode, reads in ((True, False), ("augmented", True)):
        data["students"]["minilm-demo"]["task_distillation"] = mode
        task = data["data"]["tasks"][0]
        assert (paths.augmented(task) in task_inputs(parse_params(data), f"minilm-demo:{task}")) is reads


def test_minilm_intermediate_step_distils_the_last_layer_on_the_task_before_fine_tuning(tok, tmp_path):
    """`intermediate_step: true` (a CPU-budget option; the paper distils task-agnostically only): eqs. 6-9 from the
    fine-tuned teacher on the task's training set, then fine-tuning starts from that model, not from the init."""
    import json

    from distillery.recipes import task_plan
    from distillery.training.plan import run_plan

    teacher, train, dev = finetuned_teacher(tok, tmp_path / "teacher")
    sections = task_sections()
    loaded = []
    task = task_of(teacher, tok, train, dev, train_args={**FAST, "logging_steps": 2})
    load = task.load

    def recorded(path):
        loaded.append(path)
        return load(path)

    task.load = recorded
    shape = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}
    with pytest.raises(ValueError, match="intermediate_step"):
        MiniLMRecipe(shape=shape, intermediate_step="sometimes")
    recipe = MiniLMRecipe(shape=shape, init={"teacher_layers": [1, 3]}, general_distillation=False,
                          intermediate_step=True)
    plan = task_plan(recipe, Dims.of_config(teacher.config), sections)
    done = run_plan(plan, task, sections, tmp_path / "student")
    grid, curve = done.grid, done.curve
    step1 = tmp_path / "student" / "intermediate" / "model"
    assert curve == step1 / "train_log.csv" and loaded == [step1]  # fine-tuning started from step 1's model
    rows = [r for r in read_log(curve) if r.get("loss")]
    assert {"train_attention_kl", "train_value_relation_kl"} <= set(rows[0])
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"]), rows
    assert json.loads((grid.best_dir / "metrics.json").read_text())["eval_accuracy"] > 0.7
    # an interrupted stage reuses a finished step 1 under the same key
    run_plan(plan, task, sections, tmp_path / "student")
    assert loaded == [step1, step1]


def test_a_student_cut_from_its_distilled_wide_twin(tok, tmp_path, monkeypatch):
    """`init: {pruned: {source: student}}`: the task stage first trains the student at the teacher's width from the
    teacher's layers (the recipe's own task stage, under out/wide), then cuts that student's best run to the shape
    (its kept slices, ranked on the training inputs) and fine-tunes the cut on the gold labels. Its direct baseline
    starts from the teacher cut in one go. Refused with a general stage or a shape that is not BERT's."""
    import json

    from distillery.pruning import measure_importance, prune_teacher, sample_batches
    from distillery.recipes import RecipeError, task_plan
    from distillery.recipes.checks import check_student, wide_student
    from distillery.recipes.steps import init_start
    from distillery.training.plan import run_plan, start_factory

    teacher, train, dev = finetuned_teacher(tok, tmp_path / "teacher")
    sections = task_sections()
    loaded, cuts = [], []
    task = task_of(teacher, tok, train, dev)
    load = task.load

    def recorded(path):
        loaded.append(path)
        return load(path)

    task.load = recorded
    dims = Dims.of_config(teacher.config)
    narrow = {"layers": 2, "hidden": 16, "heads": 1, "intermediate": 32}
    recipe = MiniLMRecipe(shape=narrow, init={"pruned": {"teacher_layers": [1, 3], "source": "student",
                                                          "samples": 64}})
    check_student(recipe, dims, "students.s")  # the cut is fine-tuned: 1 head is fine
    with pytest.raises(RecipeError, match="compare heads one by one"):
        recipe.check(dims, "students.s")  # what distilling the cut would need
    wide = wide_student(recipe, dims)
    assert (wide.init.kind, wide.init.teacher_layers, wide.shape.hidden, wide.shape.intermediate) == (
        "teacher_layers", [1, 3], 32, 64)

    real_prune = prune_teacher

    def spy(model, *a, **kw):  # the model the grid fine-tunes is the cut of the wide run
        cut = real_prune(model, *a, **kw)
        cuts.append((model, {k: v.clone() for k, v in cut.state_dict().items()}, cut.kept_channels))
        return cut

    monkeypatch.setattr("distillery.pruning.prune_teacher", spy)
    done = run_plan(task_plan(recipe, dims, sections), task, sections, tmp_path / "student")
    grid = done.grid
    wide_dir = tmp_path / "student" / "wide" / "grid"
    assert done.curve == grid.best_dir / "train_log.csv"  # no step of its own: the best run's curve
    assert loaded and all(Path(p).is_relative_to(wide_dir) for p in loaded)
    (model, cut, kept), = cuts
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    imp = measure_importance(model, sample_batches(train, tok, 64), [0, 1])
    again = real_prune(model, [0, 1], hidden=16, heads=1, intermediate=32, importance=imp)
    assert cut.keys() == again.state_dict().keys()
    assert all(torch.equal(cut[k], v) for k, v in again.state_dict().items())
    emb = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(cut[emb], model.state_dict()[emb][:, kept])
    best = transformers.AutoModelForSequenceClassification.from_pretrained(grid.best_dir)
    assert (best.config.hidden_size, best.config.intermediate_size) == (16, 32)
    assert json.loads((grid.best_dir / "metrics.json").read_text())["eval_accuracy"] > 0.7
    direct = start_factory(init_start(recipe), task, {}, sections)()  # the baseline: the teacher cut in one go
    assert direct.config.hidden_size == 16 and not torch.equal(direct.state_dict()[emb], cut[emb])
    full = MiniLMRecipe(shape={**narrow, "hidden": 32, "heads": 2, "intermediate": 64},
                        init={"pruned": {"teacher_layers": [1, 3], "source": "student"}})
    cuts.clear()
    whole = run_plan(task_plan(full, dims, sections), task, sections, tmp_path / "full").grid  # nothing to cut
    assert not cuts and not (tmp_path / "full" / "wide").exists() and whole.best_dir.is_relative_to(tmp_path / "full")
    with pytest.raises(RecipeError, match="general_distillation: false"):
        check_student(MiniLMRecipe(shape=narrow, init={"pruned": {"source": "student"}}, general_distillation=True),
                      dims, "students.s")
    with pytest.raises(RecipeError, match="cuts a bert student"):
        check_student(MiniLMRecipe(shape={**narrow, "arch": "distilbert"}, init={"pruned": {"source": "student"}}),
                      dims, "students.s")


def test_a_tinybert_cut_goes_through_step_2_again(monkeypatch, tmp_path):
    """TinyBERT's cut of its distilled twin is trained by step 2 (prediction-layer distillation from the teacher, on
    the augmented set: CoLA 19.0 MCC over 3 seeds against 16.3 fine-tuned on the gold labels), not by the gold
    fine-tuning grid the other recipes give it; the twin goes through steps 1 and 2 under wide/ first, and both step
    2 grids read one cache of the teacher's logits."""
    from types import SimpleNamespace

    from distillery import pruning
    from distillery.recipes import task_plan
    from distillery.training import grid as grid_module, plan as plan_module
    from distillery.training.grid import GridResult

    def result(out):
        run = {"name": "lr0.0001-bs32", "main": 0.5, "model_dir": str(out / "lr0.0001-bs32" / "model")}
        return GridResult(best_dir=out / "lr0.0001-bs32" / "model", best=run, results=[run])

    steps = []
    monkeypatch.setattr(TinyBertRecipe, "start_student", lambda self, *a, **kw: "teacher layers")

    def step1(step, task, sections, start, out):
        steps.append(("step 1", start(), step.augmented))
        return out / "model"

    def step2(step, start, loss, out, shared_logits):
        steps.append(("step 2", start(), step.augmented, out / step.name, out / shared_logits))
        return result(out / step.name)

    monkeypatch.setattr(plan_module, "_one_run", step1)
    # a grid step's inputs are the step itself here, which step 2 below reads
    monkeypatch.setattr(plan_module, "_grid", lambda step, task, sections, out, shared: (step, out, shared))
    monkeypatch.setattr(grid_module, "prediction_grid", step2)
    monkeypatch.setattr(pruning, "sample_batches", lambda data, tokenizer, samples: None)
    monkeypatch.setattr(pruning, "measure_importance", lambda model, batches, layers: None)
    monkeypatch.setattr(pruning, "prune_teacher", lambda model, layers, **shape: ("cut", model, shape["hidden"]))
    config = transformers.BertConfig(num_hidden_layers=4, hidden_size=32, num_attention_heads=2, intermediate_size=64)
    task = task_of(SimpleNamespace(config=config), None, [], [], augmented=[])
    task.load = lambda path: f"loaded {path}"
    recipe = TinyBertRecipe(shape={"layers": 2, "hidden": 16, "heads": 1, "intermediate": 32},
                            init={"pruned": {"teacher_layers": [1, 3], "source": "student"}})
    sections = task_sections()
    plan = task_plan(recipe, Dims.of_config(config), sections)
    assert [s.name for s in plan.steps] == ["wide/intermediate", "wide/grid", "grid"]
    assert [s.schedule for s in plan.steps] == ["intermediate", "prediction", "prediction"]  # never `finetune`
    done = plan_module.run_plan(plan, task, sections, tmp_path)
    wide = tmp_path / "wide"
    twin_best = wide / "grid" / "lr0.0001-bs32" / "model"
    cache = tmp_path / "teacher_logits"  # one cache of the teacher's logits for both: the same teacher and inputs
    assert steps == [("step 1", "teacher layers", True),
                     ("step 2", f"loaded {wide / 'intermediate' / 'model'}", True, wide / "grid", cache),
                     ("step 2", ("cut", f"loaded {twin_best}", 16), True, tmp_path / "grid", cache)]
    assert done.grid.best_dir == tmp_path / "grid" / "lr0.0001-bs32" / "model"
    assert done.curve == done.grid.best_dir / "train_log.csv"


def test_layers_from_says_where_a_student_without_a_general_stage_starts(tok, tmp_path):
    """`layers_from`: a DistilBERT student that skips general distillation starts from the pre-trained teacher's
    layers with `pretrained` (the paper's start; by default it takes the fine-tuned teacher's), a BERT-PKD student from
    the fine-tuned teacher's with `finetuned` (by default, as in the official code, BERT_k from pre-trained BERT's first
    k layers, with a fresh classifier); its direct baseline starts at the same place. Refused where it cannot hold:
    with general distillation (which starts from the pre-trained layers) or an init that takes no teacher layers."""
    from distillery.recipes.pkd import PKDRecipe as PKD
    from distillery.recipes.steps import init_start, starts_from_pretrained_layers, student_start
    from distillery.training.plan import start_factory

    torch.manual_seed(0)
    pretrained = transformers.BertForMaskedLM(bert_config(tok.vocab_size, 4))
    pretrained.save_pretrained(tmp_path / "mlm")
    finetuned = transformers.BertForSequenceClassification(bert_config(tok.vocab_size, 4, num_labels=2))
    task = task_of(finetuned, tok, None, None, pretrained=str(tmp_path / "mlm"))
    sections = task_sections()
    bert = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}
    cases = [(DistilBertRecipe, {"shape": {**bert, "arch": "distilbert"}, "init": {"teacher_layers": [1, 3]},
                                 "general_distillation": False}, lambda m, j: m.distilbert.transformer.layer[j].ffn.lin2),
             (PKD, {"shape": bert}, lambda m, j: m.bert.encoder.layer[j].output.dense)]
    for cls, fields, student_layer in cases:
        for layers_from in (None, "pretrained", "finetuned"):  # None: the recipe's default
            recipe = cls(**fields, **({"layers_from": layers_from} if layers_from else {}))
            from_pretrained = layers_from == "pretrained" or (layers_from is None and cls is PKD)
            assert starts_from_pretrained_layers(recipe) == from_pretrained
            source, other = (pretrained.bert, finetuned.bert) if from_pretrained else (finetuned.bert, pretrained.bert)
            taken = [1, 3] if cls is DistilBertRecipe else [0, 1]  # BERT-PKD: the first k
            for general in (True, False):  # the student's start, and its direct baseline's
                start = student_start(recipe) if general else init_start(recipe)
                student = start_factory(start, task, {}, sections)()
                for j, t in enumerate(taken):
                    weight = student_layer(student, j).weight
                    assert torch.equal(weight, source.encoder.layer[t].output.dense.weight), (cls, layers_from)
                    assert not torch.equal(weight, other.encoder.layer[t].output.dense.weight)
    with pytest.raises(ValueError, match="general_distillation: false"):
        DistilBertRecipe(shape={**bert, "arch": "distilbert"}, init={"teacher_layers": [1, 3]},
                         layers_from="finetuned", general_distillation=True)
    with pytest.raises(ValueError, match="needs an init from teacher layers"):
        TinyBertRecipe(shape=bert, layers_from="pretrained")
