"""The pipeline end to end on a micro configuration, as a user runs it:

- `python -m flows.pipeline` (Prefect, MLflow) writes metrics/summary.json and the report, registers the
  student, and an immediate re-run hits the cache for every stage;
- the registered champion predicts labels for raw sentences through mlflow.pyfunc;
- the flow records what it made in dvc.lock: `dvc repro` after it runs nothing; and the reverse: `dvc repro`, then
  the flow runs nothing; a default edited in distillery/config.py makes every stage stale for both;
- the console holds one line per stage event (no warnings a user cannot act on);
- a task whose teacher learned nothing is not distilled, the other tasks are;
- the ablation command adds its variants through the same cached stages.

The project's pipeline files are copied into a temporary directory so nothing touches the checkout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from helpers import EVENT_LINE, MICRO, env_for, make_project, run, scratch, stage_lines, stamp_times

# prefect_project (MICRO, one student per recipe, built once by the flow) and one_student_project (RESUME,
# built once by `dvc repro`) are session fixtures in tests/conftest.py.


@pytest.mark.slow
def test_pipeline_writes_summary_report_and_registry(prefect_project):
    project, _, _ = prefect_project
    summary = json.loads((project / "metrics" / "summary.json").read_text())
    teacher, student = summary["demo"]["teacher"], summary["demo"]["micro"]
    for entry in (teacher, student):
        assert {"params", "accuracy"} <= set(entry)
    assert student["params"] < teacher["params"]
    assert student["retention"] == pytest.approx(student["accuracy"] / teacher["accuracy"])
    # the floor the teacher beat, and each student's direct baseline (same shape and init, gold labels only)
    trivial = summary["demo"]["trivial"]
    assert teacher["passed_gate"] and teacher["accuracy"] >= trivial["accuracy"] + 0.05
    assert "retention" not in trivial
    for name in MICRO["students"]:
        direct = summary["demo"][f"{name}-direct"]
        assert direct["baseline_of"] == name and direct["params"] == summary["demo"][name]["params"]
        assert summary["demo"][name]["gain_over_direct"] == pytest.approx(
            summary["demo"][name]["accuracy"] - direct["accuracy"])
    assert "micro-direct" in (project / "reports" / "table.md").read_text()
    assert student["onnx_max_abs_diff"] <= 1e-4
    assert "int8_accuracy" in student and "latency_ms_b1" in student
    int8 = summary["demo"]["micro-int8"]  # the int8 ONNX export: its own row, next to its fp32 student
    assert int8["accuracy"] == student["int8_accuracy"]
    assert int8["latency_ms_b1"] == student["latency_ms_b1_int8"]
    assert int8["main_change_vs_fp32"] == pytest.approx(int8["accuracy"] - student["accuracy"])
    for name in ("table.md", "table.html"):
        assert "micro-int8" in (project / "reports" / name).read_text()
    from distillery.precision import bf16_supported

    if bf16_supported("cpu"):  # the same student served in bf16 (PyTorch autocast): its own row too
        bf16 = summary["demo"]["micro-bf16"]
        assert bf16["accuracy"] == student["bf16_accuracy"] and bf16["latency_ms_b1"] == student["latency_ms_b1_bf16"]
        assert bf16["main_change_vs_fp32"] == pytest.approx(bf16["accuracy"] - student["accuracy"])
        assert "micro-bf16" in (project / "reports" / "table.md").read_text()
    assert "Training, teacher logits and augmentation ran in" in (project / "reports" / "table.md").read_text()
    assert (project / "data" / "predictions" / "demo" / "micro" / "demo.tsv").is_file()
    assert (project / "reports" / "submission" / "micro.zip").is_file()
    record = json.loads((project / "metrics" / "registry" / "micro-demo.json").read_text())
    # champion only for a student that beats its direct baseline; otherwise a candidate that says why
    beats = student["gain_over_direct"] > 0
    assert record["uri"] == f"models:/micro-demo@{'champion' if beats else 'candidate'}", record
    assert beats or "does not beat its direct baseline" in record["reason"]
    assert (project / "metrics" / "curves" / "task_distillation-micro-demo.csv").is_file()
    # every recipe ran its own stages: MiniLM's teacher assistant, DistilBERT's pre-training distillation,
    # MobileBERT's IB teacher, progressive transfer (one stage per layer) and pre-training distillation (eq. 4)
    assert (project / "models" / "assistant" / "micro-minilm" / "model" / "config.json").is_file()
    curve = (project / "metrics" / "curves" / "general_distillation-micro-distilbert.csv").read_text()
    assert "train_soft_target_loss" in curve and "train_cosine_loss" in curve
    assert (project / "models" / "ib-teacher" / "micro-mobilebert" / "model" / "config.json").is_file()
    transfer = (project / "metrics" / "curves" / "knowledge_transfer-micro-mobilebert.csv").read_text()
    assert "train_feature_map_loss" in transfer and "layer" in transfer.splitlines()[0]
    curve = (project / "metrics" / "curves" / "general_distillation-micro-mobilebert.csv").read_text()
    assert "train_pretraining_distillation_loss" in curve
    task_curve = (project / "metrics" / "curves" / "task_distillation-micro-mobilebert-demo.csv").read_text()
    assert "train_feature_map_loss" in task_curve and "train_attention_transfer_loss" in task_curve  # its step 1
    for name in ("micro-minilm", "micro-distilbert", "micro-mobilebert"):
        assert summary["demo"][name]["params"] < teacher["params"]
        alias = "champion" if summary["demo"][name]["gain_over_direct"] > 0 else "candidate"
        assert json.loads((project / "metrics" / "registry" / f"{name}-demo.json").read_text())["alias"] == alias


@pytest.mark.slow
def test_a_budgeted_student_gets_the_shape_its_search_chose(prefect_project):
    """The search stage timed both candidates the budget allows (1 layer, the teacher's 2 heads, FFN 64 or 32, int8),
    trained them on the task, kept the better; the task stage and the direct baseline built that shape; the report
    shows the choice, its measured figures and the search's plot; the registered version runs the int8 export."""
    project, first, _ = prefect_project
    found = json.loads((project / "models" / "search" / "micro-budget" / "search.json").read_text())
    assert {c["name"] for c in found["candidates"]} == {"1x32-h2-f64-int8", "1x32-h2-f32-int8"}
    assert all(c["meets_budget"] and c["ms"] > 0 for c in found["candidates"])
    assert len(found["rounds"]) == 1 and set(found["rounds"][0]) == {"1x32-h2-f64", "1x32-h2-f32"}
    winner = found["winner"]
    assert winner["form"] == "int8" and found["rounds"][0][winner["name"][:-5]] == max(found["rounds"][0].values())
    for model in ("students/micro-budget-demo", "baseline/micro-budget-demo"):
        config = json.loads((project / "models" / model / "model" / "config.json").read_text())
        assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
            1, 32, winner["shape"]["intermediate"]), model
    assert (project / "reports" / "search-micro-budget.png").stat().st_size > 10_000
    assert f"micro-budget is {winner['name']}" in (project / "reports" / "table.md").read_text()
    assert f"search[micro-budget]: chosen {winner['name']}" in first.stdout
    uri = json.loads((project / "metrics" / "registry" / "micro-budget-demo.json").read_text())["version_uri"]
    code = ("import mlflow, sys; mlflow.set_tracking_uri(sys.argv[1]); m = mlflow.pyfunc.load_model(sys.argv[2]);"
            "py = m.unwrap_python_model(); print(py.form, hasattr(py, 'model'), len(m.predict(['a good film'])))")
    out = run([sys.executable, "-c", code, f"sqlite:///{project / 'mlflow.db'}", uri], project).stdout
    assert out.strip().splitlines()[-1] == "int8 False 1"  # ONNX Runtime, no PyTorch model


