"""Masked-LM candidate words for TinyBERT's augmentation (Algorithm 1, MLM branch).

A single-piece word w_i is replaced by one of the K words the masked language model ranks highest at
its position. As in the official script the MLM reads ``[CLS] sentence with w_i masked [SEP] original
sentence [SEP]`` (segment ids 0 / 1), the whole input is cut to ``max_seq_length`` pieces, and a mask
at or beyond that length gets no candidates.

Two ways to compute the same top-K:

* `MaskedLM.topk` -- the fast path: masked copies of many positions and sentences are sorted by
  length and batched, run under ``torch.inference_mode`` through the encoder only, and the vocabulary
  head is applied to the hidden states of the masked positions alone.
* `MaskedLM.reference_topk` -- what the official code does: one full forward per masked copy,
  batch 1, logits over the vocabulary at every position, ``argsort`` of the masked row, autograd on.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from distillery import precision
from distillery.errors import InputNotFoundError, UserError
from distillery.training import cpu_kernels

__all__ = ["MaskedCopy", "MaskedLM", "MissingMLMHeadError", "build_masked_input", "load_masked_lm", "load_mlm_checked"]


class MissingMLMHeadError(UserError):
    """A checkpoint loaded as a masked LM whose MLM head (or any other weight) is not in the checkpoint: the
    missing weights would be random and every candidate word garbage."""


def load_mlm_checked(name_or_path: str | os.PathLike, **kwargs):
    """``AutoModelForMaskedLM.from_pretrained`` that refuses a checkpoint saved without an MLM head (a
    ``BertModel`` encoder, a classifier): transformers would fill the head with random weights."""
    from transformers import AutoModelForMaskedLM

    from distillery.models import check_weights, quiet_loading

    if Path(name_or_path).is_dir():  # a local directory: its weights checked before transformers reads them
        check_weights(name_or_path)
    with quiet_loading():  # its load report and progress bar would come before our one line
        model, info = AutoModelForMaskedLM.from_pretrained(str(name_or_path), output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise MissingMLMHeadError(
            f"{name_or_path}: no trained MLM head: {len(missing)} weights of {type(model).__name__} are not in the "
            f"checkpoint (e.g. {', '.join(missing[:2])}), so they would be random; give a masked-LM checkpoint "
            "(saved as ...ForMaskedLM), e.g. the pipeline's models/teacher-mlm/model")
    return model


def load_masked_lm(path: str | os.PathLike, *, device: str | None = None):
    """(model, tokenizer) of a masked LM saved with ``save_pretrained`` (safetensors; no remote code), in fp32 (its
    forwards follow `distillery.precision`).

    `device` defaults to CUDA when available. A checkpoint without an MLM head raises MissingMLMHeadError.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.is_dir():
        raise InputNotFoundError(f"augment: MLM directory not found: {path}")
    if not (path / "config.json").is_file():
        raise InputNotFoundError(f"augment: {path} is not a model directory (no config.json)")
    model = load_mlm_checked(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return model, tokenizer


@dataclass(frozen=True)
class MaskedCopy:
    """One MLM input: token ids, segment ids and the masked positions to read (with the original ids)."""

    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]
    positions: tuple[int, ...]
    original_ids: tuple[int, ...]


def build_masked_input(
    piece_ids: Sequence[int], mask_positions: Sequence[int], *, cls_id: int, sep_id: int, mask_id: int,
    max_seq_length: int = 512,
) -> MaskedCopy:
    """``[CLS] pieces-with-masks [SEP] pieces [SEP]``, cut to `max_seq_length` as the official code does.

    `mask_positions` index `piece_ids` (0-based, without [CLS]). Masks that fall at or beyond
    `max_seq_length` after the [CLS] shift are dropped (the official code returns no candidates for them).
    """
    first = [cls_id, *piece_ids, sep_id]
    kept = [p + 1 for p in mask_positions if p + 1 < max_seq_length]
    originals = [first[p] for p in kept]
    for p in kept:
        first[p] = mask_id
    ids = (first + list(piece_ids) + [sep_id])[:max_seq_length]
    n0 = min(len(first), max_seq_length)
    types = [0] * n0 + [1] * (len(ids) - n0)
    return MaskedCopy(tuple(ids), tuple(types), tuple(kept), tuple(originals))


