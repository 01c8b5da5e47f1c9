"""Teachers beyond BERT: RoBERTa, XLM-R and ELECTRA (BERT's layer, other names and tokenizers) distil with every
objective; DeBERTa-v2 and ModernBERT (attention `distillery.capture` cannot read) with those on hidden states and
logits, and an attention objective is refused before any work. Each teacher is a tiny random model built from its
config here, with a tokenizer trained here on the demo corpus (`tokenizers`): nothing is downloaded."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import MICRO, env_for, make_project

READABLE = ("roberta", "xlm-roberta", "electra")
HIDDEN_ONLY = ("deberta-v2", "modernbert")


def _corpus(tmp: Path) -> list[str]:
    from distillery.demo import make_demo_corpus, make_demo_task

    lines = Path(make_demo_corpus(tmp / "corpus.txt", n_documents=80, seed=1)).read_text().splitlines()
    task = make_demo_task(tmp / "task", n_train=200, n_dev=10, n_test=10, seed=1)
    return [line for line in lines if line.strip()] + [
        row.split("\t")[0] for f in sorted(Path(task).glob("*.tsv")) for row in f.read_text().splitlines()[1:]]


def _tokenizer(kind: str, texts: list[str]):
    """A fast tokenizer of the model family's kind (byte-level BPE, Unigram, WordPiece), trained on `texts`."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    roberta_like = kind in ("roberta", "xlm-roberta")
    cls, sep, pad, unk, mask = ("<s>", "</s>", "<pad>", "<unk>", "<mask>") if roberta_like else (
        "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
    specials = [cls, pad, sep, unk, mask]
    if kind in ("roberta", "modernbert"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind in ("xlm-roberta", "deberta-v2"):
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token=unk)
    else:  # electra: BERT's WordPiece, with token types
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    tok.train_from_iterator(texts, trainer)
    pair = f"{cls} $A {sep} {sep} $B:1 {sep}:1" if roberta_like else f"{cls} $A {sep} $B:1 {sep}:1"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in (cls, sep)])
    inputs = ["input_ids", "token_type_ids", "attention_mask"] if kind == "electra" else ["input_ids", "attention_mask"]
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, cls_token=cls, sep_token=sep, pad_token=pad,
                                                unk_token=unk, mask_token=mask, model_input_names=inputs)


def _config(kind: str, tok):
    import transformers

    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    if kind in ("roberta", "xlm-roberta"):  # positions start after the padding index
        return transformers.AutoConfig.for_model(kind, max_position_embeddings=82, type_vocab_size=1, **size)
    if kind == "electra":  # factorised embeddings, as ELECTRA-small
        return transformers.ElectraConfig(max_position_embeddings=80, embedding_size=16, **size)
    if kind == "deberta-v2":
        return transformers.DebertaV2Config(max_position_embeddings=80, **size)
    return transformers.ModernBertConfig(max_position_embeddings=80, cls_token_id=tok.cls_token_id,
                                         sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                                         eos_token_id=tok.sep_token_id, global_attn_every_n_layers=2, **size)


@pytest.fixture(scope="module")
def teachers(tmp_path_factory):
    """kind -> a directory with a tiny random masked-LM encoder of that kind and its trained tokenizer."""
    import transformers

    root = tmp_path_factory.mktemp("teachers")
    texts = _corpus(root)
    out = {}
    for kind in (*READABLE, *HIDDEN_ONLY):
        tok = _tokenizer(kind, texts)
        torch.manual_seed(0)
        transformers.AutoModelForMaskedLM.from_config(_config(kind, tok)).save_pretrained(root / kind)
        tok.save_pretrained(root / kind)
        out[kind] = root / kind
    return out


def _batch(tok):
    enc = tok(["the film was very good", "a dull plot"], ["truly", "not at all awful and long"], padding=True,
              return_tensors="pt")
    assert not bool(enc["attention_mask"].all())  # padding in the batch
    return enc


