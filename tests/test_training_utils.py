"""Saved training checkpoints: a truncated newest one is skipped and removed.

(The training tests' shared helpers, a tiny WordPiece vocabulary, a learnable generated task and tiny BERTs, are in
tests/helpers.py.)
"""

from __future__ import annotations


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