def _is_punctuation_token(token: str) -> bool:
    text = token[2:] if token.startswith("##") else token
    return bool(text) and all(unicodedata.category(ch).startswith(("P", "S")) for ch in text)


class MaskedLM:
    """A masked language model split into encoder and vocabulary head, with candidate filters.

    Works with ``BertForMaskedLM`` (head ``cls``), ``DistilBertForMaskedLM`` (``vocab_transform`` ...
    ``vocab_projector``) and ``RobertaForMaskedLM``-like models (``lm_head``); any other model falls
    back to a full forward whose logits are read at the masked positions.

    Filters (beyond the official code, all off by default) are applied to the logits *before* ranking,
    so K candidates remain: ``drop_subwords`` removes every "##" piece, ``drop_punctuation`` removes
    pure punctuation/symbol pieces and special tokens, ``drop_original`` removes the masked word itself.
    The official post-ranking filter (top-K, then discard pieces starting with "##") always applies.
    """

    def __init__(
        self, model: nn.Module, tokenizer, *, drop_original: bool = False, drop_punctuation: bool = False,
        drop_subwords: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.drop_original = drop_original
        for name in ("cls_token_id", "sep_token_id", "mask_token_id"):
            if getattr(tokenizer, name, None) is None:
                raise ValueError(f"tokenizer {type(tokenizer).__name__} has no {name}; an MLM tokenizer is needed")
        self.cls_id = tokenizer.cls_token_id
        self.sep_id = tokenizer.sep_token_id
        self.mask_id = tokenizer.mask_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.encoder, self.head = self._split(model)
        cfg = getattr(model, "config", None)
        self.use_token_types = int(getattr(cfg, "type_vocab_size", 0) or 0) >= 2
        vocab_size = int(getattr(cfg, "vocab_size", len(tokenizer)))
        n_tok = len(tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(list(range(min(n_tok, vocab_size))))
        self.id_to_token: list[str | None] = list(tokens) + [None] * max(0, vocab_size - n_tok)
        exclude = torch.tensor([t is None for t in self.id_to_token])
        if drop_subwords:
            exclude |= torch.tensor([t is not None and t.startswith("##") for t in self.id_to_token])
        if drop_punctuation:
            special = set(getattr(tokenizer, "all_special_ids", []))
            exclude |= torch.tensor(
                [t is not None and (i in special or _is_punctuation_token(t)) for i, t in enumerate(self.id_to_token)]
            )
        self.exclude = exclude if bool(exclude.any()) else None

    # -- model plumbing ---------------------------------------------------------------------------
    @staticmethod
    def _split(model: nn.Module) -> tuple[nn.Module | None, Callable[[torch.Tensor], torch.Tensor] | None]:
        if hasattr(model, "bert") and hasattr(model, "cls"):
            return model.bert, model.cls
        if hasattr(model, "distilbert") and hasattr(model, "vocab_projector"):
            def head(h: torch.Tensor) -> torch.Tensor:
                h = model.vocab_layer_norm(model.activation(model.vocab_transform(h)))
                return model.vocab_projector(h)
            return model.distilbert, head
        if hasattr(model, "lm_head") and getattr(model, "base_model", None) is not model:
            return model.base_model, model.lm_head
        return None, None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _inputs(self, copies: Sequence[MaskedCopy]) -> dict[str, torch.Tensor]:
        width = max(len(c.input_ids) for c in copies)
        ids = torch.full((len(copies), width), self.pad_id, dtype=torch.long)
        types = torch.zeros((len(copies), width), dtype=torch.long)
        mask = torch.zeros((len(copies), width), dtype=torch.long)
        for row, c in enumerate(copies):
            n = len(c.input_ids)
            ids[row, :n] = torch.tensor(c.input_ids)
            types[row, :n] = torch.tensor(c.token_type_ids)
            mask[row, :n] = 1
        dev = self.device
        out = {"input_ids": ids.to(dev), "attention_mask": mask.to(dev)}
        if self.use_token_types:
            out["token_type_ids"] = types.to(dev)
        return out

    def _mask_logits(self, logits: torch.Tensor, original_ids: Sequence[int]) -> torch.Tensor:
        if self.exclude is not None:
            logits = logits.masked_fill(self.exclude.to(logits.device), float("-inf"))
        if self.drop_original and len(original_ids):
            logits = logits.clone()
            logits[torch.arange(len(original_ids)), torch.tensor(original_ids)] = float("-inf")
        return logits

    def to_candidates(self, ids: Sequence[int]) -> list[str]:
        """Token strings of ranked ids, pieces starting with "##" discarded (the official filter)."""
        out = []
        for i in ids:
            tok = self.id_to_token[i]
            if tok is not None and not tok.startswith("##"):
                out.append(tok)
        return out

    # -- the fast path ----------------------------------------------------------------------------
    def topk(self, copies: Sequence[MaskedCopy], k: int, batch_size: int = 32) -> list[list[list[str]]]:
        """Candidates of every masked position of every copy: ``out[copy][j]`` for ``copy.positions[j]``.

        Copies are sorted by length and run `batch_size` at a time; only masked positions go through the
        vocabulary head.
        """
        result: list[list[list[str]]] = [[] for _ in copies]
        order = sorted(range(len(copies)), key=lambda i: len(copies[i].input_ids))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), precision.forwards(self.model, self.device), \
                    cpu_kernels.used(self.model, self.device):
                for start in range(0, len(order), batch_size):
                    batch_idx = [i for i in order[start:start + batch_size] if copies[i].positions]
                    if not batch_idx:
                        continue
                    batch = [copies[i] for i in batch_idx]
                    inputs = self._inputs(batch)
                    rows = torch.tensor([r for r, c in enumerate(batch) for _ in c.positions], device=self.device)
                    cols = torch.tensor([p for c in batch for p in c.positions], device=self.device)
                    originals = [o for c in batch for o in c.original_ids]
                    if self.encoder is not None:
                        hidden = self.encoder(**inputs).last_hidden_state
                        logits = self.head(hidden[rows, cols])
                    else:
                        logits = self.model(**inputs).logits[rows, cols]
                    logits = self._mask_logits(logits.float(), originals)
                    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices.tolist()
                    it = iter(top)
                    for i, c in zip(batch_idx, batch):
                        result[i] = [self.to_candidates(next(it)) for _ in c.positions]
        finally:
            self.model.train(was_training)
        return result

    def forward_only(self, copies: Sequence[MaskedCopy], k: int, batch_size: int = 32) -> int:
        """The compute floor: the same batched MLM work as `topk` (encoder, head at masked positions,
        top-K ids), with no candidate post-processing. Returns the number of masked positions."""
        order = sorted(range(len(copies)), key=lambda i: len(copies[i].input_ids))
        n = 0
        with torch.inference_mode(), precision.forwards(self.model, self.device), \
                cpu_kernels.used(self.model, self.device):
            for start in range(0, len(order), batch_size):
                batch = [copies[i] for i in order[start:start + batch_size] if copies[i].positions]
                if not batch:
                    continue
                inputs = self._inputs(batch)
                rows = torch.tensor([r for r, c in enumerate(batch) for _ in c.positions], device=self.device)
                cols = torch.tensor([p for c in batch for p in c.positions], device=self.device)
                if self.encoder is not None:
                    logits = self.head(self.encoder(**inputs).last_hidden_state[rows, cols])
                else:
                    logits = self.model(**inputs).logits[rows, cols]
                torch.topk(logits.float(), k, dim=-1)
                n += len(cols)
        return n

    # -- the per-position reference -------------------------------------------------------------
    def reference_topk(self, copy: MaskedCopy, k: int, *, autograd: bool = True) -> list[list[str]]:
        """What the official script does for one masked copy: a batch-1 full forward (no attention mask,
        logits at every position, autograd left on unless `autograd=False`), then ``argsort`` of each
        masked row, top K, "##" pieces dropped."""
        ids = torch.tensor([copy.input_ids], device=self.device)
        kwargs = {"input_ids": ids}
        if self.use_token_types:
            kwargs["token_type_ids"] = torch.tensor([copy.token_type_ids], device=self.device)
        with torch.set_grad_enabled(autograd), precision.ieee_fp32():  # fp32 as the official script's (no TF32)
            logits = self.model(**kwargs).logits[0]
        out = []
        for pos, orig in zip(copy.positions, copy.original_ids):
            row = self._mask_logits(logits[pos].detach().float().unsqueeze(0), [orig])[0]
            out.append(self.to_candidates(torch.argsort(row, descending=True)[:k].tolist()))
        return out
