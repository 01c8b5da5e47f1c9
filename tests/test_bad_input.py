"""Bad input gets one clear line, exit code 2, no traceback (unless --debug) and nothing half-written.

Covers the `distillery` command (GLUE files, augmentation, export/speed), `python -m flows.pipeline` and
`python -m flows.stage` (params that pass the schema but cannot work, presets, task names) and a stage error
raised inside the Prefect flow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
import yaml

from distillery.cli import main as cli
from distillery.glue.loaders import GlueFileError, load_split_file
from helpers import ONE_STUDENT, env_for, make_project

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a movie film good bad great plot acting story dull charming it was is not".split()


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    capsys.readouterr()  # what building the test's models printed
    rc = cli(argv)
    return rc, error_lines(capsys.readouterr().err)


def assert_one_error(rc: int, err: list[str], *needles: str) -> None:
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    for needle in needles:
        assert needle in err[0], err[0]


def write_vocab(d: Path, extra: int = 0) -> transformers.BertTokenizerFast:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "."] + WORDS + [f"w{i}" for i in range(extra)]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return transformers.BertTokenizerFast(vocab=str(d / "vocab.txt"))


def tiny_config(vocab_size: int) -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=64)


def save_model(out: Path, cls, *, extra_tokens: int = 0) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok = write_vocab(out, extra_tokens)
    torch.manual_seed(0)
    cls(tiny_config(len(tok) - extra_tokens)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ------------------------------------------------------------------------------------------------ GLUE files

def sst2_dir(tmp_path: Path, train: bytes) -> Path:
    d = tmp_path / "glue" / "SST-2"
    d.mkdir(parents=True)
    (d / "train.tsv").write_bytes(train)
    return tmp_path / "glue"


def test_glue_file_error_is_one_line_and_exit_2(tmp_path, capsys):
    glue = sst2_dir(tmp_path, b"sentence\tlabel\na\t0\nb\t1\nc\t0\nd\t2\n")
    rc, err = run_cli(["glue", "stats", "--data-dir", str(glue)], capsys)
    assert_one_error(rc, err, f"{glue / 'SST-2' / 'train.tsv'}:5: label '2' is not one of ['0', '1']")


def test_cr_only_line_endings_load(tmp_path):
    glue = sst2_dir(tmp_path, b"sentence\tlabel\rgood movie\t1\rbad plot\t0\r")
    ds = load_split_file("sst2", glue / "SST-2" / "train.tsv")
    assert ds["text_a"][:] == ["good movie", "bad plot"] and ds["label"][:] == [1, 0]


def test_utf8_with_bom_loads(tmp_path):
    glue = sst2_dir(tmp_path, "\ufeffsentence\tlabel\ncafé\t1\n".encode("utf-8"))
    assert load_split_file("sst2", glue / "SST-2" / "train.tsv")["text_a"][:] == ["café"]


@pytest.mark.parametrize("data,needle", [
    ("sentence\tlabel\ncafé\t1\n".encode("latin-1"), ":2: byte 0xe9 is not UTF-8"),
    ("sentence\tlabel\ngood\t1\n".encode("utf-16"), ": UTF-16 text"),
    ("sentence\tlabel\ngood\t1\n".encode("utf-16-le"), ":1: NUL bytes"),
    (b"sentence\tlabel\n", ": empty split"),
], ids=["latin1", "utf16", "utf16-no-bom", "header-only"])
def test_unreadable_or_empty_split_names_the_file(tmp_path, capsys, data, needle):
    glue = sst2_dir(tmp_path, data)
    path = glue / "SST-2" / "train.tsv"
    with pytest.raises(GlueFileError, match="re-save|at least one row"):
        load_split_file("sst2", path)
    rc, err = run_cli(["glue", "stats", "--data-dir", str(glue)], capsys)
    assert_one_error(rc, err, f"{path}{needle}")


def test_debug_shows_the_traceback_and_the_command_prints_none(tmp_path):
    glue = sst2_dir(tmp_path, b"sentence\tlabel\na\t7\n")
    cmd = [sys.executable, "-m", "distillery.cli", "glue", "stats", "--data-dir", str(glue)]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 2 and plain.stdout == ""
    assert error_lines(plain.stderr) == [f"error: {glue / 'SST-2' / 'train.tsv'}:2: label '7' is not one of ['0', '1'] (sst2)"]
    debug = subprocess.run(cmd + ["--debug"], capture_output=True, text=True, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "GlueFileError" in debug.stderr


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_glue_stats_refuses_a_split_path_that_is_a_directory(tmp_path, capsys, json_flag):
    glue = sst2_dir(tmp_path, b"sentence\tlabel\ngood\t1\n")
    (glue / "SST-2" / "dev.tsv").write_bytes((glue / "SST-2" / "train.tsv").read_bytes())
    (glue / "SST-2" / "train.tsv").unlink()
    (glue / "SST-2" / "train.tsv").mkdir()
    rc, err = run_cli(["glue", "stats", "--data-dir", str(glue), *json_flag], capsys)
    assert_one_error(rc, err, f"{glue / 'SST-2' / 'train.tsv'}: the train split of sst2 is a directory")


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_glue_stats_on_a_directory_without_tasks_is_an_error(tmp_path, capsys, json_flag):
    (tmp_path / "notes.txt").write_text("not GLUE\n")
    rc, err = run_cli(["glue", "stats", "--data-dir", str(tmp_path), *json_flag], capsys)
    assert_one_error(rc, err, f"glue stats: no GLUE task found in {tmp_path}")
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------------------------------------ augmentation

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    rng = np.random.default_rng(0)
    (d / "glove.txt").write_text("".join(w + " " + " ".join(f"{x:.4f}" for x in rng.normal(size=4)) + "\n"
                                         for w in WORDS))
    return {"mlm": save_model(d / "mlm", transformers.BertForMaskedLM),
            "encoder": save_model(d / "encoder", transformers.BertModel),
            "too-big-tokenizer": save_model(d / "big", transformers.BertForSequenceClassification, extra_tokens=5),
            "glove": d / "glove.txt"}


def augment_argv(models, src: Path, out: Path, mlm: str = "mlm") -> list[str]:
    return ["augment", "--task", "sst2", "--input", str(src), "--mlm", str(models[mlm]), "--glove",
            str(models["glove"]), "--output", str(out), "--n-aug", "2", "--quiet"]


def test_augment_refuses_a_model_without_mlm_head(models, tmp_path, capsys):
    src = tmp_path / "train.tsv"
    src.write_text("sentence\tlabel\nthe movie was good\t1\n", encoding="utf-8")
    rc, err = run_cli(augment_argv(models, src, tmp_path / "aug.tsv", mlm="encoder"), capsys)
    assert_one_error(rc, err, str(models["encoder"]), "no trained MLM head")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.tsv"]


def test_augment_bad_input_file_writes_nothing(models, tmp_path, capsys):
    src = tmp_path / "train.tsv"
    src.write_bytes("sentence\tlabel\nthe café\t1\n".encode("latin-1"))
    rc, err = run_cli(augment_argv(models, src, tmp_path / "aug.tsv"), capsys)
    assert_one_error(rc, err, f"{src}:2: byte 0xe9 is not UTF-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.tsv"]


@pytest.mark.parametrize("target", ["input", "user-file"])
def test_augment_never_replaces_a_file_it_did_not_write(models, tmp_path, capsys, target):
    src = tmp_path / "train.tsv"
    src.write_text("sentence\tlabel\nthe movie was good\t1\n", encoding="utf-8")
    out = src if target == "input" else tmp_path / "notes.tsv"
    if target == "user-file":
        out.write_text("my notes\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    rc, err = run_cli(augment_argv(models, src, out), capsys)
    assert_one_error(rc, err, "augment: --output")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("command", ["export", "speed"])
def test_tokenizer_larger_than_the_vocabulary_is_refused(models, tmp_path, capsys, command):
    model = models["too-big-tokenizer"]
    argv = (["export", str(model), str(tmp_path / "onnx"), "--no-int8"] if command == "export"
            else ["speed", str(model), "--seq", "8", "--reps", "1", "--warmup", "0", "--device", "cpu"])
    rc, err = run_cli(argv, capsys)
    assert_one_error(rc, err, f"{model}: the tokenizer has", "vocab_size")
    assert list(tmp_path.iterdir()) == []


def damaged_copy(src: Path, dst: Path, damage: str) -> Path:
    """A copy of a saved model whose weights are truncated inside the header, truncated inside the data, or gone."""
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    data = weights.read_bytes()
    if damage == "no-weights":
        weights.unlink()
    else:
        weights.write_bytes(data[:20] if damage == "header" else data[:-100])
    return dst


DAMAGE = {"header": "model.safetensors: cannot be read (Error while deserializing header",
          "data": "model.safetensors: cannot be read (Error while deserializing header: incomplete metadata",
          "no-weights": ": no model weights (none of model.safetensors"}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("command", ["augment", "export", "speed"])
def test_missing_or_truncated_weights_are_one_line(models, tmp_path, capsys, command, damage):
    model = damaged_copy(models["mlm"], tmp_path / "model", damage)
    src = tmp_path / "train.tsv"
    src.write_text("sentence\tlabel\nthe movie was good\t1\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = {"augment": augment_argv({**models, "damaged": model}, src, out, mlm="damaged"),
            "export": ["export", str(model), str(out), "--no-int8"],
            "speed": ["speed", str(models["mlm"]), str(model), "--seq", "8", "--reps", "1", "--warmup", "0",
                      "--device", "cpu", "--json", str(out)]}[command]
    rc, err = run_cli(argv, capsys)
    assert_one_error(rc, err, f"{model}", DAMAGE[damage])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "train.tsv"]  # nothing written


@pytest.mark.parametrize("argv,needle", [
    (["speed", "m", "--batch", "0"], "argument --batch: must be >= 1, got 0"),
    (["speed", "m", "--seq", "-3"], "argument --seq: must be >= 1, got -3"),
    (["speed", "m", "--reps", "x"], "argument --reps: 'x' is not an integer"),
    (["augment", "--task", "sst2", "--input", "a", "--mlm", "m", "--glove", "g", "--output", "o", "--k", "0"],
     "argument --k: must be >= 1, got 0"),
    *[(["augment", "--task", "sst2", "--input", "a", "--mlm", "m", "--glove", "g", "--output", "o", "--p-t", p_t],
       f"argument --p-t: must be a probability from 0 to 1, got {p_t}") for p_t in ("2", "-0.5", "nan", "inf")],
    (["augment", "--task", "sst2", "--input", "a", "--mlm", "m", "--glove", "g", "--output", "o", "--p-t", "x"],
     "argument --p-t: 'x' is not a number"),
])
def test_impossible_numbers_are_refused_at_argument_parsing(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli(argv)
    err = error_lines(capsys.readouterr().err)
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(f"error: distillery {argv[0]}: {needle}"), err


# ------------------------------------------------------------------------------------------------ params

def demo_params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _student(d, **kw):
    d["students"]["tinybert-demo"].update(kw)


CASES = {
    "deeper-student": (lambda d, t: _student(d, shape={"layers": 8, "hidden": 64, "heads": 4, "intermediate": 256}),
                       "students.tinybert-demo.shape: the student has 8 layers, more than the teacher's 4"),
    "unknown-task": (lambda d, t: d["data"].update(tasks=["sst3"]), "data.tasks: unknown task 'sst3'"),
    "task-path": (lambda d, t: d["data"].update(tasks=["../../zz-escaped"]), "data.tasks: unknown task '../../zz-escaped'"),
    "missing-teacher": (lambda d, t: d.update(teacher={"init": "pretrained", "name_or_path": str(t / "no-teacher")}),
                        "teacher.name_or_path: teacher directory"),
    "bad-hub-id": (lambda d, t: d.update(teacher={"init": "pretrained", "name_or_path": "not a model!"}),
                   "teacher.name_or_path: 'not a model!' is neither an existing directory"),
    "missing-glue-dir": (lambda d, t: d["data"].update(source="local", glue_dir=str(t / "glue"), tasks=["sst2"]),
                         "data.glue_dir: directory"),
    "missing-corpus": (lambda d, t: d["corpus"].update(source="files", paths=[str(t / "corpus.txt")]),
                       "corpus.paths[0]: file or directory"),
    "missing-glove": (lambda d, t: d["word_vectors"].update(source="file", path=str(t / "glove.txt")),
                      "word_vectors.path: file"),
    "missing-mlm": (lambda d, t: d["augment"].update(mlm=str(t / "mlm")), "augment.mlm: masked-LM directory"),
    "misspelt-objective": (lambda d, t: _student(d, objectives={"atention_loss": 1.0}),
                           "students.tinybert-demo.objectives: unknown key 'atention_loss'"),
    "negative-objective": (lambda d, t: _student(d, objectives={"attention_loss": -1.0, "hidden_loss": 1.0}),
                           "students.tinybert-demo.objectives: weight of 'attention_loss' must be finite and >= 0"),
    "infinite-lr": (lambda d, t: d["teacher_finetune"].update(learning_rate=float("inf")),
                    "teacher_finetune.learning_rate: Input should be a finite number"),
    "no-latency-batch": (lambda d, t: d["evaluation"].update(latency_batch_sizes=[]),
                         "evaluation.latency_batch_sizes: give at least one batch size"),
    "mlm-teacher-without-pretrain": (lambda d, t: (d["pretrain"].update(enabled=False), d["students"].pop("distilbert-demo")),
                                     "augment.mlm: 'teacher' is the pre-training stage's MLM"),
    "unknown-teacher-preset": (lambda d, t: d["teacher"].update(shape={"preset": "nope"}),
                               "teacher.shape: unknown shape preset 'nope'"),
    "missing-relative-checkpoint": (lambda d, t: _student(d, init={"checkpoint": "models/zz-no-such/general"}),
                                    f"students.tinybert-demo.init.checkpoint: {ROOT / 'models/zz-no-such/general'} "
                                    "not found"),
}


@pytest.fixture
def no_pipeline(monkeypatch):
    """flows.pipeline with the flow replaced: a params error must stop before it is called."""
    import flows.pipeline as fp

    def flow(*_a, **_k):
        raise AssertionError("the pipeline started although the params are wrong")

    monkeypatch.setattr(fp, "pipeline", flow)
    return fp


@pytest.mark.parametrize("case", sorted(CASES))
def test_params_that_cannot_work_stop_before_the_first_stage(case, tmp_path, capsys, no_pipeline):
    mutate, needle = CASES[case]
    data = demo_params()
    mutate(data, tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data))
    rc = no_pipeline.main(["--params", str(params)])
    assert_one_error(rc, error_lines(capsys.readouterr().err), f"{params}: {needle}")
    from flows.stage import main as stage_main

    rc = stage_main(["prepare_task", "--item", "demo", "--params", str(params)])
    assert_one_error(rc, error_lines(capsys.readouterr().err), f"{params}: {needle}")
    assert not (ROOT / "zz-escaped").exists() and not (ROOT.parent / "zz-escaped").exists()
    assert not (ROOT / "data" / "raw" / "sst3").exists()


def test_mlm_without_head_is_refused_in_params(models, tmp_path, capsys, no_pipeline):
    data = demo_params()
    data["augment"]["mlm"] = str(models["encoder"])
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data))
    rc = no_pipeline.main(["--params", str(params)])
    assert_one_error(rc, error_lines(capsys.readouterr().err), "augment.mlm:", "has no MLM head (saved as BertModel)")


def test_a_stage_command_with_an_item_it_does_not_run_is_one_error(tmp_path, capsys):
    """`python -m flows.stage`: an item the stage has no such run for, or `all` with an item, is one `error:` line
    naming what is valid, before any work."""
    from flows.stage import main as stage_main

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(demo_params()))
    for argv, needles in ((["prepare_task", "--item", "sst2"], ("prepare_task: item 'sst2' is not one of", "demo")),
                          (["all", "--item", "demo"], ("all: --item names one stage's item",))):
        rc = stage_main([*argv, "--params", str(params)])
        assert_one_error(rc, error_lines(capsys.readouterr().err), *needles)


@pytest.mark.parametrize("preset", ["nope", "../params", "/etc/passwd"])
def test_unknown_preset(preset, capsys, no_pipeline):
    rc = no_pipeline.main(["--preset", preset])
    assert_one_error(rc, error_lines(capsys.readouterr().err), f"--preset: unknown preset {preset!r}", "local")


# ------------------------------------------------------------------------------------------------ inside Prefect

@pytest.mark.slow
def test_a_stage_error_inside_the_prefect_flow_ends_with_its_one_line(tmp_path):
    project = tmp_path / "project"
    glue = project / "glue" / "SST-2"
    glue.mkdir(parents=True)
    (glue / "train.tsv").write_text("sentence\tlabel\na good film\t1\na bad film\t0\nfine\t1\nawful\t2\n")
    (glue / "dev.tsv").write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
    make_project(project, {**ONE_STUDENT, "corpus": {**ONE_STUDENT["corpus"], "demo_documents": 20},
                           "data": {**ONE_STUDENT["data"], "source": "local", "glue_dir": "glue", "tasks": ["sst2"]}},
                 dvc_yaml=False)
    env = {k: v for k, v in env_for(project).items() if not k.startswith("DISTILLERY_")}
    expected = f"error: {glue / 'train.tsv'}:5: label '2' is not one of ['0', '1'] (sst2)"
    for cmd in ([sys.executable, "-m", "flows.stage", "prepare_task", "--item", "sst2"],
                [sys.executable, "-m", "flows.pipeline"]):
        proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 2, proc.stderr[-3000:]
        lines = error_lines(proc.stderr)
        assert [line for line in lines if line.startswith("error:")] == [expected], proc.stderr[-3000:]
        assert lines[-1] == expected  # the last thing the user sees
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert not (project / "data" / "tasks" / "sst2").exists()


@pytest.mark.parametrize("cron", ["not a cron", "61 * * * *", ""])
def test_deploy_refuses_a_bad_cron_before_anything_starts(cron, capsys, monkeypatch):
    import flows.deploy as deploy

    def started(*_a, **_k):
        raise AssertionError("the deployment went on although the cron expression is wrong")

    monkeypatch.setattr(deploy, "load_params", started)
    monkeypatch.setattr(deploy.pipeline, "serve", started)
    with pytest.raises(SystemExit) as exit_:
        deploy.main(["--cron", cron])
    err = error_lines(capsys.readouterr().err)
    assert exit_.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: python -m flows.deploy: argument --cron: {cron!r} is not a valid cron expression")


def test_deploy_refuses_to_serve_a_schedule_no_server_would_fire(tmp_path):
    """Without PREFECT_API_URL, Prefect serves on an ephemeral server that has no scheduler: it only logs a warning
    and the process waits forever for runs nobody creates. flows.deploy refuses instead, naming what to start."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(ONE_STUDENT))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DISTILLERY_"))}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect-home"))
    proc = subprocess.run([sys.executable, "-m", "flows.deploy", "--cron", "* * * * *", "--params", "params.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and error_lines(proc.stderr) == [
        "error: python -m flows.deploy: PREFECT_API_URL is not set: a schedule needs a running Prefect server (the "
        "ephemeral one Prefect starts without it has no scheduler); start one with `prefect server start` and set "
        "PREFECT_API_URL=http://127.0.0.1:4200/api"], proc.stderr[-3000:]
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()  # no ephemeral server was started


def test_deploy_refuses_when_no_server_answers_at_the_api_url(tmp_path, capsys, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import flows.deploy as deploy

    def started(*_a, **_k):
        raise AssertionError("served although no server answers")

    monkeypatch.setattr(deploy.pipeline, "serve", started)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(ONE_STUDENT))
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # port 9: nothing listens
        rc = deploy.main(["--params", str(tmp_path / "params.yaml")])
    assert_one_error(rc, error_lines(capsys.readouterr().err),
                     "python -m flows.deploy: no Prefect server answers at PREFECT_API_URL=http://127.0.0.1:9/api (",
                     "start one with `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api")


@pytest.mark.parametrize("module", ["flows.ablation", "flows.deploy"])
def test_ablation_and_deploy_share_the_error_boundary(module, capsys):
    """An unknown preset: one error line, exit code 2, no traceback, for every command of the flows."""
    import importlib

    code = importlib.import_module(module).main(["--preset", "no-such-preset"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --preset: unknown preset 'no-such-preset'") and "Traceback" not in err
