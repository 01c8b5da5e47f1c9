"""Distributed training (issue 12, item 4): general and task distillation (fine-tuning, MobileBERT's progressive
knowledge transfer) on 2 processes (gloo on CPU, torchrun) end with the same student on both ranks, equal to one
process's with the same global batch; sharded augmentation gives the same file; the pipeline's launcher runs a stage
body on N processes and brings rank 0's result back; params split the global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from distillery.config import ConfigError, parse_params
from distillery.training.distributed import launched, per_device_batch
from helpers import WORDS, write_vocab

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("ddp_worker.py")
#: One process and two differ only in float summation order (the all-reduce adds two half-batch gradient means, one
#: process averages the whole batch): ~1e-7 per step, grown by Adam over the 8 + 8 + 8 steps. Training moves the
#: weights by more than 1e-2, so a wrong batch split, data order, loss scaling or an unsynchronised module fails.
ATOL = 2e-5


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    write_vocab(out)
    rng = np.random.default_rng(0)
    (out / "glove.txt").write_text("".join(f"{w} {' '.join(f'{x:.4f}' for x in rng.normal(size=4))}\n" for w in WORDS))
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER), str(out)])
    _run([sys.executable, str(WORKER), str(out)])
    return out


def test_both_ranks_end_with_the_same_student_as_one_process(runs):
    rank0, rank1 = (load_file(str(runs / f"state-2-rank{r}.safetensors")) for r in (0, 1))
    single = load_file(str(runs / "state-1-rank0.safetensors"))
    assert rank0.keys() == rank1.keys() == single.keys()
    # each rank trained on its half of the data (one DDP group, not two single-process runs)
    seen = [int(s.pop("examples_seen")) for s in (rank0, rank1, single)]
    assert seen == [32, 32, 64], seen
    for prefix in ("general.", "projection.", "task.", "finetune.", "transfer."):
        assert any(k.startswith(prefix) for k in rank0), prefix
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), f"{key}: the ranks' weights differ (not synchronised)"
        diff = (rank0[key] - single[key]).abs().max().item() if rank0[key].numel() else 0.0
        assert diff <= ATOL, f"{key}: 2 processes vs 1 differ by {diff:.2e} (> {ATOL})"
    for stage, init in (("general", "init."), ("transfer", "transfer-init.")):
        moved = max((single[f"{stage}.{k[len(init):]}"] - v).abs().max().item()
                    for k, v in single.items() if k.startswith(init) and v.numel())
        assert moved > 100 * ATOL, f"{stage} barely moved the student ({moved:.2e}): the test would be void"


def test_rank_zero_writes_the_outputs_once(runs):
    rank0 = load_file(str(runs / "state-2-rank0.safetensors"))
    for name, prefix in (("general/model", "general."), ("grid/lr0.003-bs8/model", "task."),
                         ("finetune/model", "finetune.")):
        exported = load_file(str(runs / "run-2" / name / "model.safetensors"))
        assert exported and all(torch.equal(v, rank0[prefix + k]) for k, v in exported.items()), name
    saved = load_file(str(runs / "run-2" / "general" / "model" / "distill_state.safetensors"))
    assert all(torch.equal(v, rank0[k]) for k, v in saved.items())
    assert len(list((runs / "run-2" / "grid" / "teacher_logits").glob("*.safetensors"))) == 1
    assert json.loads((runs / "run-2" / "grid" / "grid.json").read_text())["best"] == "lr0.003-bs8"
    leftovers = [p for p in (runs / "run-2").rglob(".*") if p.name.endswith((".tmp", ".old"))]
    assert not leftovers
    # augmentation: the shards split across the ranks give the one-process file, byte for byte
    augmented = (runs / "run-2" / "augmented.tsv").read_bytes()
    assert augmented == (runs / "run-1" / "augmented.tsv").read_bytes() and augmented.count(b"\n") > 11
    assert not (runs / "run-2" / "augment-shards").exists()
    # the logged distillation terms are the mean over both ranks, as the total loss is
    rows = [r for r in _csv(runs / "run-2" / "general" / "model" / "train_log.csv") if r.get("loss")]
    single = [r for r in _csv(runs / "run-1" / "general" / "model" / "train_log.csv") if r.get("loss")]
    assert len(rows) == len(single) == 8
    for a, b in zip(rows, single):
        assert abs(float(a["train_hidden_loss"]) - float(b["train_hidden_loss"])) <= 1e-3 * abs(float(b["train_hidden_loss"]))


def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def test_a_distributed_stage_runs_its_body_on_n_processes_and_returns_rank_zero_result(monkeypatch, tmp_path):
    from ddp_worker import body

    from distillery.errors import UserError
    from tasks import stage as stages

    monkeypatch.setattr(stages, "STAMPS", tmp_path)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    p = parse_params({**raw, "distributed": {"nproc_per_node": 2, "backend": "gloo"}})
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    declared = dict(deps=lambda q, item: [], outs=lambda q, item: [], params=lambda q, item: {}, device="shared")
    ranks, local = stages.Stage("ranks", body, distributed=True, **declared), stages.Stage("local", body, **declared)
    result = stages.run_stage(ranks, p, "x")
    assert (result["rank"], result["world"]) == (0, 2)
    assert result["per_device"] == p.general_distillation.batch_size // 2
    assert parse_params(result["params"]) == p  # the ranks run with exactly the parent's params
    with pytest.raises(UserError, match="a user error on every rank"):
        stages.run_stage(ranks, p, "fail")
    # one process, or a stage not declared distributed: the body runs in place; the stage's params (its cache key)
    # hold the section only for N > 1, so a one-process run keeps the key it had
    one = parse_params(raw)
    assert stages.run_stage(ranks, one, "y")["world"] == 1
    assert stages.run_stage(local, p, "y")["world"] == 1
    assert "distributed" not in ranks.params(one, "y") and ranks.params(p, "y")["distributed"]["nproc_per_node"] == 2
    assert "distributed" not in local.params(p, "y")


def test_a_rank_reports_the_bodys_result_its_skip_or_its_user_error(tmp_path):
    """`tasks.launch`, the rank side, in this process (one rank: no process group): what rank 0 writes for the
    launching stage, which raises the skip or the error again there (above)."""
    from tasks import launch

    p = parse_params(yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8")))
    params_file = tmp_path / "params.json"
    params_file.write_text(p.model_dump_json(), encoding="utf-8")

    def rank(item: str) -> tuple[int, dict]:
        result = tmp_path / f"{item}.json"
        code = launch.main(["ddp_worker:body", "--params", str(params_file), "--result", str(result), "--item", item])
        return code, json.loads(result.read_text(encoding="utf-8"))

    code, report = rank("x")
    assert code == 0 and report["result"]["world"] == 1 and parse_params(report["result"]["params"]) == p
    assert rank("skip") == (0, {"skipped": "nothing to do", "message": "nothing to do for this item"})
    assert rank("fail") == (1, {"error": "a user error on every rank"})


def test_params_batch_sizes_are_global_and_split_evenly():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    with pytest.raises(ConfigError, match=r"distributed: nproc_per_node=3 does not divide pretrain.batch_size \(32\)"):
        parse_params({**raw, "distributed": {"nproc_per_node": 3}})
    with pytest.raises(ConfigError, match="distributed.backend"):
        parse_params({**raw, "distributed": {"backend": "mpi"}})
    assert parse_params(raw).distributed.nproc_per_node == 1
    assert not launched() and per_device_batch(32) == 32