@pytest.mark.slow
def test_rerun_hits_the_cache_for_every_stage(prefect_project):
    project, _, first_s = prefect_project
    stamps = {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()}
    assert len(stamps) == 34  # every stage and item ran once
    t0 = time.perf_counter()
    run([sys.executable, "-m", "flows.pipeline"], project)
    second_s = time.perf_counter() - t0
    after = {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()}
    assert after == stamps, "a stage ran again although nothing changed"
    assert second_s < first_s


@pytest.mark.slow
def test_dvc_repro_after_the_flow_runs_no_stage(prefect_project):
    """One cache truth: the flow recorded the stages it completed in dvc.lock, so DVC finds every one up to date."""
    project, _, _ = prefect_project
    stamps = {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()}
    declared = set(yaml.safe_load((project / "dvc.yaml").read_text())["stages"])
    assert set(yaml.safe_load((project / "dvc.lock").read_text())["stages"]) == declared
    out = run([sys.executable, "-m", "dvc", "repro"], project).stdout
    assert "Running stage" not in out
    assert {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()} == stamps


@pytest.mark.slow
def test_console_has_one_line_per_stage_event(prefect_project):
    """No warnings a user cannot act on (MLflow registration chatter, type-hint advice, load reports, evaluation
    sub-bars): one line per stage event, the registry's decision, the change report, the result in words, the
    summary."""
    _, first, _ = prefect_project
    lines = stage_lines(first.stdout + first.stderr)
    assert [line for line in lines if not EVENT_LINE.match(line)] == []
    assert len([line for line in lines if line.startswith("precision: ")]) == 1  # said once, first
    assert lines[0].startswith("precision: ")
    assert "\x1b[A" not in first.stderr  # a nested (evaluation) progress bar
    assert "Downloading artifacts" not in first.stderr  # MLflow's bar when the register stage loads a model
    # the precision line, two per stage, the search's 5, the registry (one per student), the change report, the result
    # in words (the budgeted student's too), the summary
    assert len(lines) <= 1 + 2 * 34 + 5 + 6 + 1 + 2 + 1
    assert lines[-4].startswith("changes: First run") and lines[-3].startswith("demo: best student ")
    assert lines[-2].startswith("demo: budget latency <= 1000 ms at batch 1, length 16, 10% margin: micro-budget is 1x32-h2-f")


