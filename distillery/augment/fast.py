"""Fast mode of the augmentation: one MLM forward per sentence instead of one per word (an approximation).

The faithful Algorithm 1 of TinyBERT masks each eligible single-piece word in its own copy of the
sentence, so a sentence with n such words costs n forwards. The fast mode masks all of them in a single
copy (the original sentence is still the second segment, as in the official input) and reads every
masked position from that one forward. The predictions differ from the faithful ones because each
masked word no longer sees its masked neighbours; `candidate_overlap` measures by how much.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from distillery.augment.mlm import MaskedCopy, build_masked_input

__all__ = ["joint_masked_copy", "candidate_overlap"]


def joint_masked_copy(
    piece_ids: Sequence[int], mask_positions: Sequence[int], *, cls_id: int, sep_id: int, mask_id: int,
    max_seq_length: int = 512,
) -> MaskedCopy:
    """One copy of the sentence with every position of `mask_positions` masked at once."""
    return build_masked_input(
        piece_ids, mask_positions, cls_id=cls_id, sep_id=sep_id, mask_id=mask_id, max_seq_length=max_seq_length
    )


def candidate_overlap(
    faithful: Sequence[Mapping[int, Sequence[str]]], fast: Sequence[Mapping[int, Sequence[str]]],
    positions: Sequence[Sequence[int]] | None = None,
) -> float:
    """Mean, over word positions, of the fraction of faithful candidates that fast mode also proposes.

    `faithful[s][i]` / `fast[s][i]` are the candidate lists of word i of sentence s. `positions[s]`
    restricts the mean (e.g. to the MLM-predicted words); by default every position of `faithful`
    counts. Positions whose faithful list is empty are skipped. Returns nan when nothing is compared.
    """
    fractions = []
    for s, cands in enumerate(faithful):
        keys = positions[s] if positions is not None else list(cands)
        for i in keys:
            ref = set(cands.get(i, ()))
            if not ref:
                continue
            fractions.append(len(ref & set(fast[s].get(i, ()))) / len(ref))
    return sum(fractions) / len(fractions) if fractions else float("nan")
