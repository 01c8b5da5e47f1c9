"""A task's fine-tuning step padded, unpadded, and unpadded with its attention in length groups
(`distillery.training.unpadding`), side by side in one run.

    python -m benchmarks.unpadded [--reps 5] [--batches 8] [--layers 6] [--precision bf16] [--group-cost C]

The local preset's shapes: all-MiniLM-L6-v2's tokenizer and encoder shape (6 x 384, random weights: timing does not
read them; --layers 3 for its student), max length 64, batch 32, a sequence classifier trained with cross-entropy,
backward and fused AdamW, as the pipeline's Trainer runs it (`distillery.training.cpu_kernels`, bf16 autocast,
`distillery.runtime.steady_allocator`). For SST-2 and CoLA, --batches random batches of the real training split
(../shared/data/glue; generated sentences without it), each padded to its longest sentence as the pipeline's
collator pads them. Three forms: padded; unpadded with the attention of the whole batch padded to its longest sentence
(``--group-cost inf``); unpadded with the attention in length groups (`unpadding.groups`, `unpadding.GROUP_COST` or
--group-cost). Interleaved (one order, then the reverse) after a warm-up: the median step time of each form's passes
over the batches, and the median [p10-p90] of the paired ratios.

And inference as the evaluate stage and the teacher-logits cache run it (`distillery.evaluation.predict_logits`,
batches of 64 in the data's order, bf16 autocast, SDPA): the same sentences padded and unpadded
(`unpadding.inferring`), interleaved likewise.

Last line: ``gain_sst2: X gain_cola: Y grouping_sst2: G grouping_cola: H infer_gain_sst2: I infer_gain_cola: J
padded_sst2: P padded_cola: Q`` (the median paired ratio of the padded step's time over the grouped unpadded one's;
of the one-group unpadded step's over the grouped one's; of padded inference over unpadded; the share of padded
positions in the batches).
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


def sentences(task: str, n: int, seed: int) -> list[str]:
    """`n` random training sentences of `task` (the real split where ../shared has it)."""
    path = SHARED / "data" / "glue" / TASKS[task] / "train.tsv"
    rng = random.Random(seed)
    if path.is_file():
        from distillery.glue import get_task, load_split_file

        texts = load_split_file(get_task(task), path)["text_a"]
        return [texts[i] for i in rng.sample(range(len(texts)), n)]
    words = "the a film movie was is not very good bad story actors plot and of it this one".split()
    return [" ".join(rng.choices(words, k=rng.randint(3, 40))) for _ in range(n)]


def tokenizer():
    local = SHARED / "models" / "all-MiniLM-L6-v2"
    if local.is_dir():
        return transformers.AutoTokenizer.from_pretrained(local)
    from benchmarks.augment import bert_tokenizer

    return bert_tokenizer()


def passes(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], form: str,
           group_cost: float = unpadding.GROUP_COST) -> dict[str, Callable[[], None]]:
    """One training pass over `batches` padded, one unpadded with one attention group, one unpadded in groups."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def run(unpadded: bool, cost: float = group_cost) -> Callable[[], None]:
        def go() -> None:
            precision.fast_attention(model, "cpu", form, training=True)
            before, unpadding.GROUP_COST = unpadding.GROUP_COST, cost
            try:
                with cpu_kernels.used(model, "cpu"), (unpadding.used(model, "cpu") if unpadded else nullcontext()):
                    for batch in batches:
                        with precision.autocast("cpu", form):
                            loss = model(**batch).loss
                        loss.backward()
                        opt.step()
                        opt.zero_grad(set_to_none=True)
            finally:
                unpadding.GROUP_COST = before

        return go

    return {"padded": run(False), "one group": run(True, float("inf")), "grouped": run(True)}


def inference(model: torch.nn.Module, tok, texts: list[str], form: str) -> dict[str, Callable[[], None]]:
    """`predict_logits` over `texts` padded and unpadded."""
    import datasets

    from distillery import evaluation

    encoded = datasets.Dataset.from_dict(dict(tok(texts, max_length=64, truncation=True)))

    def run(unpadded: bool) -> Callable[[], None]:
        def go() -> None:
            with precision.use(form), (nullcontext() if unpadded else _padded_inference()):
                evaluation.predict_logits(model, tok, encoded)

        return go

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


def _timed(fns: dict[str, Callable[[], None]], reps: int) -> dict[str, list[float]]:
    """Each form's times after a warm-up, interleaved: one order, then the reverse."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(reps):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            t0 = time.perf_counter()
            fns[name]()
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
        texts = sentences(task, 32 * args.batches, seed=0)
        batches = []
        for i in range(args.batches):
            enc = tok(texts[32 * i:32 * (i + 1)], max_length=64, truncation=True, padding=True, return_tensors="pt")
            batches.append({**enc, "labels": torch.randint(0, 2, (32,))})
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        padded = 1 - real / sum(b["attention_mask"].numel() for b in batches)
        model = transformers.BertForSequenceClassification(transformers.BertConfig(
            vocab_size=len(tok), num_hidden_layers=args.layers, hidden_size=384, num_attention_heads=12,
            intermediate_size=1536, num_labels=2)).train()
        times = _timed(passes(model, batches, args.precision, args.group_cost), args.reps)
        med = {k: 1000 * statistics.median(v) / args.batches for k, v in times.items()}
        gain, lo, hi = _paired(times["padded"], times["grouped"])
        grouping, glo, ghi = _paired(times["one group"], times["grouped"])
        print(f"{task}: {padded:.1%} of the positions padded; a step padded {med['padded']:.0f} ms, unpadded "
              f"{med['one group']:.0f} ms, unpadded in length groups {med['grouped']:.0f} ms: "
              f"{gain:.2f}x [{lo:.2f}-{hi:.2f}] (length groups {grouping:.2f}x [{glo:.2f}-{ghi:.2f}])", flush=True)
        infer = _timed(inference(model.eval(), tok, texts, args.precision), args.reps)
        infer_gain, ilo, ihi = _paired(infer["padded"], infer["unpadded"])
        print(f"{task}: inference of {len(texts)} sentences padded {statistics.median(infer['padded']):.2f} s, "
              f"unpadded {statistics.median(infer['unpadded']):.2f} s: {infer_gain:.2f}x [{ilo:.2f}-{ihi:.2f}]",
              flush=True)
        out.update({f"gain_{task}": gain, f"grouping_{task}": grouping, f"infer_gain_{task}": infer_gain,
                    f"padded_{task}": padded})
    print(" ".join(f"{k}_{t}: {out[f'{k}_{t}']:.{3 if k == 'padded' else 2}f}"
                   for k in ("gain", "grouping", "infer_gain", "padded") for t in TASKS))
    return out


if __name__ == "__main__":
    main()
