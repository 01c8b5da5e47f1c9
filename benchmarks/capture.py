"""Overhead of capture() on a BERT-base-shaped teacher forward (CPU, eval, no_grad).

Variant A: plain forward. Variant B: the same forward while capturing what a TinyBERT4 uniform map
needs from the teacher (pre-softmax scores of layers 2, 5, 8, 11; hidden states 0, 3, 6, 9, 12).
Repetitions are interleaved (ABAB...) and medians compared. Last line: ``overhead: <B/A>``.

    python -m benchmarks.capture [--batch 32] [--seq 128] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from distillery.capture import capture
from distillery.layer_map import build_layer_map


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--layers", type=int, default=12)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=args.layers,
                                  num_attention_heads=12, intermediate_size=3072)
    model = transformers.AutoModel.from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(1000, 30522, (args.batch, args.seq))
    mask = torch.ones_like(ids)
    lengths = torch.randint(args.seq // 2, args.seq + 1, (args.batch,))
    mask[torch.arange(args.seq)[None, :] >= lengths[:, None]] = 0
    lm = build_layer_map("uniform", 4, args.layers)
    print(f"BERT-base-shaped teacher ({args.layers} layers), batch {args.batch}, seq {args.seq}, "
          f"threads {torch.get_num_threads()}, attn {model.config._attn_implementation}")
    print(f"capture: scores layers {list(lm.teacher_layers)}, hidden states {list(lm.teacher_states)}")

    def plain() -> None:
        model(input_ids=ids, attention_mask=mask)

    def captured() -> None:
        with capture(model, scores=lm.teacher_layers, hidden=lm.teacher_states) as c:
            model(input_ids=ids, attention_mask=mask)
        assert len(c.scores) == 4 and len(c.hidden) == 5

    times: dict[str, list[float]] = {"plain": [], "capture": []}
    with torch.inference_mode():
        plain(), captured()  # warm-up
        for _ in range(args.reps):
            for name, fn in (("plain", plain), ("capture", captured)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:8s} median {med[k]:.3f} s  runs {' '.join(f'{x:.3f}' for x in v)}")
    print(f"overhead: {med['capture'] / med['plain']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