@pytest.mark.parametrize("kind", [*READABLE, *HIDDEN_ONLY])
def test_students_are_of_the_teachers_type_and_capture_reads_them(teachers, kind):
    """A bert-shaped student of such a teacher is of the teacher's type; a student from the teacher's layers holds
    their weights; capture's hidden states are the model's own; its attention distributions (where it reads them)
    are the eager attention's, padding included; elsewhere an attention capture names the model type."""
    import transformers

    from distillery.capture import CaptureError, capture
    from distillery.efficiency import FlopsConfigError, flops_per_example
    from distillery.models import build_student, init_from_teacher_layers

    tok = transformers.AutoTokenizer.from_pretrained(teachers[kind])
    teacher = transformers.AutoModelForSequenceClassification.from_pretrained(
        teachers[kind], num_labels=2, attn_implementation="eager").eval()
    student = build_student({"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24}, len(tok),
                            head="sequence-classification", base=teacher.config)
    assert type(student) is type(teacher) and student.config.hidden_size == 16
    assert student.config.num_hidden_layers == 1 and student.config.intermediate_size == 24

    subset = init_from_teacher_layers(teacher, [1])
    assert type(subset) is type(teacher) and subset.config.num_hidden_layers == 1
    source = teacher.state_dict()  # every student weight is the teacher's, its layer 0 the teacher's layer 1
    # (ModernBERT's first layer has no attention norm: the embeddings are normalised; layer 1's norm is left out)
    moved = {k: k.replace("layer.0.", "layer.1.").replace("layers.0.", "layers.1.") for k in subset.state_dict()}
    assert sum(k != v for k, v in moved.items()) >= 5  # attention and feed-forward weights at least
    assert all(torch.equal(w, source[moved[k]]) for k, w in subset.state_dict().items())

    enc = _batch(tok)
    with torch.no_grad():
        ref = teacher(**enc, output_hidden_states=True, output_attentions=kind in READABLE)
        if kind in READABLE:
            with capture(teacher, hidden=[0, 1], probs=[0, 1]) as got:
                teacher(**enc)
            for layer in (0, 1):
                keep = enc["attention_mask"].bool()[:, None, :, None]  # real query rows
                assert torch.allclose(got.probs[layer] * keep, ref.attentions[layer] * keep, atol=1e-6)
        else:
            with pytest.raises(CaptureError, match=f"the attention of a {kind} model cannot be read"):
                with capture(teacher, scores=[0]):
                    teacher(**enc)
            with capture(teacher, hidden=[0, 1]) as got:
                teacher(**enc)
    for state in (0, 1):
        assert torch.allclose(got.hidden[state], ref.hidden_states[state], atol=1e-6)

    if kind == "deberta-v2":  # relative-position attention: no analytic count
        with pytest.raises(FlopsConfigError, match="deberta-v2"):
            flops_per_example(teacher.config, 16)
    else:
        assert flops_per_example(teacher.config, 16) > flops_per_example(student.config, 16) > 0


def _project(tmp: Path, teacher: Path, students: dict) -> Path:
    p = copy.deepcopy(MICRO)
    p.update(teacher={"init": "pretrained", "name_or_path": str(teacher)}, students=students,
             pretrain={"epochs": 1, "learning_rate": 1e-3, "batch_size": 32, "max_length": 32},
             teacher_finetune={"epochs": 8, "learning_rate": 1e-3, "batch_size": 16, "warmup_ratio": 0.1})
    p["evaluation"] = {**p["evaluation"], "latency": False}
    # PKD starts from the pre-trained teacher's layers (one epoch of MLM here): it needs the teacher's fine-tuning
    p["task_distillation"] = {**p["task_distillation"], "finetune": {"learning_rates": [1e-3], "batch_sizes": [16], "epochs": 8}}
    return make_project(tmp, p, dvc_yaml=False)


TINYBERT = {"recipe": "tinybert", "shape": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32}}
PKD = {"recipe": "pkd", "shape": {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64}}


def test_an_attention_objective_of_a_teacher_whose_attention_cannot_be_read_is_refused(teachers, tmp_path):
    project = _project(tmp_path, teachers["deberta-v2"], {"micro": TINYBERT})
    proc = subprocess.run([sys.executable, "-m", "flows.stage", "all"], cwd=project, env=env_for(project),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: params.yaml: students.micro: attention_loss (tinybert) reads attention, which cannot be read in a "
        "deberta-v2 teacher (only in bert, camembert, distilbert, electra, mobilebert, roberta, xlm-roberta); give "
        "objectives on hidden states or logits (e.g. recipe pkd, or objectives without it)"]
    assert not (project / "models").exists() and not (project / "data").exists()


@pytest.mark.parametrize("kind", [*READABLE, *HIDDEN_ONLY])
def test_a_teacher_of_another_family_distils_through_the_demo_task(teachers, tmp_path, kind):
    """Continued MLM, fine-tuning, augmentation with its MLM and tokenizer, general and task distillation (TinyBERT
    where attention is read), PKD, direct baselines, evaluation with int8 ONNX, the report: students of the teacher's
    type (PKD's, started from the pre-trained teacher's layers, learns the task without a teacher), PKD's patient loss
    and TinyBERT's general distillation loss falling.

    Whether PKD's student beats its direct baseline is not asked of these one-epoch-MLM teachers (dev ~0.75): on the
    XLM-R one (2026-11-26) the patient loss, at beta 100 and at 10 with alpha 0.2, kept the student at chance (0.5)
    while its direct baseline reached 0.77, as did beta 0 (plain KD)."""
    students = {"micro-pkd": PKD, **({"micro": TINYBERT} if kind in READABLE else {})}
    project = _project(tmp_path, teachers[kind], students)
    env = {**env_for(project), "DISTILLERY_TRACKING": "off"}
    proc = subprocess.run([sys.executable, "-m", "flows.stage", "all"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((project / "metrics" / "summary.json").read_text())["demo"]
    assert summary["teacher"]["passed_gate"] and summary["teacher"]["accuracy"] > summary["trivial"]["accuracy"]
    assert summary["micro-pkd-direct"]["accuracy"] >= summary["trivial"]["accuracy"] + 0.1
    import csv

    with (project / "models" / "students" / "micro-pkd-demo" / "model" / "train_log.csv").open() as f:
        patient = [float(r["train_patient_loss"]) for r in csv.DictReader(f) if r.get("train_patient_loss")]
    assert patient[-1] < patient[0] / 2, patient
    for name in students:
        assert {name, f"{name}-int8", f"{name}-direct"} <= set(summary)
        config = json.loads((project / "models" / "students" / f"{name}-demo" / "model" / "config.json").read_text())
        assert config["model_type"] == kind
    if "micro" in students:
        with (project / "metrics" / "curves" / "general_distillation-micro.csv").open() as f:
            losses = [float(r["loss"]) for r in csv.DictReader(f) if r["loss"]]
        assert losses[-1] < losses[0]
    assert (project / "data" / "augmented" / "demo.tsv").is_file()
