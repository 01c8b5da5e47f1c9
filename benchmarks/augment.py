"""TinyBERT data augmentation speed: per-position reference vs faithful batched path vs floor vs fast mode.

Run as ``python -m benchmarks.augment``. On the same sentences (the first --sentences of
../shared/data/glue/SST-2/train.tsv when present, else generated), the same MLM (BERT-base-shaped with
random weights by default, 2 x 64 with --tiny, or --mlm DIR) and the same GloVe vectors, it times in one run:

  (a) reference: what the official script does -- one batch-1 full MLM forward per eligible single-piece
      word (autograd on), a full argsort over the GloVe matrix per multi-piece word, then N_a tries;
  (b) faithful: `Augmenter.augment_rows` -- masked copies batched across positions and sentences,
      length-bucketed, inference mode, vocabulary head at masked positions only, then N_a tries;
  (c) floor: the MLM work of (b) alone (the same masked copies and batch size, encoder + head at the
      masked positions + top-K ids), nothing else;
  (d) fast mode: one masked copy per sentence (all eligible single-piece words masked at once).

The sentences are split into chunks and the four are interleaved chunk by chunk (a b c d a b c d ...),
so machine load drifts hit all of them alike. Prints sentences/second for each, and as the last line:
``speedup: <b over a> floor_ratio: <b time over c time> fast_speedup: <d over a> fast_overlap: <x>``
where fast_overlap is the mean fraction of the faithful MLM top-K candidates that fast mode also
proposes (over MLM-predicted words; GloVe words are identical in both modes by construction).
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from distillery.augment import AugmentConfig, Augmenter, candidate_overlap, load_word_vectors, sample_variants
from distillery.augment.algorithm import sentence_rng

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"
SST2 = SHARED / "data" / "glue" / "SST-2" / "train.tsv"
VOCAB = SHARED / "data" / "vocab" / "bert-base-uncased-vocab.txt"
GLOVE = SHARED / "data" / "glove" / "glove.6B.50d.top5k.txt"


def _sentences(n: int, vocab: list[str]) -> list[str]:
    if SST2.is_file():
        lines = SST2.read_text(encoding="utf-8").splitlines()[1:n + 1]
        return [line.split("\t")[0] for line in lines]
    rng = random.Random(0)
    words = [w for w in vocab if w.isalpha() and len(w) > 2]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(n)]


def bert_tokenizer():
    """BERT's uncased vocabulary from ../shared, else a generated one (letters + ## letters + pseudo-words)."""
    if VOCAB.is_file():
        return transformers.BertTokenizerFast(vocab=str(VOCAB))
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(30000)}
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ",", "."] + list(letters) + ["##" + c for c in letters]
    vocab += sorted(words)
    path = Path(tempfile.mkdtemp()) / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return transformers.BertTokenizerFast(vocab=str(path))


def _tokenizer_and_model(args) -> tuple:
    if args.mlm:
        tok = transformers.AutoTokenizer.from_pretrained(args.mlm)
        model = transformers.AutoModelForMaskedLM.from_pretrained(args.mlm)
    else:
        tok = bert_tokenizer()
        torch.manual_seed(0)
        tiny = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
        size = tiny if args.tiny else {}
        cfg = transformers.BertConfig(vocab_size=len(tok), **size)  # else BERT-base's shape: 12 x 768, 12 heads, 3072
        model = transformers.BertForMaskedLM(cfg)
    return tok, model.eval().to(args.device)


def _vectors(tok, cache_dir: str):
    if GLOVE.is_file():
        return load_word_vectors(GLOVE, cache_dir=cache_dir)
    rng = np.random.default_rng(0)
    words = [w for w in tok.convert_ids_to_tokens(list(range(len(tok)))) if w.isalpha()][:5000]
    path = Path(cache_dir) / "glove.txt"
    path.write_text("".join(w + " " + " ".join(f"{x:.4f}" for x in rng.normal(size=50)) + "\n" for w in words))
    return load_word_vectors(path, cache_dir=cache_dir)


def _write(rows, sink) -> int:
    writer = csv.writer(sink, delimiter="\t", lineterminator="\n")
    n = 0
    for r in rows:
        writer.writerow([r["text_a"], r["label"], r["source_idx"]])
        n += 1
    return n


