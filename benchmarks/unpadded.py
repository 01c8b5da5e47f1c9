"""A task's fine-tuning step padded, unpadded, and unpadded with its attention in length groups
(`distillery.training.unpadding`), side by side in one run, on fresh batches as the pipeline's.

    python -m benchmarks.unpadded [--reps 5] [--batches 8] [--layers 6] [--precision bf16] [--group-cost C]

The local preset's shapes: all-MiniLM-L6-v2's tokenizer and encoder shape (6 x 384, random weights: timing does not
read them; --layers 3 for its student), max length 64, batch 32, a sequence classifier trained with cross-entropy,
backward and fused AdamW, as the pipeline's Trainer runs it (`distillery.training.cpu_kernels`, bf16 autocast,
`distillery.runtime.steady_allocator`). For SST-2 and CoLA, random batches of the real training split
(../shared/data/glue; generated sentences without it), each padded to its longest sentence as the pipeline's
collator pads them. Four forms: padded; unpadded with the attention of the whole batch padded to its longest
sentence (``--group-cost inf``); unpadded with the attention in length groups (`unpadding.groups`,
`unpadding.GROUP_COST` or --group-cost); and the same with the unpadded sequence at its exact length instead of
rounded up to a multiple of `unpadding.ROWS` ("exact rows"). Each pass of a form runs --batches batches it has not
seen, as the pipeline's steps do: a bf16 matmul on a CPU builds a oneDNN kernel for each new shape and keeps 1,024,
so batches that repeat would hide what a new length costs. Interleaved (one order, then the reverse) after a warm-up:
the median step time of each form's passes, and the median [p10-p90] of the paired ratios.

And inference as the evaluate stage and the teacher-logits cache run it (`distillery.evaluation.predict_logits`,
batches of 64 in the data's order, bf16 autocast, SDPA): fresh sentences padded and unpadded (`unpadding.inferring`),
interleaved likewise.

Last line: ``gain_sst2: X gain_cola: Y grouping_sst2: G grouping_cola: H rows_sst2: R rows_cola: S infer_gain_sst2: I
infer_gain_cola: J padded_sst2: P padded_cola: Q`` (the median paired ratio of the padded step's time over the
grouped unpadded one's; of the one-group unpadded step's over the grouped one's; of the exact-rows step's over the
grouped one's; of padded inference over unpadded; the share of padded positions in the batches).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator

import torch
import transformers

from distillery import precision
from distillery.runtime import steady_allocator
from distillery.training import cpu_kernels, unpadding

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"
TASKS = {"sst2": "SST-2", "cola": "CoLA"}


def sentences(task: str, n: int | None, seed: int) -> list[str]:
    """`n` random training sentences of `task` (the real split where ../shared has it; generated sentences without
    it); None: all of the split (20,000 generated)."""
    path = SHARED / "data" / "glue" / TASKS[task] / "train.tsv"
    rng = random.Random(seed)
    if path.is_file():
        from distillery.glue import get_task, load_split_file

        texts = load_split_file(get_task(task), path)["text_a"]
        return list(texts) if n is None else [texts[i] for i in rng.sample(range(len(texts)), n)]
    words = "the a film movie was is not very good bad story actors plot and of it this one".split()
    return [" ".join(rng.choices(words, k=rng.randint(3, 40))) for _ in range(20_000 if n is None else n)]


def tokenizer():
    local = SHARED / "models" / "all-MiniLM-L6-v2"
    if local.is_dir():
        return transformers.AutoTokenizer.from_pretrained(local)
    from benchmarks.augment import bert_tokenizer

    return bert_tokenizer()


def passes(model: torch.nn.Module, batches: Callable[[], list[dict[str, torch.Tensor]]], form: str,
           group_cost: float = unpadding.GROUP_COST) -> dict[str, Callable[[], Callable[[], None]]]:
    """Training passes padded, unpadded with one attention group, unpadded in groups, and unpadded in groups at the
    exact length: each form's callable draws fresh `batches()` and returns the pass over them."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def run(unpadded: bool, cost: float = group_cost, rows: int = unpadding.ROWS) -> Callable[[], Callable[[], None]]:
        def drawn() -> Callable[[], None]:
            fresh = batches()

            def go() -> None:
                precision.fast_attention(model, "cpu", form, training=True)
                before = unpadding.GROUP_COST, unpadding.ROWS
                unpadding.GROUP_COST, unpadding.ROWS = cost, rows
                try:
                    with cpu_kernels.used(model, "cpu"), (unpadding.used(model, "cpu") if unpadded else nullcontext()):
                        for batch in fresh:
                            with precision.autocast("cpu", form):
                                loss = model(**batch).loss
                            loss.backward()
                            opt.step()
                            opt.zero_grad(set_to_none=True)
                finally:
                    unpadding.GROUP_COST, unpadding.ROWS = before

            return go

        return drawn

    return {"padded": run(False), "one group": run(True, float("inf")), "grouped": run(True),
            "exact rows": run(True, rows=1)}


