"""Importing the pipeline opens no network connection (no Hub probe): offline is decided from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# every connection attempt is recorded and refused; the imports must make none
PROBE = """
import json, os, socket
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args[1] if len(args) > 1 else args[0]))
    raise OSError("network disabled by the test")
socket.create_connection = refuse
socket.socket.connect = refuse
socket.socket.connect_ex = refuse
import tasks, flows.stages  # every stage module
print(json.dumps({"attempts": attempts, **{k: os.environ.get(k) for k in
                  ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")}}))
"""


def _probe(**env_overrides: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))}
    env.update(env_overrides, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_tasks_opens_no_connection_and_is_offline_by_default():
    seen = _probe()
    assert seen["attempts"] == []
    assert seen["HF_HUB_OFFLINE"] == seen["TRANSFORMERS_OFFLINE"] == seen["HF_DATASETS_OFFLINE"] == "1"


def test_a_user_who_allows_the_hub_keeps_it():
    seen = _probe(HF_HUB_OFFLINE="0")
    assert seen["attempts"] == [] and seen["HF_HUB_OFFLINE"] == "0" and seen["TRANSFORMERS_OFFLINE"] is None
