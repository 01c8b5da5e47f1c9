"""TinyBERT Algorithm 1: batched candidates equal the per-position reference; sampling semantics."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import transformers

from distillery.augment import (
    STOPWORDS, AugmentConfig, Augmenter, build_masked_input, candidate_overlap, default_n_aug, is_eligible,
    load_word_vectors, sample_variants,
)

SENTENCES = [
    "The movie was surprisingly charming, and the acting felt honest.",
    "A dull , plodding thriller that never finds its footing .",
    "Unbelievably wonderful storytelling!",
    "it 's a \"quiet\" film about grief",
    "",
    "the of and",
    "Brilliant direction makes everything sparkle despite flimsy writing",
]
WHOLE = (
    "the a and of it was movie film acting felt honest dull thriller that never finds its footing quiet "
    "about grief story telling direction makes everything despite writing good bad great plot scene "
    "charming wonderful brilliant flimsy sparkle surprisingly s"
).split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", ".", "!", "'", '"', "?"]
    vocab += sorted(set(WHOLE) - {"charming", "wonderful", "brilliant", "flimsy", "sparkle", "surprisingly"})
    vocab += list("abcdefghijklmnopqrstuvwxyz") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab += ["##ing", "##ly", "##ful", "##able", "un", "##believ", "##s"]
    vocab = list(dict.fromkeys(vocab))  # unique, order kept
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return transformers.BertTokenizerFast(vocab=str(path))


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128,
    )
    return transformers.BertForMaskedLM(cfg).eval().double()  # float64: top-K ties cannot flip


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    rng = np.random.default_rng(1)
    words = [w for w in WHOLE if w not in ("wonderful", "sparkle")] + ["unbelievably", "storytelling", "plodding", "joy", "delight", "gem"]
    path = tmp_path_factory.mktemp("glove") / "glove.txt"
    path.write_text("".join(w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=6)) + "\n" for w in words))
    return load_word_vectors(path, use_cache=False)


def test_stopword_list_is_the_official_one():
    assert len(STOPWORDS) == 173
    assert {"the", "and", "don't", "'s", "'re", "wouldn"} <= STOPWORDS
    assert not {"what", "when", "why", "how"} & STOPWORDS
    assert is_eligible("movie") and not is_eligible("the") and not is_eligible("co2") and not is_eligible("café")


def test_default_n_aug_per_task():
    assert [default_n_aug(t) for t in ("cola", "MNLI", "mrpc", "SST-2", "qqp", "qnli", "rte", "sts-b", "wnli", None)] == [
        30, 10, 30, 20, 10, 20, 30, 30, 20, 20]


def test_config_rejects_impossible_values():
    for bad in ({"k": 0}, {"p_t": 1.5}, {"n_aug": -1}, {"batch_size": 0}, {"max_seq_length": 2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AugmentConfig(**bad)


def test_masked_input_layout_and_truncation():
    c = build_masked_input([10, 11, 12], [1], cls_id=2, sep_id=3, mask_id=4)
    assert c.input_ids == (2, 10, 4, 12, 3, 10, 11, 12, 3)
    assert c.token_type_ids == (0, 0, 0, 0, 0, 1, 1, 1, 1)
    assert c.positions == (2,) and c.original_ids == (11,)
    cut = build_masked_input(list(range(10, 20)), [2, 8], cls_id=2, sep_id=3, mask_id=4, max_seq_length=6)
    assert cut.input_ids == (2, 10, 11, 4, 13, 14) and cut.token_type_ids == (0,) * 6
    assert cut.positions == (3,)  # the mask at piece 8 (input position 9) is beyond the cut


@pytest.mark.parametrize("options", [{}, {"drop_original": True, "drop_punctuation": True, "drop_subwords": True}])
def test_batched_candidates_equal_per_position_reference(model, tokenizer, vectors, options):
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=6, batch_size=5, **options))
    fast_path = aug.candidates(SENTENCES)
    reference = aug.reference_candidates(SENTENCES, autograd=False)
    assert fast_path == reference
    # every eligible word has candidates; both branches (MLM and GloVe) were exercised
    a0 = aug.analyse(SENTENCES[0])
    assert set(fast_path[0]) == set(a0.eligible) and a0.eligible
    assert any(n > 1 for n in a0.lengths) and any(n == 1 for n in a0.lengths)
    assert fast_path[4] == {} and fast_path[5] == {}
    if options:
        for cands in fast_path:
            for i, words in cands.items():
                assert all(w not in {",", ".", "!", "[CLS]", "[SEP]", "[MASK]"} for w in words)


def test_candidates_follow_the_official_rules(model, tokenizer, vectors):
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=5))
    a = aug.analyse(SENTENCES[2])  # "unbelievably wonderful storytelling !"
    assert a.words == ["unbelievably", "wonderful", "storytelling", "!"]
    cands = aug.candidates([SENTENCES[2]])[0]
    assert cands[0] == vectors.neighbours("unbelievably", 5)  # multi-piece -> GloVe
    assert cands[1] == ["wonderful"]  # multi-piece, absent from GloVe -> the word itself
    assert 3 not in cands  # punctuation is not eligible
    single = [i for i in a.eligible if a.lengths[i] == 1]
    for i in single:
        assert all(not w.startswith("##") for w in cands[i]) and 1 <= len(cands[i]) <= 5


def test_fast_mode_uses_one_copy_per_sentence(model, tokenizer, vectors):
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=6, fast=True))
    analyses = [aug.analyse(s) for s in SENTENCES]
    copies, owners, _ = aug._plan(analyses, fast=True)
    faithful_copies, _, _ = aug._plan(analyses, fast=False)
    assert len(copies) == sum(any(a.lengths[i] == 1 for i in a.eligible) for a in analyses) < len(faithful_copies)
    fast = aug.candidates(SENTENCES)
    faithful = aug.candidates(SENTENCES, fast=False)
    assert [set(c) for c in fast] == [set(c) for c in faithful]
    overlap = candidate_overlap(faithful, fast)
    assert 0.0 <= overlap <= 1.0
    assert candidate_overlap(faithful, faithful) == 1.0
    assert candidate_overlap([{0: ["a", "b"]}], [{0: ["b", "c"]}]) == 0.5


def test_sampling_semantics(model, tokenizer, vectors):
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=6))
    a = aug.analyse(SENTENCES[0])
    cands = aug.candidates_for([a])[0]
    out = sample_variants(a, cands, 20, 0.4, random.Random(0))
    assert out[0] == SENTENCES[0] and len(out) == len(set(out)) and 2 <= len(out) <= 21
    assert " ".join(a.words) not in out[1:]
    for text in out[1:]:
        words = text.split(" ")
        assert len(words) == len(a.words)
        for i, w in enumerate(words):
            assert w == a.words[i] or (i in cands and w in cands[i])
    assert sample_variants(a, cands, 20, 0.0, random.Random(0)) == [SENTENCES[0]]
    full = sample_variants(a, {i: ["zzz"] for i in a.eligible}, 5, 1.0, random.Random(0))
    assert len(full) == 2 and all(full[1].split(" ")[i] == "zzz" for i in a.eligible)


def test_restore_case(model, tokenizer, vectors):
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(restore_case=True))
    a = aug.analyse("The Movie was GREAT , honestly")
    out = sample_variants(a, {i: ["film"] for i in a.eligible}, 3, 1.0, random.Random(0), restore_case=True)
    assert out[1] == "The Film was FILM , film"


def test_long_input_masks_beyond_max_length_get_the_word_itself(model, tokenizer, vectors):
    long = " ".join(["movie"] * 40)
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=4, max_seq_length=20))
    cands = aug.candidates([long])[0]
    assert cands == aug.reference_candidates([long], autograd=False)[0]
    assert all(cands[i] == ["movie"] for i in range(19, 40))
    assert all(len(cands[i]) >= 1 for i in range(19))


def _rows():
    return [
        {"text_a": s, "text_b": SENTENCES[(i + 1) % len(SENTENCES)], "label": i % 2, "idx": 100 + i}
        for i, s in enumerate(SENTENCES)
    ]


def test_outputs_identical_whatever_the_batch_size(model, tokenizer, vectors):
    runs = []
    for batch_size, chunk in ((1, 1), (3, 2), (64, 256)):
        aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=5, n_aug=8, seed=7, batch_size=batch_size, chunk_size=chunk))
        runs.append(list(aug.augment_rows(_rows())))
    assert runs[0] == runs[1] == runs[2]
    other_seed = Augmenter(model, tokenizer, vectors, AugmentConfig(k=5, n_aug=8, seed=8))
    assert list(other_seed.augment_rows(_rows())) != runs[0]


def test_pairs_keep_the_other_field_original(model, tokenizer, vectors):
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=5, n_aug=10))
    rows = _rows()
    out = list(aug.augment_rows(rows))
    for row in rows:
        mine = [o for o in out if o["source_idx"] == row["idx"]]
        assert mine[0] == {"text_a": row["text_a"], "text_b": row["text_b"], "label": row["label"], "source_idx": row["idx"]}
        assert all(o["label"] == row["label"] for o in mine)
        assert all(o["text_a"] == row["text_a"] or o["text_b"] == row["text_b"] for o in mine)
        changed_a = [o for o in mine[1:] if o["text_a"] != row["text_a"]]
        changed_b = [o for o in mine[1:] if o["text_b"] != row["text_b"]]
        assert len(changed_a) + len(changed_b) == len(mine) - 1
        assert len({(o["text_a"], o["text_b"]) for o in mine}) == len(mine)
    assert any(o["text_a"] != r["text_a"] for o in out for r in rows if o["source_idx"] == r["idx"])
    assert any(o["text_b"] != r["text_b"] for o in out for r in rows if o["source_idx"] == r["idx"])


def test_missing_text_a_is_a_clear_error(model, tokenizer, vectors):
    aug = Augmenter(model, tokenizer, vectors)
    with pytest.raises(KeyError, match="example 0 has no 'text_a'"):
        list(aug.augment_rows([{"sentence": "x", "label": 0}]))


def test_distilbert_mlm_batched_equals_reference(tokenizer, vectors):
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                        max_position_embeddings=128)
    model = transformers.DistilBertForMaskedLM(cfg).eval().double()
    aug = Augmenter(model, tokenizer, vectors, AugmentConfig(k=6, batch_size=4))
    assert aug.mlm.encoder is not None and not aug.mlm.use_token_types
    assert aug.candidates(SENTENCES) == aug.reference_candidates(SENTENCES, autograd=False)


def test_cased_mlm_keeps_case_and_title_cases_glove_neighbours(tokenizer, tmp_path):
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) + ["S", "##tory", "##telling", "Great"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cased = transformers.BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"), do_lower_case=False)
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(cased), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=64)
    glove = tmp_path / "g.txt"
    glove.write_text("Storytelling 1 0 0\nnarrative 0.9 0.1 0\nplot 0.5 0.5 0\nzebra 0 0 1\n", encoding="utf-8")
    aug = Augmenter(transformers.BertForMaskedLM(cfg).eval(), cased, load_word_vectors(glove, use_cache=False),
                    AugmentConfig(k=2))
    a = aug.analyse("Storytelling is Great")
    assert a.words == ["Storytelling", "is", "Great"] and a.lengths[0] == 3 and a.eligible == [0, 2]
    cands = aug.candidates(["Storytelling is Great"])[0]
    assert cands[0] == ["Narrative", "Plot"]