def inference(model: torch.nn.Module, tok, texts: Callable[[], list[str]],
              form: str) -> dict[str, Callable[[], Callable[[], None]]]:
    """`predict_logits` padded and unpadded: each form's callable draws fresh `texts()` and returns the run over them."""
    import datasets

    from distillery import evaluation

    def run(unpadded: bool) -> Callable[[], Callable[[], None]]:
        def drawn() -> Callable[[], None]:
            encoded = datasets.Dataset.from_dict(dict(tok(texts(), max_length=64, truncation=True)))

            def go() -> None:
                with precision.use(form), (nullcontext() if unpadded else _padded_inference()):
                    evaluation.predict_logits(model, tok, encoded)

            return go

        return drawn

    return {"padded": run(False), "unpadded": run(True)}


@contextmanager
def _padded_inference() -> Iterator[None]:
    """`predict_logits` padded within: `unpadding.inferring` made to enter nothing."""
    before = unpadding.inferring
    unpadding.inferring = lambda *_: nullcontext(False)
    try:
        yield
    finally:
        unpadding.inferring = before


def _timed(fns: dict[str, Callable[[], Callable[[], None]]], reps: int) -> dict[str, list[float]]:
    """Each form's times after a warm-up, interleaved: one order, then the reverse. A form's callable draws its
    inputs (untimed) and returns the run that is timed."""
    for fn in fns.values():
        fn()()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(reps):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            go = fns[name]()
            t0 = time.perf_counter()
            go()
            times[name].append(time.perf_counter() - t0)
    return times


def _paired(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """The median, p10 and p90 of the paired ratios before / after."""
    ratios = sorted(a / b for a, b in zip(before, after))
    return (statistics.median(ratios), ratios[int(0.1 * (len(ratios) - 1))],
            ratios[round(0.9 * (len(ratios) - 1))])


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--group-cost", type=float, default=unpadding.GROUP_COST)
    args = p.parse_args(argv)
    transformers.logging.set_verbosity_error()
    tok = tokenizer()
    steady_allocator()
    out: dict[str, float] = {}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.precision}, "
          f"{args.layers} x 384, batch 32, max length 64", flush=True)
    for task in TASKS:
        torch.manual_seed(0)
        pool = sentences(task, None, seed=0)
        rng = random.Random(0)
        per_pass = 32 * args.batches

        def texts() -> list[str]:
            return rng.sample(pool, per_pass)

        def batches() -> list[dict[str, torch.Tensor]]:
            drawn = texts()
            return [{**tok(drawn[32 * i:32 * (i + 1)], max_length=64, truncation=True, padding=True,
                           return_tensors="pt"), "labels": torch.randint(0, 2, (32,))} for i in range(args.batches)]

        sample = batches()
        real = sum(int(b["attention_mask"].sum()) for b in sample)
        padded = 1 - real / sum(b["attention_mask"].numel() for b in sample)
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=len(tok), num_hidden_layers=args.layers, hidden_size=384, num_attention_heads=12,
            intermediate_size=1536, num_labels=2)).train()
        times = _timed(passes(model, batches, args.precision, args.group_cost), args.reps)
        med = {k: 1000 * statistics.median(v) / args.batches for k, v in times.items()}
        gain, lo, hi = _paired(times["padded"], times["grouped"])
        grouping, glo, ghi = _paired(times["one group"], times["grouped"])
        rows, rlo, rhi = _paired(times["exact rows"], times["grouped"])
        print(f"{task}: {padded:.1%} of the positions padded; a step padded {med['padded']:.0f} ms, unpadded "
              f"{med['one group']:.0f} ms, unpadded in length groups {med['grouped']:.0f} ms (at the exact length "
              f"{med['exact rows']:.0f} ms): {gain:.2f}x [{lo:.2f}-{hi:.2f}] (length groups {grouping:.2f}x "
              f"[{glo:.2f}-{ghi:.2f}], rows rounded up to {unpadding.ROWS} {rows:.2f}x [{rlo:.2f}-{rhi:.2f}])",
              flush=True)
        infer = _timed(inference(model.eval(), tok, texts, args.precision), args.reps)
        infer_gain, ilo, ihi = _paired(infer["padded"], infer["unpadded"])
        print(f"{task}: inference of {per_pass} sentences padded {statistics.median(infer['padded']):.2f} s, "
              f"unpadded {statistics.median(infer['unpadded']):.2f} s: {infer_gain:.2f}x [{ilo:.2f}-{ihi:.2f}]",
              flush=True)
        out.update({f"gain_{task}": gain, f"grouping_{task}": grouping, f"rows_{task}": rows,
                    f"infer_gain_{task}": infer_gain, f"padded_{task}": padded})
    print(" ".join(f"{k}_{t}: {out[f'{k}_{t}']:.{3 if k == 'padded' else 2}f}"
                   for k in ("gain", "grouping", "rows", "infer_gain", "padded") for t in TASKS))
    return out


if __name__ == "__main__":
    main()
