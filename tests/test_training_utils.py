"""Saved training checkpoints: a truncated newest one is skipped and removed; the training log's final loss.

(The training tests' shared helpers, a tiny WordPiece vocabulary, a learnable generated task and tiny BERTs, are in
tests/helpers.py.)
"""

from __future__ import annotations

import pytest


def test_a_truncated_newest_checkpoint_is_skipped_and_removed(tmp_path):
    """A kill while saving leaves a partial checkpoint-N: resume from the newest complete one instead."""
    import torch
    from safetensors.torch import save_file

    from distillery.training.saving import checkpoint_dir, last_checkpoint

    root = checkpoint_dir(tmp_path)
    for step in (10, 20):
        d = root / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text('{"global_step": %d}' % step)
        save_file({"w": torch.zeros(64, 64)}, str(d / "model.safetensors"))
        torch.save({"step": step}, d / "optimizer.pt")
    assert last_checkpoint(tmp_path) == str(root / "checkpoint-20")
    weights = root / "checkpoint-20" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert last_checkpoint(tmp_path) == str(root / "checkpoint-10")
    assert not (root / "checkpoint-20").exists()
    (root / "checkpoint-10" / "optimizer.pt").write_bytes(b"PK\x03\x04 truncated")
    assert last_checkpoint(tmp_path) is None


def test_final_train_loss_is_the_step_weighted_mean_of_the_logged_losses():
    """The end-of-training row's train_loss does not depend on a resume (the Trainer's counts only its own process's
    steps): logged means 1.0 over steps 1-5, 0.5 over 6-10, 0.2 over 11-12 -> (5 + 2.5 + 0.4) / 12."""
    from distillery.training.log import rows_from_state

    history = [{"step": 5, "epoch": 0.4, "loss": 1.0}, {"step": 10, "epoch": 0.8, "loss": 0.5},
               {"step": 12, "epoch": 1.0, "loss": 0.2, "learning_rate": 1e-4},
               {"step": 12, "epoch": 1.0, "train_loss": 0.123, "train_runtime": 3.0}]
    rows = rows_from_state(history)
    assert rows[-1]["train_loss"] == pytest.approx((5 * 1.0 + 5 * 0.5 + 2 * 0.2) / 12)
    assert [r["step"] for r in rows] == [5, 10, 12, 12] and rows[2]["loss"] == 0.2
