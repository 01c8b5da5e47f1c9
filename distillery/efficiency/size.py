"""Model size: parameter counts (total / embedding / non-embedding) and bytes on disk.

TinyBERT (Jiao et al. 2020, Table 1) and MobileBERT (Sun et al. 2020, Table 4) report "#Params" as
the total count including embeddings (BERT-base 109M, TinyBERT4 14.5M); MiniLM and the
scaling-law literature also report the non-embedding count, which tracks compute.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn


def _embedding_params(model: nn.Module) -> set[int]:
    """ids of the parameters that belong to nn.Embedding modules (token, position, type tables)."""
    ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            ids.update(id(p) for p in module.parameters(recurse=False))
    return ids


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """{"total", "embedding", "non_embedding"} parameter counts; tied weights are counted once.

    "embedding" is the parameters of every nn.Embedding table (word, position, token type); an MLM
    decoder tied to the word embeddings is therefore not double counted.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"parameter_counts expects a torch.nn.Module, got {type(model).__name__}")
    emb_ids = _embedding_params(model)
    seen: set[int] = set()
    total = embedding = 0
    for p in model.parameters():  # parameters() already de-duplicates shared tensors
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if id(p) in emb_ids:
            embedding += p.numel()
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def disk_size_bytes(path: str | os.PathLike) -> int:
    """Bytes on disk of a file, or the sum over every file under a directory (symlinks not followed)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
