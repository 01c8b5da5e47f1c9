"""The precision switch (distillery.precision): what `auto` resolves to, the refusal of an explicit bf16 where the
device has no fast bf16, every objective's bf16 value beside its fp32 value on the same inputs, and a tiny model
trained in bf16 beside the same run in fp32."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
import yaml

from distillery import precision
from distillery.training import cpu_kernels
from distillery.config import ConfigError
from distillery.preflight import load_params
from distillery.layer_map import build_layer_map
from distillery.objectives import TERMS, LossOptions
from distillery.training.distill import Distiller, distill, make_projection
from distillery.training.finetune import finetune
from distillery.training.metrics import accuracy
from distillery.training.spec import DistillSpec, TrainRun

from helpers import FAST, ROOT, classifier, encoded, tokenizer  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on one intra-op thread (tests/conftest.py)

needs_bf16 = pytest.mark.skipif(not precision.bf16_supported("cpu"), reason="this CPU has no fast bf16")


@pytest.fixture
def no_bf16(monkeypatch):
    """A CPU without AMX or AVX512-BF16 (and no GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ())


def test_auto_is_bf16_only_where_the_cpu_is_fast_at_it(monkeypatch, no_bf16):
    assert precision.resolve("auto") == "fp32" and precision.resolve("fp32") == "fp32"
    assert precision.describe("auto") == "precision: fp32 (auto: this CPU has none of amx_bf16, avx512_bf16)"
    with pytest.raises(precision.PrecisionError, match="bf16 needs fast bf16 and this CPU has none of"):
        precision.resolve("bf16")
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert precision.resolve("auto") == precision.resolve("bf16") == "bf16"
    assert precision.describe("auto") == "precision: bf16 on cpu (avx512_bf16) (autocast; weights stay fp32)"
    with pytest.raises(precision.PrecisionError, match="'fp16' is not one of auto, fp32, bf16"):
        precision.resolve("fp16")


def test_the_flags_are_read_from_the_machine_not_a_cpu_name():
    flags = precision.cpu_bf16_flags()
    assert set(flags) <= set(precision.CPU_FLAGS)
    text = open("/proc/cpuinfo", encoding="utf-8").read().split() if __import__("os").path.exists("/proc/cpuinfo") else []
    assert {f for f in precision.CPU_FLAGS if f in text} <= set(flags)


def test_the_library_default_is_fp32_on_a_cpu_and_use_scopes_the_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("amx_bf16",))
    assert precision.current() == "fp32" and precision.trainer_options() == {"bf16": False}
    with precision.use("auto") as used:
        assert used == "bf16" and precision.current() == "bf16"
        assert precision.trainer_options() == {"bf16": True, "use_cpu": True}
        with precision.use("fp32"):
            assert precision.current() == "fp32" and not torch.is_autocast_enabled("cpu")
            with precision.autocast("cpu"):
                assert not torch.is_autocast_enabled("cpu")
        with precision.autocast("cpu"):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert precision.current() == "fp32"


def _params_file(tmp_path, value: str):
    data = yaml.safe_load((ROOT / "params.yaml").read_text())
    data["precision"] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_explicit_bf16_without_fast_bf16_is_one_error_naming_the_key(tmp_path, no_bf16):
    with pytest.raises(ConfigError) as exc:
        load_params(_params_file(tmp_path, "bf16"), root=ROOT)
    assert str(exc.value).splitlines() == [f"{tmp_path / 'params.yaml'}: precision: bf16 needs fast bf16 and this CPU "
                                           "has none of amx_bf16, avx512_bf16; use auto or fp32"]
    assert load_params(_params_file(tmp_path, "auto"), root=ROOT).precision == "auto"
    with pytest.raises(ConfigError, match=r"params.yaml: precision: Input should be 'auto', 'fp32' or 'bf16'"):
        load_params(_params_file(tmp_path, "fp16"), root=ROOT)


