"""SQuAD questions -> model features, as in BERT (Devlin et al. 2019, sec. 4.2-4.3) and the Hugging Face QA example
`run_qa.py`.

Each question becomes `[CLS] question [SEP] context window [SEP]` (segment ids 0/1). The question is cut to its
first `max_query_length` (64) tokens, at the character where that token ends. A context too long for `max_length`
(384) is cut into several windows (`truncation="only_second"`, `return_overflowing_tokens`); consecutive windows of
one question share `doc_stride` (128) context tokens, the Hugging Face tokenizers' meaning of `stride` as in
`run_qa.py` (BERT's `run_squad.py` instead starts a window every 128 tokens, so its windows overlap more).

- train features (`prepare_train_features`): input_ids, token_type_ids, attention_mask, `start_positions` and
  `end_positions` (token indices of the first gold answer: the tokens holding its first and last character), or the
  CLS index 0 for both when the answer is not wholly inside the window or the question has none (v2.0).
- eval features (`prepare_eval_features`): the same inputs plus `example_id` (the question id) and `offset_mapping`,
  (start, end) character offsets into the context for context tokens and None for every other token, which
  `distillery.squad.postprocess` uses to turn logits back into answer text; with gold answers, the positions too.

Nothing is padded: a collator pads each batch (`transformers.DataCollatorWithPadding`). Every feature has a `length`
column (its number of tokens), the column `TrainingArguments(group_by_length=True)` reads. A fast tokenizer
(offsets) that puts the question first (right padding, as BERT's) is required.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Mapping, Sequence

import datasets


@dataclass(frozen=True)
class FeatureConfig:
    """The papers' and `run_qa.py`'s defaults."""

    max_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64

    def __post_init__(self):
        if self.max_query_length < 1:
            raise ValueError(f"max_query_length must be >= 1, got {self.max_query_length}")
        if self.doc_stride < 0:
            raise ValueError(f"doc_stride must be >= 0, got {self.doc_stride}")
        room = self.max_length - self.max_query_length - 3  # [CLS] q [SEP] c [SEP]: context tokens at least
        if self.doc_stride >= room:
            raise ValueError(f"doc_stride {self.doc_stride} must be smaller than the context tokens of a window "
                             f"(max_length {self.max_length} - max_query_length {self.max_query_length} - 3 = "
                             f"{room})")


def check_tokenizer(tokenizer) -> None:
    """A fast tokenizer with the question first (offsets come from the fast tokenizers only)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"SQuAD features need a fast tokenizer (character offsets); got {type(tokenizer).__name__}")
    if getattr(tokenizer, "padding_side", "right") != "right":
        raise ValueError("SQuAD features put the question first (BERT's layout): the tokenizer must pad on the right")


def truncate_questions(questions: Sequence[str], tokenizer, max_query_length: int) -> list[str]:
    """Questions with leading whitespace removed (as `run_qa.py`) and cut after their `max_query_length`-th token.

    The cut is at the end character of that token, so the cut text tokenizes to the same first tokens."""
    questions = [q.lstrip() for q in questions]
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True)
    return [q[:offsets[max_query_length - 1][1]] if len(offsets) > max_query_length else q
            for q, offsets in zip(questions, enc["offset_mapping"])]


def _encode(batch: Mapping[str, Sequence], tokenizer, config: FeatureConfig):
    questions = truncate_questions(batch["question"], tokenizer, config.max_query_length)
    return tokenizer(questions, list(batch["context"]), truncation="only_second", max_length=config.max_length,
                     stride=config.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                     padding=False)


def answer_token_span(offsets: Sequence, sequence_ids: Sequence, start_char: int, end_char: int
                      ) -> tuple[int, int] | None:
    """(first, last) token index of the context characters [start_char, end_char) in one window, or None when the
    window does not hold them all."""
    context = [k for k, s in enumerate(sequence_ids) if s == 1]
    if not context:
        return None
    first, last = context[0], context[-1]
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return None
    start = first
    while start <= last and offsets[start][0] <= start_char:
        start += 1
    end = last
    while end >= first and offsets[end][1] >= end_char:
        end -= 1
    return start - 1, end + 1


def _positions(enc, offsets_all: Sequence, sample: Sequence[int], answers_all: Sequence, tokenizer) -> dict:
    """`start_positions` / `end_positions` of every window: the first gold answer's tokens, or the CLS index."""
    starts, ends = [], []
    for i, offsets in enumerate(offsets_all):
        cls_index = enc["input_ids"][i].index(tokenizer.cls_token_id)
        answers = answers_all[sample[i]]
        span = None
        if answers["text"]:
            start_char = answers["answer_start"][0]
            span = answer_token_span(offsets, enc.sequence_ids(i), start_char, start_char + len(answers["text"][0]))
        start, end = span if span is not None else (cls_index, cls_index)
        starts.append(start)
        ends.append(end)
    return {"start_positions": starts, "end_positions": ends}


def train_features(batch: Mapping[str, Sequence], tokenizer, config: FeatureConfig = FeatureConfig()) -> dict:
    """Train features of a batch of questions ({"question", "context", "answers"} columns)."""
    enc = _encode(batch, tokenizer, config)
    sample = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    out = {**enc, **_positions(enc, offsets_all, sample, batch["answers"], tokenizer)}
    out["length"] = [len(ids) for ids in enc["input_ids"]]
    return out


def eval_features(batch: Mapping[str, Sequence], tokenizer, config: FeatureConfig = FeatureConfig()) -> dict:
    """Eval features of a batch of questions ({"id", "question", "context"} columns): inputs, `example_id`,
    context-only `offset_mapping` (None elsewhere), `length`; with an "answers" column also the train features'
    `start_positions` / `end_positions` (the labels a Trainer evaluates with). Also what a served model runs on."""
    enc = _encode(batch, tokenizer, config)
    sample = enc.pop("overflow_to_sample_mapping")
    offsets_all = enc.pop("offset_mapping")
    out = dict(enc)
    if "answers" in batch:
        out.update(_positions(enc, offsets_all, sample, batch["answers"], tokenizer))
    out["example_id"] = [batch["id"][j] for j in sample]
    out["offset_mapping"] = [[list(o) if s == 1 else None for o, s in zip(offsets, enc.sequence_ids(i))]
                             for i, offsets in enumerate(offsets_all)]
    out["length"] = [len(ids) for ids in enc["input_ids"]]
    return out


def prepare_train_features(ds: datasets.Dataset, tokenizer, config: FeatureConfig = FeatureConfig()
                           ) -> datasets.Dataset:
    """`train_features` over a Dataset with the Hub `squad` columns (the question columns are dropped)."""
    check_tokenizer(tokenizer)
    return ds.map(partial(train_features, tokenizer=tokenizer, config=config), batched=True,
                  remove_columns=ds.column_names, desc="SQuAD train features")


def prepare_eval_features(ds: datasets.Dataset, tokenizer, config: FeatureConfig = FeatureConfig()
                          ) -> datasets.Dataset:
    """`eval_features` over a Dataset with the Hub `squad` columns (the question columns are dropped; keep `ds` for
    `distillery.squad.postprocess`)."""
    check_tokenizer(tokenizer)
    return ds.map(partial(eval_features, tokenizer=tokenizer, config=config), batched=True,
                  remove_columns=ds.column_names, desc="SQuAD eval features")
