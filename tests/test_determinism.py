"""Two fresh runs with the same inputs and seed give the same students, bit for bit: every model file of every stage of
the micro pipeline (one student per recipe), built once by `python -m flows.pipeline` (the `prefect_project`
fixture), against a second project run by `python -m flows.stage all` with another Python hash seed (set iteration
order) and no tracking. The budgeted student is left out: the clock chooses its shape."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.demo import different_tensors
from helpers import MICRO, env_for, make_project

BY_THE_CLOCK = "micro-budget"


def _weights(project):
    return {str(f.relative_to(project)): f for f in sorted((project / "models").rglob("*.safetensors"))
            if BY_THE_CLOCK not in str(f.relative_to(project)) and "/search/" not in f.as_posix()}


@pytest.mark.slow
def test_two_fresh_runs_give_the_same_students_bit_for_bit(prefect_project, tmp_path):
    params = {**MICRO, "students": {k: v for k, v in MICRO["students"].items() if k != BY_THE_CLOCK},
              "evaluation": {**MICRO["evaluation"], "latency": False, "export_onnx": False},
              "registry": {"enabled": False}}
    project = make_project(tmp_path / "second", params, dvc_yaml=False)
    env = {**env_for(project), "DISTILLERY_TRACKING": "off", "PYTHONHASHSEED": "12345"}
    proc = subprocess.run([sys.executable, "-m", "flows.stage", "all"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, second = _weights(prefect_project.project), _weights(project)
    recipes = {"micro", "micro-minilm", "micro-distilbert", "micro-mobilebert", "micro-pkd"}
    assert {f"models/students/{s}-demo/model/model.safetensors" for s in recipes} <= second.keys()
    assert second.keys() <= first.keys(), sorted(second.keys() - first.keys())
    differ = [rel for rel, path in second.items() if different_tensors(first[rel], path)]
    assert not differ, f"{len(differ)} of {len(second)} model files differ between two runs: {differ[:6]}"
    first_scores, second_scores = (json.loads((p / "metrics" / "eval" / "demo.json").read_text())
                                   for p in (prefect_project.project, project))
    for name, row in second_scores.items():
        assert row["main"] == first_scores[name]["main"], name