def test_the_pipeline_refuses_bf16_before_any_work_with_one_line(tmp_path, no_bf16, capsys):
    from flows import stage as stage_cli

    code = stage_cli.main(["all", "--params", str(_params_file(tmp_path, "bf16"))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and ": precision: bf16 needs" in err[0]


def test_device_stages_key_on_the_precision_they_compute_in(monkeypatch):
    """A device stage's key and dvc params hold the setting and what it resolves to here; a file stage's do not."""
    from flows.stages import STAGES
    from tasks.stage import stage_key

    p = load_params(ROOT / "params.yaml", root=ROOT)
    finetune_stage, prepare = STAGES["finetune_teacher"], STAGES["prepare_task"]
    assert finetune_stage.params(p, "demo")["precision"] == "auto" and "precision" not in prepare.params(p, "demo")
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bf16_key, prepare_key = stage_key(finetune_stage, p, "demo"), stage_key(prepare, p, "demo")
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ())
    assert stage_key(finetune_stage, p, "demo") != bf16_key  # auto gave fp32 on this "CPU": other outputs
    assert stage_key(prepare, p, "demo") == prepare_key


# ------------------------------------------------------------------------------------------------ numerics

VOCAB = 60
#: the largest relative difference allowed between an objective's bf16-autocast value and its fp32 value on the same
#: inputs (bf16 keeps 8 bits of mantissa, ~0.4% per rounding; measured on these models: at most 0.04%, soft targets)
LOSS_RTOL = 0.01


def _models(term: str):
    """(teacher, student, extra batch keys) for a term: MLM-headed models for the pre-training terms, a regression
    head for the regression term, classifiers otherwise; no dropout, so both passes see the same network."""
    torch.manual_seed(0)
    kw = dict(vocab_size=VOCAB, num_attention_heads=4, max_position_embeddings=32, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
    t_cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128, **kw)
    s_cfg = transformers.BertConfig(hidden_size=64,  # equal widths: MobileBERT, PKD and DistilBERT compare states as they are
                                    num_hidden_layers=1, intermediate_size=64, **kw)
    if "pretraining" in TERMS[term].levels and TERMS[term].levels != ("intermediate", "pretraining"):
        make = transformers.BertForPreTraining
    else:
        make = transformers.BertForSequenceClassification
        t_cfg.num_labels = s_cfg.num_labels = 1 if term == "regression_prediction_loss" else 3
    return make(t_cfg).eval(), make(s_cfg).train()


def _batch(term: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, VOCAB, (6, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = mask[4, 5:] = 0
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    if "pretraining" in TERMS[term].levels and TERMS[term].levels != ("intermediate", "pretraining"):
        labels = torch.full_like(ids, -100)
        labels[:, 2] = ids[:, 2]
        labels[:, 6] = ids[:, 6]
        out.update(labels=labels, next_sentence_label=torch.tensor([0, 1, 0, 1, 1, 0]))
    elif TERMS[term].levels == ("prediction",):
        out["labels"] = (torch.rand(6, generator=g) * 5 if term == "regression_prediction_loss"
                         else torch.tensor([0, 1, 2, 0, 1, 2]))
    return out


@needs_bf16
@pytest.mark.parametrize("term", sorted(TERMS))
def test_every_objective_under_bf16_autocast_is_within_tolerance_of_fp32(term):
    """The same student, teacher and batch: the term in bf16 autocast (features and logits from bf16 matmuls, the
    objective itself in fp32) within LOSS_RTOL of the fp32 run, and the gradients point the same way."""
    teacher, student = _models(term)
    level = TERMS[term].levels[0]
    layer_map = build_layer_map("uniform", 1, 2)
    spec = DistillSpec({term: 1.0}, level, layer_map, options=LossOptions(n_relation_heads=4, temperature=2.0))
    projection = make_projection(student, teacher, layer_map) if TERMS[term].projection else None
    distiller = Distiller(student, teacher, spec, projection)
    batch = _batch(term)

    def run(bf16: bool):
        distiller.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = distiller(**batch)
        value = out.terms[term]
        assert value.dtype == torch.float32  # the reduction ran in fp32
        value.backward()
        grad = torch.cat([p.grad.flatten() for p in distiller.parameters() if p.grad is not None])
        return float(value.detach()), grad

    v32, g32 = run(False)
    v16, g16 = run(True)
    assert v32 > 0
    assert v16 == pytest.approx(v32, rel=LOSS_RTOL), (v16, v32)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.98


def test_a_cpu_trains_bf16_with_the_eager_attention_and_infers_with_sdpa(monkeypatch):
    """Training's bf16 backward is the faster with the eager attention; inference keeps the model's own SDPA, inside
    the CPU kernels' attention, which picks it or its own computation (tests/test_cpu_kernels.py); fp32 and GPUs keep
    the model's own attention."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    model, _ = _models("attention_loss")
    model.set_attn_implementation("sdpa")
    assert precision.fast_attention(model, "cpu", "fp32", training=True).config._attn_implementation == "sdpa"
    assert precision.fast_attention(model, "cpu", "bf16", training=True).config._attn_implementation == "eager"
    precision.fast_attention(model, "cpu", "bf16")  # the same model, trained, now evaluated
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")
    with precision.use("bf16"), precision.forwards(model, "cpu"), cpu_kernels.used(model, "cpu"):
        assert model.config._attn_implementation == cpu_kernels.ATTENTION and torch.is_autocast_enabled("cpu")
    assert model.config._attn_implementation == "sdpa"


@needs_bf16
def test_attention_scores_are_captured_in_the_forwards_precision_and_probs_in_fp32():
    """Under bf16 autocast the scores are the bf16 product of the bf16 queries and keys (the attention loss reads them
    in fp32 a slice at a time), the probabilities fp32."""
    from distillery.capture import capture

    teacher, _ = _models("attention_loss")
    batch = _batch("attention_loss")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), capture(
            teacher, scores=(0,), probs=(0,), queries=(0,), keys=(0,), hidden=(1,)) as cap:
        teacher(**batch)
    q, k = cap.queries[0], cap.keys[0]
    assert cap.scores[0].dtype == q.dtype == torch.bfloat16 and cap.probs[0].dtype == torch.float32
    assert torch.equal(cap.scores[0], torch.matmul((q * q.shape[-1] ** -0.5), k.transpose(-1, -2)))
    assert cap.float().scores[0] is cap.scores[0]  # no float32 copy of them
    assert cap.float().hidden[1].dtype == torch.float32
    torch.testing.assert_close(cap.probs[0].sum(-1), torch.ones_like(cap.probs[0][..., 0]))


def test_tinybert_projection_runs_in_the_forwards_precision():
    """W_h is a linear layer: a bf16 matmul under bf16 autocast (its output float32 for the objectives), the
    projection itself without autocast."""
    from distillery.objectives import HiddenProjection
    from distillery.training.distill import in_forward_precision

    proj = HiddenProjection(8, 12)
    x = torch.randn(3, 5, 8)
    assert in_forward_precision(proj) is proj and in_forward_precision(None) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        run = in_forward_precision(proj)
    with torch.autocast("cpu", dtype=torch.bfloat16), precision.fp32_region("cpu"):
        y = run(x, 0)
    layer = proj.layers[0]
    assert y.dtype == torch.float32
    assert torch.equal(y, torch.nn.functional.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()).float())


def test_official_attention_loss_reads_bf16_scores_in_fp32():
    """bf16 scores: the loss of their float32 copies (each slice read in float32), the gradient that loss's rounded to
    bf16; several slices (a padded batch)."""
    from distillery.objectives.tinybert import CHUNK, attention_loss

    g = torch.Generator().manual_seed(3)
    b, h, n = 5, 4, 128  # CHUNK // (n * n) = 16 heads a slice: two slices
    assert b * h > CHUNK // (n * n)
    s = (torch.randn(b, h, n, n, generator=g) * 4).bfloat16()
    t = (torch.randn(b, h, n, n, generator=g) * 4).bfloat16()
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, 100:] = mask[3, 7:] = 0
    s16, s32 = s.clone().requires_grad_(), s.float().requires_grad_()
    l16, l32 = attention_loss([s16], [t], mask), attention_loss([s32], [t.float()], mask)
    assert l16.dtype == torch.float32
    torch.testing.assert_close(l16, l32, rtol=1e-6, atol=0)
    l16.backward(), l32.backward()
    assert s16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(s16.grad.float(), s32.grad, rtol=2 ** -7, atol=0)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision-task")
    tok = tokenizer(d)
    return {"tok": tok, "train": encoded(tok, 640, seed=20), "dev": encoded(tok, 200, seed=21), "dir": d}


def _train(task, name: str, setting: str):
    torch.set_num_threads(1)
    with precision.use(setting):
        out = finetune(classifier(task["tok"].vocab_size, 2, seed=3), TrainRun(
            task["dir"] / name, task["train"], task["dev"], compute_metrics=accuracy, main_score="accuracy",
            args=dict(num_train_epochs=10, learning_rate=2e-3, per_device_train_batch_size=16, save_strategy="no",
                      eval_strategy="epoch", load_best_model_at_end=False, **FAST)))
    return out, json.loads((out / "metrics.json").read_text())["eval_accuracy"]


@needs_bf16
def test_a_tiny_model_trained_in_bf16_reaches_the_fp32_score(task):
    """400 steps of fine-tuning, once in fp32 and once under bf16 autocast from the same seed: the dev accuracies
    agree within 0.05 (the noise of a 200-example dev set), the saved weights are fp32, and the runs differ (bf16
    really ran)."""
    dir32, acc32 = _train(task, "fp32", "fp32")
    dir16, acc16 = _train(task, "bf16", "bf16")
    assert acc32 > 0.9 and abs(acc16 - acc32) <= 0.05, (acc16, acc32)
    m32 = transformers.AutoModelForSequenceClassification.from_pretrained(dir32)
    m16 = transformers.AutoModelForSequenceClassification.from_pretrained(dir16)
    assert all(p.dtype == torch.float32 for p in m16.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(m32.parameters(), m16.parameters()))


@needs_bf16
def test_a_prediction_distillation_in_bf16_keeps_the_teacher_score(task):
    """TinyBERT step 2 (eq. 10) under bf16 autocast: the student reaches 0.9 of an fp32-trained teacher."""
    teacher_dir, teacher_acc = _train(task, "teacher", "fp32")
    teacher = transformers.AutoModelForSequenceClassification.from_pretrained(teacher_dir)
    student = classifier(task["tok"].vocab_size, 1, seed=4, hidden=24, inter=48)
    with precision.use("bf16"):
        out = distill(teacher, student, DistillSpec({"prediction_loss": 1.0}, "prediction"), TrainRun(
            task["dir"] / "student", task["train"], task["dev"], compute_metrics=accuracy, main_score="accuracy",
            args=dict(num_train_epochs=6, learning_rate=3e-3, per_device_train_batch_size=16, save_strategy="no",
                      eval_strategy="epoch", load_best_model_at_end=False, **FAST)))
    acc = json.loads((out / "metrics.json").read_text())["eval_accuracy"]
    assert acc >= 0.9 * teacher_acc, (acc, teacher_acc)


def test_the_benchmark_says_so_and_measures_nothing_without_fast_bf16(no_bf16, capsys):
    from benchmarks import precision as bench

    assert bench.main([]) is None
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["no bf16 to measure: this CPU has none of amx_bf16, avx512_bf16; the pipeline runs in fp32 here "
                   "(precision: auto)"]


def test_the_benchmark_times_both_precisions_interleaved():
    from benchmarks.precision import interleaved

    calls = []
    medians = interleaved({"fp32": lambda: calls.append("fp32"), "bf16": lambda: calls.append("bf16")}, reps=3)
    assert calls == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]  # warm-up, then alternating
    assert set(medians) == {"fp32", "bf16"} and all(m >= 0 for m in medians.values())


def test_inference_forwards_run_ieee_fp32_whatever_a_trainer_set():
    """A Trainer on a GPU turns TF32 on for the process; an inference forward (augmentation's top-K, an evaluation)
    runs IEEE fp32 matmuls all the same, and the setting it found is back after it."""
    backends = [torch.backends, torch.backends.cuda.matmul, torch.backends.cudnn.conv]
    before = [b.fp32_precision for b in backends]
    try:
        torch.backends.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"  # set on its own, as a Trainer's cudnn setting is
        with precision.forwards(None):
            assert [b.fp32_precision for b in backends] == ["ieee"] * 3
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    finally:
        for b, value in zip(backends, before):
            b.fp32_precision = value
