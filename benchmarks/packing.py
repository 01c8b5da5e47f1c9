"""Padded positions of the general corpus's sequences: each document packed alone vs packed across documents.

The corpus stage writes one sentence per line and a blank line between documents (`distillery.corpus`); the
masked-LM pre-training and general distillation read it as texts of whole sentences packed within each document
(`corpus.pack_sequences`: a document's end closes a sequence). Here the same prepared corpus and tokenizer give (a)
that packing and (b) the same sentences packed across document boundaries (RoBERTa's FULL-SENTENCES, one document
of every sentence), and the share of padded positions a batch of `--max-length` would carry in each, with the
sequence count (the steps of an epoch). (b) is not what the pipeline runs: on the demo it cost two of the five
students their lead over the direct baseline (the results log has both runs).

    python -m benchmarks.packing [--tokenizer DIR] [--max-length 128] [CORPUS FILES ...]

Defaults: the shared corpus (../shared/data/corpus, every .txt but licences) and all-MiniLM-L6-v2's tokenizer (the
gpu preset's teacher). Last line: `padded_alone: <a> padded_packed: <b> sequences_alone: <n> sequences_packed: <m>`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import transformers

from distillery import corpus

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"


def padded_share(texts: list[str], tokenizer, max_length: int) -> float:
    lengths = [min(max_length, len(ids)) for ids in tokenizer(texts)["input_ids"]]
    return 1 - sum(lengths) / (max_length * len(lengths))


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--tokenizer", default=str(SHARED / "models" / "all-MiniLM-L6-v2"))
    p.add_argument("--max-length", type=int, default=128)
    args = p.parse_args(argv)
    files = args.files or sorted(f for f in (SHARED / "data" / "corpus").glob("*/*.txt") if "LICENSE" not in f.name)
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "corpus.txt"
        corpus.prepare_corpus(files, prepared)
        docs = corpus.read_sentences(prepared)
    alone = corpus.pack_sequences(docs, tok, args.max_length)
    packed = corpus.pack_sequences([[s for d in docs for s in d]], tok, args.max_length)
    out = {"padded_alone": padded_share(alone, tok, args.max_length),
           "padded_packed": padded_share(packed, tok, args.max_length),
           "sequences_alone": len(alone), "sequences_packed": len(packed)}
    print(f"{len(files)} files, {len(docs)} documents, {sum(map(len, docs))} sentences, max length {args.max_length}")
    print(f"(a) each document alone:  {len(alone)} sequences, {out['padded_alone']:.1%} of positions padding")
    print(f"(b) across documents:     {len(packed)} sequences, {out['padded_packed']:.1%} of positions padding")
    print(" ".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
