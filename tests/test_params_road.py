"""A params value reaches its use in at most six frames of the project's code (docs/contributing.md: the road from
params.yaml to the Trainer), counted at run time: `python -m flows.stage task_distillation` runs in a copy of the
session's one-student project with a probe that records the project's frames on the stack (`flows/`, `tasks/`,
`distillery/`, from `flows.stage.main` down) where the value is first used: a grid learning rate where its run's
`TrainingArguments` are built, BERT-PKD's `beta` where it becomes the patient loss's weight (`ObjectiveWeights`)."""

from __future__ import annotations

import json
import shutil
import sys

import yaml

from helpers import MICRO, run

LEARNING_RATE, BETA = 0.00123, 123.0

PROBE = f'''
import inspect, json, os
from pathlib import Path

import transformers

from distillery.objectives.weights import ObjectiveWeights

ROOT = Path(os.getcwd()).resolve()


def record(value):
    frames = [f for f in inspect.stack()[1:] if Path(f.filename).resolve().is_relative_to(ROOT)]
    frames = [f"{{Path(f.filename).resolve().relative_to(ROOT)}}:{{f.function}}" for f in frames
              if Path(f.filename).resolve().relative_to(ROOT).parts[0] in ("flows", "tasks", "distillery")]
    with open(ROOT / "frames.jsonl", "a") as fh:
        fh.write(json.dumps({{"value": value, "frames": frames[::-1]}}) + "\\n")


post_init = transformers.TrainingArguments.__post_init__


def probed_post_init(self):
    if self.learning_rate == {LEARNING_RATE}:
        record("learning_rates")
    return post_init(self)


weights_post_init = ObjectiveWeights.__post_init__


def probed_weights_post_init(self):
    if dict(self.weights).get("patient_loss") == {BETA}:
        record("beta")
    return weights_post_init(self)


transformers.TrainingArguments.__post_init__ = probed_post_init
ObjectiveWeights.__post_init__ = probed_weights_post_init
'''


def test_a_params_value_reaches_its_use_in_at_most_six_frames(one_student_project, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(one_student_project.project, project, symlinks=True)
    params = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
    one_run = {"batch_sizes": [32], "epochs": 1}  # a grid of one short run each: only the road is looked at
    params["task_distillation"]["prediction"] = {**one_run, "learning_rates": [LEARNING_RATE]}
    params["task_distillation"]["finetune"] = {**one_run, "learning_rates": [1e-3]}
    params["students"]["patient"] = {**MICRO["students"]["micro-pkd"], "beta": BETA}
    (project / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    (project / "probe.py").write_text(PROBE, encoding="utf-8")
    stages = ("from flows.stage import main\n"
              "for item in ('micro:demo', 'patient:demo'):\n"
              "    assert main(['task_distillation', '--item', item, '--upstream']) == 0\n")
    run([sys.executable, "-c", "import probe\n" + stages], project)

    records = [json.loads(line) for line in (project / "frames.jsonl").read_text().splitlines()]
    # each value's training road, to its first use: from the stage body's call (a stage key plans the student too, to
    # name its inputs)
    roads: dict[str, list[str]] = {}
    for r in records:
        if "tasks/distill.py:run_task_distillation" in r["frames"]:
            roads.setdefault(r["value"], r["frames"])
    assert set(roads) == {"learning_rates", "beta"}, records
    for value, frames in roads.items():
        assert frames[0] == "flows/stage.py:main", frames
        assert len(frames) <= 6, f"{value}: {len(frames)} frames: {' -> '.join(frames)}"
    assert roads["learning_rates"][-1] == "distillery/training/args.py:training_arguments"
    assert roads["beta"][-1] == "distillery/recipes/pkd.py:weights"
