"""BERT-base vs TinyBERT4 inference latency on CPU, per runtime, measured interleaved in one run.

Run: python -m benchmarks.speed [--reps 20] [--batch 1] [--seq 128]
Models have random weights (speed does not depend on them). Runtimes per model: PyTorch fp32,
PyTorch dynamic int8, ONNX Runtime fp32 (graph optimisations on), ONNX Runtime fp32 after the
transformer optimiser (fused attention), ONNX Runtime int8 (dynamic quantisation of the latter: weights per output
channel, what the pipeline deploys (`int8_export`), and per tensor; and of the unfused graph). Each timed sample is
at least `--min-sample-ms` of back-to-back calls of one model (its weights in cache, as when serving), and the
models alternate between samples in paired rounds; speedups are the median of the per-round ratios.
The last line is `speedup: <ratio>`: the fastest TinyBERT4 variant against PyTorch fp32 BERT-base.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers

from distillery.efficiency import (OnnxModel, export_onnx, flops_per_example, int8_export, latency_table,
                                   measure_latency, optimize_onnx, parameter_counts, quantize_onnx, quantize_torch)

SHAPES = {  # (layers, hidden, heads, intermediate): TinyBERT Table 1
    "bert-base": (12, 768, 12, 3072),
    "tinybert4": (4, 312, 12, 1200),
}


def build(layers: int, hidden: int, heads: int, inter: int) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                  intermediate_size=inter, num_labels=2)
    return transformers.BertForSequenceClassification(cfg).eval()


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--min-sample-ms", type=float, default=30.0,
                    help="each timed sample is at least this many ms of back-to-back calls (weights in cache)")
    args = ap.parse_args(argv)
    print(f"CPU threads: {torch.get_num_threads()}  batch {args.batch}  sequence {args.seq}", flush=True)
    runners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in SHAPES.items():
            model = build(*shape)
            counts = parameter_counts(model)
            print(f"{name}: {counts['total'] / 1e6:.1f}M params, "
                  f"{flops_per_example(model.config, args.seq) / 1e9:.2f} GFLOPs/example", flush=True)
            t0 = time.perf_counter()
            plain = Path(tmp) / f"{name}.onnx"
            res = export_onnx(model, plain)
            fused = Path(tmp) / f"{name}.opt.onnx"
            optimize_onnx(plain, fused, num_heads=shape[2], hidden_size=shape[1])
            int8 = Path(tmp) / f"{name}.opt.int8.onnx"
            stats = int8_export(model, plain, int8)  # what the pipeline serves
            per_tensor = quantize_onnx(fused, Path(tmp) / f"{name}.opt.int8t.onnx", per_channel=False)
            unfused = quantize_onnx(plain, Path(tmp) / f"{name}.int8.onnx")
            print(f"  exported in {time.perf_counter() - t0:.0f}s (max |onnx - torch| {res.max_abs_diff:.1e}); "
                  f"fused: {stats}", flush=True)
            runners[f"{name} pytorch-fp32"] = model
            runners[f"{name} pytorch-int8"] = quantize_torch(model)
            runners[f"{name} ort-fp32"] = OnnxModel(plain)
            runners[f"{name} ort-fp32-fused"] = OnnxModel(fused)
            runners[f"{name} ort-int8"] = OnnxModel(int8)
            runners[f"{name} ort-int8-per-tensor"] = OnnxModel(per_tensor)
            runners[f"{name} ort-int8-unfused"] = OnnxModel(unfused)
        ref = "bert-base pytorch-fp32"
        results = measure_latency(runners, batch=args.batch, seq_len=args.seq, reps=args.reps,
                                  warmup=args.warmup, reference=ref, device="cpu", min_sample_ms=args.min_sample_ms)
    print(latency_table(results), end="")
    tiny = {k: r for k, r in results.items() if k.startswith("tinybert4")}
    best = min(tiny.values(), key=lambda r: r.median_ms)
    print(f"fastest TinyBERT4 variant: {best.name} {best.median_ms:.2f} ms vs {ref} {results[ref].median_ms:.2f} ms")
    print(f"speedup: {best.speedup:.1f}")
    return best.speedup


if __name__ == "__main__":
    main()