@pytest.mark.slow
def test_champion_predicts_labels_for_raw_sentences(prefect_project):
    """The registered student (its alias: champion when it beats its direct baseline, else candidate)."""
    project, _, _ = prefect_project
    uri = json.loads((project / "metrics" / "registry" / "micro-demo.json").read_text())["uri"]
    code = (
        "import mlflow, sys; mlflow.set_tracking_uri(sys.argv[1]);"
        "m = mlflow.pyfunc.load_model(sys.argv[2]);"
        "print(list(m.predict(['the film was not good', 'the music is truly wonderful'])['label']))"
    )
    out = run([sys.executable, "-c", code, f"sqlite:///{project / 'mlflow.db'}", uri], project).stdout
    labels = eval(out.strip().splitlines()[-1])  # noqa: S307 - our own printed list
    assert len(labels) == 2 and set(labels) <= {"0", "1", "LABEL_0", "LABEL_1"}


@pytest.mark.slow
def test_dvc_repro_then_noop(one_student_project):
    """`dvc repro` built the one-student project from scratch (the session fixture): run again it runs nothing, and
    the flow after it runs nothing either; an edited default makes every stage stale for both."""
    project = one_student_project.project
    assert (project / "metrics" / "summary.json").is_file()
    with scratch(project):  # the flow's run and the edited default stay out of the other tests' project
        # Python's bytecode written into a code directory a stage depends on changes nothing (.dvcignore)
        (project / "distillery" / "glue" / "__pycache__").mkdir(exist_ok=True)
        (project / "distillery" / "glue" / "__pycache__" / "written.cpython-311.pyc").write_bytes(b"\0" * 16)
        t0 = time.perf_counter()
        out = run([sys.executable, "-m", "dvc", "repro"], project).stdout
        assert time.perf_counter() - t0 < 30
        assert "Running stage" not in out
        shown = run([sys.executable, "-m", "dvc", "metrics", "show", "--json"], project).stdout
        assert "accuracy" in shown
        # the reverse: after `dvc repro` the flow finds every stage fresh and runs none
        lines = stage_lines(run([sys.executable, "-m", "flows.pipeline"], project).stdout)
        declared = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
        assert not [line for line in lines if line.endswith(": started")]
        assert len([line for line in lines if line.endswith(": cached")]) == len(declared)
        # a default edited in distillery/config.py makes every stage stale, for DVC and for the flow
        config = project / "distillery" / "config.py"
        edited = config.read_text().replace("weight_decay: float = Field(0.01,", "weight_decay: float = Field(0.02,")
        assert edited != config.read_text()
        config.write_text(edited)
        status = json.loads(run([sys.executable, "-m", "dvc", "status", "--json"], project).stdout)
        assert set(status) == set(declared)
        fresh = run([sys.executable, "-c", "from distillery.preflight import load_params\n"
                     "from flows.stages import STAGES, items\nfrom tasks.stage import is_fresh\n"
                     "p = load_params('params.yaml')\n"
                     "print(sum(is_fresh(s, p, i) for n, s in STAGES.items() for i in items(n, p)))"], project).stdout
        assert fresh.strip().splitlines()[-1] == "0"


@pytest.mark.slow
def test_ablation_adds_variants_through_the_cached_stages(prefect_project):
    project, _, _ = prefect_project
    with scratch(project):  # the ablation's evaluation and report replace the summary the other tests read
        # evaluate and report cover the variants; register reads the evaluation (a new version only for a new model)
        kept = {name: t for name, t in stamp_times(project).items()
                if not name.startswith(("evaluate", "report", "register"))}
        run([sys.executable, "-m", "flows.ablation"], project)
        after = stamp_times(project)
        assert all(after[name] == t for name, t in kept.items()), "the ablation re-ran an unchanged stage"
        table = (project / "reports" / "ablation.md").read_text()
        for variant in ("no-gd", "no-da", "no-step1", "no-attn"):
            assert f"micro-{variant}" in table
            assert any(n.startswith("task_distillation") and f"micro-{variant}" in n for n in after)
        assert (project / "reports" / "ablation.png").stat().st_size > 0


