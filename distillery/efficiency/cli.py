"""`distillery speed` (latency table for saved models) and `distillery export` (ONNX + int8)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from distillery.io import atomic_dir, write_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "config.json")


def export_dir(model_dir: str | Path, out_dir: str | Path, *, opset: int = 17, int8: bool = True,
               optimize: bool = False) -> dict:
    """Write out_dir/{model.onnx, model.int8.onnx, export.json, tokenizer files}; return export.json's content.

    With `optimize`, the fp32 graph is first passed through ONNX Runtime's transformer optimiser
    (model.opt.onnx) and the int8 model is quantised from it.
    """
    from distillery.efficiency.export import export_onnx, load_model_for_export, optimize_onnx, quantize_onnx
    from distillery.efficiency.flops import FlopsConfigError, flops_per_example
    from distillery.efficiency.size import disk_size_bytes, parameter_counts

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    model = load_model_for_export(model_dir)
    info: dict = {"source": str(model_dir), "parameters": parameter_counts(model)}
    try:
        info["flops_per_example_128"] = flops_per_example(model.config, 128)
    except FlopsConfigError:
        info["flops_per_example_128"] = None
    with atomic_dir(out_dir) as tmp:
        res = export_onnx(model, tmp / "model.onnx", opset=opset)
        info["onnx"] = {**res.as_dict(), "path": "model.onnx"}
        source = tmp / "model.onnx"
        if optimize:
            cfg = model.config
            heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_heads")
            hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "dim")
            info["fused_operators"] = optimize_onnx(source, tmp / "model.opt.onnx", num_heads=heads, hidden_size=hidden)
            source = tmp / "model.opt.onnx"
        if int8:
            q = quantize_onnx(source, tmp / "model.int8.onnx")
            info["int8"] = {"path": "model.int8.onnx", "bytes": q.stat().st_size}
        for name in TOKENIZER_FILES:
            if (model_dir / name).is_file():
                shutil.copy2(model_dir / name, tmp / name)
        info["bytes_on_disk"] = {p.name: disk_size_bytes(p) for p in sorted(tmp.glob("*.onnx"))}
        write_json(tmp / "export.json", info)
    return info


def _speed(args: argparse.Namespace) -> int:
    import torch

    from distillery.efficiency.export import OnnxModel, load_model_for_export
    from distillery.efficiency.latency import latency_table, measure_latency

    if args.threads:
        torch.set_num_threads(args.threads)
    models = {}
    for spec in args.models:
        path = Path(spec)
        if path.suffix == ".onnx":
            models[path.name] = OnnxModel(path)
        else:
            models[path.name or spec] = load_model_for_export(path)
    results = measure_latency(models, batch=args.batch, seq_len=args.seq, reps=args.reps, warmup=args.warmup,
                              reference=args.reference, device=args.device)
    print(latency_table(results), end="")
    if args.json:
        write_json(args.json, {name: r.as_dict() for name, r in results.items()})
    return 0


def _export(args: argparse.Namespace) -> int:
    info = export_dir(args.model_dir, args.out_dir, opset=args.opset, int8=not args.no_int8, optimize=args.optimize)
    print(f"exported {args.model_dir} -> {args.out_dir} (max |onnx - torch| {info['onnx']['max_abs_diff']:.2e}); "
          f"files: {info['bytes_on_disk']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    sp = subparsers.add_parser("speed", help="latency/throughput of saved models (or .onnx files), interleaved")
    sp.add_argument("models", nargs="+", help="save_pretrained directories or .onnx files; the first is the reference")
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--seq", type=int, default=128)
    sp.add_argument("--reps", type=int, default=20)
    sp.add_argument("--warmup", type=int, default=3)
    sp.add_argument("--reference", default=None, help="model name (directory name) the speedups are relative to")
    sp.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    sp.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    sp.add_argument("--json", default=None, help="also write the results to this JSON file")
    sp.set_defaults(func=_speed)

    ep = subparsers.add_parser("export", help="export a saved model to ONNX (dynamic axes) and int8")
    ep.add_argument("model_dir")
    ep.add_argument("out_dir")
    ep.add_argument("--opset", type=int, default=17)
    ep.add_argument("--no-int8", action="store_true", help="skip the int8 dynamic quantisation")
    ep.add_argument("--optimize", action="store_true", help="fuse with ONNX Runtime's transformer optimiser first")
    ep.set_defaults(func=_export)
