"""A masked-LM training step with the prediction head on every position and on the labelled positions alone
(`distillery.training.sparse_prediction`), side by side in one run, on fresh batches as the pipeline's.

    python -m benchmarks.mlm_step [--reps 10] [--batches 4] [--layers 6] [--batch-size 16] [--precision bf16]

The local preset's MLM pre-training: all-MiniLM-L6-v2's tokenizer (30,522 words) and encoder shape (6 x 384, random
weights: timing does not read them), sentences of the shared corpus (../shared/data/corpus/wikitext-2's valid.txt;
generated ones without it) packed to 64 tokens as the pretrain stage packs them, 15% of the tokens masked
(`DataCollatorForLanguageModeling`), batch 16, backward, gradient clipping and fused AdamW, as the pipeline's Trainer
runs it (`distillery.training.cpu_kernels`, unpadded, bf16 autocast, `distillery.runtime.steady_allocator`).
Interleaved (one order, then the reverse) after a warm-up: each form's median step time and the median [p10-p90] of
the paired ratios.

Last line: ``gain: X labelled: L`` (the median paired ratio of the full head's step time over the labelled
positions' one; the share of positions with a label).
"""

from __future__ import annotations

import argparse
import random
import statistics
from contextlib import nullcontext
from typing import Callable

import torch
import transformers

from benchmarks.unpadded import SHARED, _paired, _timed, tokenizer
from distillery import precision
from distillery.corpus import pack_sequences, read_documents
from distillery.runtime import steady_allocator
from distillery.training import cpu_kernels, sparse_prediction, unpadding


def texts(tok, n: int, seed: int) -> list[str]:
    """`n` sequences of the shared corpus packed to 64 tokens (generated sentences without it)."""
    path = SHARED / "data" / "corpus" / "wikitext-2" / "valid.txt"
    if path.is_file():  # its paragraphs cut into sentences at full stops
        lines = [s.strip() + "." for doc in read_documents(path) for s in doc.split(" . ") if len(s.split()) > 3]
    else:
        rng = random.Random(seed)
        words = "the a film movie was is not very good bad story actors plot and of it this one".split()
        lines = [" ".join(rng.choices(words, k=rng.randint(3, 40))) for _ in range(5000)]
    packed = pack_sequences([lines[:20_000]], tok, 64)
    return random.Random(seed).sample(packed, min(n, len(packed)))


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    args = p.parse_args(argv)
    transformers.logging.set_verbosity_error()
    tok = tokenizer()
    steady_allocator()
    torch.manual_seed(0)
    pool = texts(tok, 4000, seed=0)
    rng = random.Random(0)
    collator = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=0.15, seed=0)

    def batches() -> list[dict[str, torch.Tensor]]:
        out = []
        for _ in range(args.batches):
            enc = tok(rng.sample(pool, args.batch_size), max_length=64, truncation=True)
            out.append(collator([{k: enc[k][i] for k in enc} for i in range(args.batch_size)]))
        return out

    sample = batches()
    labelled = sum(int((b["labels"] != -100).sum()) for b in sample) / sum(b["labels"].numel() for b in sample)
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(tok), num_hidden_layers=args.layers, hidden_size=384, num_attention_heads=12,
        intermediate_size=1536)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    precision.fast_attention(model, "cpu", args.precision, training=True)

    def run(sparse: bool) -> Callable[[], Callable[[], None]]:
        def drawn() -> Callable[[], None]:
            fresh = batches()

            def go() -> None:
                with cpu_kernels.used(model, "cpu"), unpadding.used(model, "cpu"), \
                        (sparse_prediction.used(model) if sparse else nullcontext()):
                    for batch in fresh:
                        with precision.autocast("cpu", args.precision):
                            loss = model(**batch).loss
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        opt.step()
                        opt.zero_grad(set_to_none=True)

            return go

        return drawn

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.precision}, {args.layers} x 384, "
          f"vocabulary {len(tok)}, batch {args.batch_size} x 64, {labelled:.1%} of the positions labelled", flush=True)
    times = _timed({"every position": run(False), "labelled positions": run(True)}, args.reps)
    med = {k: 1000 * statistics.median(v) / args.batches for k, v in times.items()}
    gain, lo, hi = _paired(times["every position"], times["labelled positions"])
    print(f"a step with the head on every position {med['every position']:.0f} ms, on the labelled positions "
          f"{med['labelled positions']:.0f} ms: {gain:.2f}x [{lo:.2f}-{hi:.2f}]")
    print(f"gain: {gain:.2f} labelled: {labelled:.3f}")
    return {"gain": gain, "labelled": labelled}


if __name__ == "__main__":
    main()