def _reference(aug: Augmenter, rows: list[dict], n_aug: int) -> tuple[list[dict], int]:
    sents = [r["text_a"] for r in rows]
    cands = aug.reference_candidates(sents, autograd=True)
    out = []
    for r, c in zip(rows, cands):
        a = aug.analyse(r["text_a"])
        rng = sentence_rng(aug.config.seed, r["idx"], "text_a")
        for text in sample_variants(a, c, n_aug, aug.config.p_t, rng):
            out.append({"text_a": text, "label": r["label"], "source_idx": r["idx"]})
    return cands, _write(out, io.StringIO())


def main(argv: list[str] | None = None) -> float:
    """Print the measurements; return the speedup of the faithful batched path over the reference."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sentences", type=int, default=200, help="first N SST-2 training sentences")
    p.add_argument("--chunk", type=int, default=50, help="sentences per interleaved chunk")
    p.add_argument("--n-aug", type=int, default=20)
    p.add_argument("--k", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--mlm", default=None, help="a real masked-LM directory instead of the random BERT-base")
    p.add_argument("--tiny", action="store_true", help="a random 2 x 64 BERT instead of BERT-base (the test suite's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    tok, model = _tokenizer_and_model(args)
    cache = tempfile.mkdtemp(prefix="augment-bench-")
    vectors = _vectors(tok, cache)
    sentences = _sentences(args.sentences, tok.convert_ids_to_tokens(list(range(len(tok)))))
    rows = [{"text_a": s, "label": 0, "idx": i} for i, s in enumerate(sentences)]
    base = dict(k=args.k, n_aug=args.n_aug, batch_size=args.batch_size, chunk_size=args.chunk)
    faithful = Augmenter(model, tok, vectors, AugmentConfig(**base))
    fast = Augmenter(model, tok, vectors, AugmentConfig(**base, fast=True))
    print(f"MLM: {type(model).__name__} {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params on "
          f"{args.device}; {len(sentences)} sentences, N_a={args.n_aug}, K={args.k}, batch {args.batch_size}, "
          f"torch threads {torch.get_num_threads()}")

    times = {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}
    ref_cands, fast_cands, faithful_cands, mlm_positions = [], [], [], []
    forwards = {"a": 0, "c": 0}
    faithful.candidates(sentences[:2]), fast.candidates(sentences[:2])  # warm-up
    for start in range(0, len(rows), args.chunk):
        chunk = rows[start:start + args.chunk]
        sents = [r["text_a"] for r in chunk]
        analyses = [faithful.analyse(s) for s in sents]
        copies, _, _ = faithful._plan(analyses, fast=False)
        forwards["a"] += len(copies)
        mlm_positions += [[i for i in a.eligible if a.lengths[i] == 1] for a in analyses]

        t = time.perf_counter()
        cands, _ = _reference(faithful, chunk, args.n_aug)
        times["a"] += time.perf_counter() - t
        ref_cands += cands

        t = time.perf_counter()
        _write(faithful.augment_rows(chunk), io.StringIO())
        times["b"] += time.perf_counter() - t

        t = time.perf_counter()
        forwards["c"] += faithful.mlm.forward_only(copies, args.k, args.batch_size)
        times["c"] += time.perf_counter() - t

        t = time.perf_counter()
        _write(fast.augment_rows(chunk), io.StringIO())
        times["d"] += time.perf_counter() - t

        faithful_cands += faithful.candidates_for(analyses)
        fast_cands += fast.candidates_for(analyses)
        done = start + len(chunk)
        print(f"  {done:>4} sentences: " + " ".join(f"{k}={v:.1f}s" for k, v in times.items()), flush=True)

    n = len(rows)
    agree = sum(r == f for r, f in zip(ref_cands, faithful_cands))
    print(f"(a) reference (official-like, {forwards['a']} batch-1 forwards): {n / times['a']:.2f} sentences/s")
    print(f"(b) faithful batched path:                 {n / times['b']:.2f} sentences/s")
    print(f"(c) floor (same {forwards['c']} masked positions, batched): {n / times['c']:.2f} sentences/s")
    print(f"(d) fast mode (one forward per sentence):  {n / times['d']:.2f} sentences/s")
    print(f"faithful candidates equal to the reference for {agree}/{n} sentences")
    overlap_all = candidate_overlap(faithful_cands, fast_cands)
    print(f"fast_overlap over all eligible words (GloVe words included): {overlap_all:.3f}")
    overlap = candidate_overlap(faithful_cands, fast_cands, mlm_positions)
    print(f"speedup: {times['a'] / times['b']:.2f} floor_ratio: {times['b'] / times['c']:.3f} "
          f"fast_speedup: {times['a'] / times['d']:.2f} fast_overlap: {overlap:.3f}")
    return times["a"] / times["b"]


if __name__ == "__main__":
    main()
