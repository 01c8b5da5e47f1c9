"""Shared helpers for the training tests: a tiny WordPiece vocabulary, a learnable generated task, tiny BERTs.

(No tests here; the other test_training_* modules import it.)
"""

from __future__ import annotations

import random
from pathlib import Path

import datasets
import torch
import transformers

WORDS = [
    "the", "a", "cat", "dog", "house", "tree", "car", "sky", "river", "city", "book", "table", "chair",
    "runs", "sits", "sees", "likes", "finds", "takes", "red", "blue", "small", "big", "old", "new",
    "on", "in", "under", "near", "with", "good", "great", "bad", "awful",
]
CUES = {"good": 1, "great": 1, "bad": 0, "awful": 0}
NEUTRAL = [w for w in WORDS if w not in CUES]


def write_vocab(directory: Path) -> Path:
    path = Path(directory) / "vocab.txt"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path.write_text("\n".join(specials + WORDS) + "\n", encoding="utf-8")
    return path


def tokenizer(directory: Path) -> transformers.BertTokenizerFast:
    return transformers.BertTokenizerFast(vocab=str(write_vocab(directory)), do_lower_case=True)


def sentences(n: int, seed: int) -> tuple[list[str], list[int]]:
    """Sentiment-like task: the label is the polarity of the single cue word placed among neutral words."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(4, 9))]
        cue = rng.choice(sorted(CUES))
        words.insert(rng.randrange(len(words) + 1), cue)
        texts.append(" ".join(words))
        labels.append(CUES[cue])
    return texts, labels


def encoded(tok, n: int, seed: int, max_length: int = 16) -> datasets.Dataset:
    texts, labels = sentences(n, seed)
    enc = tok(texts, truncation=True, max_length=max_length, padding="max_length")
    return datasets.Dataset.from_dict({**dict(enc), "labels": labels, "idx": list(range(n))})


def bert_config(vocab_size: int, layers: int, hidden: int = 32, heads: int = 2, inter: int = 64, **kw):
    return transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        max_position_embeddings=64,
        **kw,
    )


def classifier(vocab_size: int, layers: int, seed: int = 0, **kw) -> transformers.BertForSequenceClassification:
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(bert_config(vocab_size, layers, num_labels=2, **kw))


FAST = dict(disable_tqdm=True, logging_steps=5, save_total_limit=1, dataloader_num_workers=0)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one intra-op thread (and do not thrash a loaded 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