@pytest.mark.slow
def test_a_failed_teacher_gate_skips_only_its_task(tmp_path):
    """Two tasks, one teacher that learns nothing (sst2: one step at lr 1e-9): the other task is distilled, evaluated,
    registered and reported; sst2's augmentation, task distillation and registration are skipped (skip records as
    their outputs, which DVC accepts), the report and summary say why in one line, its submission files hold the
    trivial baseline's predictions, and the run exits 0; with `teacher_finetune.stop_on_failed_gate` it ends with that line as
    its `error:` and exit code 2, the flow and the report stage DVC runs alike."""
    from distillery.demo import make_demo_task

    project = tmp_path
    for name, dirname in (("demo", "demo"), ("sst2", "SST-2")):  # the same generated task, in the GLUE layout
        make_demo_task(project / "glue" / dirname, n_train=300, n_dev=60, n_test=40, seed=7)
    params = {**MICRO, "data": {"source": "local", "glue_dir": "glue", "tasks": ["demo", "sst2"], "max_length": 24},
              "teacher_finetune": {**MICRO["teacher_finetune"], "min_gain_over_trivial": 0.0},  # demo's only has to run
              "per_task": {"sst2": {"teacher_finetune": {"learning_rate": 1e-9, "max_steps": 1, "min_gain_over_trivial": 0.3}}},
              "students": {"micro": MICRO["students"]["micro"]},
              "evaluation": {**MICRO["evaluation"], "latency": False}}  # timings are the e2e project's to check
    make_project(project, params)
    run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], project)
    out = run([sys.executable, "-m", "flows.pipeline"], project).stdout
    lines = stage_lines(out)
    for stage in ("augment[sst2]", "task_distillation[micro:sst2]", "register[micro:sst2]"):
        assert any(line.startswith(f"{stage}: skipped: the sst2 teacher failed the gate (dev ") for line in lines), lines
    assert "task_distillation[micro:demo]: started" in lines and "register[micro:demo]: started" in lines
    gate = [line for line in lines if line.startswith("teacher gate: ")]
    assert len(gate) == 1 and gate[0].startswith("teacher gate: sst2: the fine-tuned teacher scores"), lines
    assert "dvc.lock not updated" not in out and "task_distillation-micro-sst2:" in (project / "dvc.lock").read_text()

    summary = json.loads((project / "metrics" / "summary.json").read_text())
    assert summary["demo"]["teacher"]["passed_gate"] and "retention" in summary["demo"]["micro"]
    failed = summary["sst2"]
    assert failed["teacher"]["passed_gate"] is False and failed["teacher"]["gate"] == gate[0][len("teacher gate: "):]
    assert "micro" not in failed and "micro-int8" not in failed and "micro-direct" in failed  # gold labels need no teacher
    assert not any("retention" in row for row in failed.values())
    table = (project / "reports" / "table.md").read_text()
    assert f"\n- {failed['teacher']['gate']}. Its submission files hold the trivial baseline's predictions.\n" in table
    for skipped_out in ("models/students/micro-sst2/model/skipped.json", "models/export/sst2/micro/skipped.json"):
        assert (project / skipped_out).is_file(), skipped_out
    assert json.loads((project / "data" / "augmented" / "sst2.tsv").read_text())["skipped"].startswith("the sst2")
    assert (project / "models" / "students" / "micro-demo" / "model" / "config.json").is_file()
    import zipfile

    majority = max(("0", "1"), key=[row.split("\t")[1] for row in
                                    (project / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:]].count)
    for model in ("teacher", "micro"):
        with zipfile.ZipFile(project / "reports" / "submission" / f"{model}.zip") as zf:
            assert set(zf.namelist()) == {"demo.tsv", "SST-2.tsv"}
            rows = zf.read("SST-2.tsv").decode().splitlines()
        assert rows[0] == "index\tprediction" and {r.split("\t")[1] for r in rows[1:]} == {majority} and len(rows) == 41

    # `python -m flows.stage` (what `dvc repro` runs) skips the same way, in one line and without training
    (project / ".prefect" / "stamps" / "task_distillation@micro:sst2").unlink()
    again = run([sys.executable, "-m", "flows.stage", "task_distillation", "--item", "micro:sst2"], project).stdout
    assert stage_lines(again)[-1].startswith("task_distillation[micro:sst2]: skipped: the sst2 teacher failed the gate")

    params["teacher_finetune"] = {**params["teacher_finetune"], "stop_on_failed_gate": True}  # no stage's key reads it
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    run([sys.executable, "-m", "flows.dvc"], project)
    for cmd in ([sys.executable, "-m", "flows.pipeline"], [sys.executable, "-m", "flows.stage", "report"]):
        proc = subprocess.run(cmd, cwd=project, env=env_for(project), capture_output=True, text=True, timeout=900)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert not [line for line in stage_lines(proc.stdout) if line.endswith(": started")]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert errors == [f"error: {failed['teacher']['gate']}"] and proc.stderr.splitlines()[-1] == errors[0]
