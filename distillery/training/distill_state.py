"""Distillation-only parameters (TinyBERT's learnable W_h / W_e projection, eqs. 8-9) saved BESIDE a student.

They live in `distill_state.safetensors` next to the student's `model.safetensors`, never inside it, so the
exported student loads with `AutoModel*` and no project code, and a general-distillation student can be
continued by task distillation with its projection.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_file, save_file

from distillery.io import atomic_path
from distillery.objectives import HiddenProjection

STATE_NAME = "distill_state.safetensors"
META_KEY = "distillery"


def save_projection(projection: HiddenProjection, directory: str | os.PathLike) -> Path:
    """Write `directory/distill_state.safetensors` atomically (weights + shape metadata)."""
    path = Path(directory) / STATE_NAME
    meta = {
        "kind": "HiddenProjection",
        "d_student": str(projection.d_student),
        "d_teacher": str(projection.d_teacher),
        "shared": json.dumps(projection.shared),
        "n_states": str(projection.n_states),
    }
    tensors = {f"projection.{k}": v.detach().contiguous().cpu() for k, v in projection.state_dict().items()}
    with atomic_path(path) as tmp:  # one metadata key: safetensors writes several in a random order (unstable bytes)
        save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    return path


def state_file(path: str | os.PathLike) -> Path:
    """`path` itself when it is a file, else `path/distill_state.safetensors`; FileNotFoundError if absent."""
    p = Path(path)
    f = p if p.is_file() else p / STATE_NAME
    if not f.is_file():
        raise FileNotFoundError(f"no distillation state ({STATE_NAME}) at {p}")
    return f


def load_projection(path: str | os.PathLike) -> HiddenProjection:
    """Rebuild the HiddenProjection saved by `save_projection` (a directory or the file itself)."""
    from safetensors import safe_open

    f = state_file(path)
    with safe_open(str(f), framework="pt") as fh:
        meta = fh.metadata() or {}
    meta = json.loads(meta[META_KEY]) if META_KEY in meta else meta  # else a file written with one key per field
    if meta.get("kind") != "HiddenProjection":
        raise ValueError(f"{f}: not a distillery projection state (metadata kind={meta.get('kind')!r})")
    proj = HiddenProjection(
        int(meta["d_student"]), int(meta["d_teacher"]), n_states=int(meta["n_states"]), shared=json.loads(meta["shared"])
    )
    tensors = load_file(str(f))
    proj.load_state_dict({k.removeprefix("projection."): v for k, v in tensors.items()})
    return proj


def load_projection_into(projection: HiddenProjection, path: str | os.PathLike) -> None:
    """Load saved weights into an existing projection in place (shapes must match)."""
    tensors = load_file(str(state_file(path)))
    with_names = {k.removeprefix("projection."): v for k, v in tensors.items()}
    try:
        projection.load_state_dict(with_names)
    except RuntimeError as exc:
        raise ValueError(f"{state_file(path)}: saved projection does not fit {projection}: {exc}") from None
