"""`distillery speed` (latency table for saved models) and `distillery export` (ONNX + int8).

`export` never replaces what it did not write: OUT_DIR must be new, empty, or an earlier export (its
`export.json` lists the files the export wrote, and nothing else may be there); OUT_DIR cannot be MODEL_DIR,
inside it, or contain it; an existing file is refused. The directory appears atomically when complete.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from distillery.errors import InputNotFoundError, OutputExistsError, non_negative_int, positive_int
from distillery.io import atomic_dir, write_json

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json", "config.json")
MANIFEST = "export.json"  # written by every export: `written_by` and the `files` it wrote mark the directory as ours
WRITTEN_BY = "distillery export"


def check_export_target(model_dir: Path, out_dir: Path) -> None:
    """Refuse an OUT_DIR the export would have to delete something of the user's to write: MODEL_DIR itself, a
    directory inside it or containing it, an existing file or link, a non-empty directory that is not an
    earlier export, or an earlier export holding files the export did not write."""
    model, out = model_dir.resolve(), out_dir.resolve()
    if out == model or model in out.parents:
        raise OutputExistsError(f"export: OUT_DIR {out_dir} is MODEL_DIR {model_dir} or inside it; give another "
                                "output directory (nothing was written)")
    if out in model.parents:
        raise OutputExistsError(f"export: OUT_DIR {out_dir} contains MODEL_DIR {model_dir}; give another output "
                                "directory (nothing was written)")
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise OutputExistsError(f"export: OUT_DIR {out_dir} exists and is not a directory; it is left as it is: "
                                "give a new directory path")
    if not out_dir.is_dir():
        return
    entries = {p.name for p in out_dir.iterdir()}
    if not entries:
        return
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
        owned = set(manifest["files"]) | {MANIFEST} if manifest.get("written_by") == WRITTEN_BY else set()
    except (OSError, ValueError, KeyError, TypeError):
        owned = set()
    if not owned:
        raise OutputExistsError(f"export: OUT_DIR {out_dir} is not empty and is not an earlier `distillery export` "
                                f"output (no {MANIFEST} of one); it is left as it is: give a new or empty directory")
    foreign = sorted(entries - owned)
    if foreign:
        raise OutputExistsError(f"export: OUT_DIR {out_dir} holds files an export did not write ({', '.join(foreign[:3])}"
                                f"{', ...' if len(foreign) > 3 else ''}); they are left as they are: move them or "
                                "give another directory")


def export_dir(model_dir: str | Path, out_dir: str | Path, *, opset: int = 17, int8: bool = True) -> dict:
    """Write out_dir/{model.onnx, model.int8.onnx, export.json, tokenizer files}; return export.json's content.

    model.int8.onnx is the form the pipeline serves (`int8_export`: fused by ONNX Runtime's transformer optimiser
    where it recognises the model, then quantised); export.json names the fused operators.
    """
    from distillery.efficiency.export import (
        check_saved_model,
        check_tokenizer_fits,
        export_onnx,
        int8_export,
        load_model_for_export,
    )
    from distillery.efficiency.flops import flops_if_counted
    from distillery.efficiency.size import disk_size_bytes, parameter_counts

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if not model_dir.is_dir():
        raise InputNotFoundError(f"export: MODEL_DIR {model_dir} not found")
    check_export_target(model_dir, out_dir)
    check_saved_model(model_dir)
    check_tokenizer_fits(model_dir)
    model = load_model_for_export(model_dir)
    info: dict = {"source": str(model_dir), "parameters": parameter_counts(model)}
    info["flops_per_example_128"] = flops_if_counted(model.config, 128)
    with atomic_dir(out_dir) as tmp:
        res = export_onnx(model, tmp / "model.onnx", opset=opset)
        info["onnx"] = {**res.as_dict(), "path": "model.onnx"}
        if int8:
            fused = int8_export(model, tmp / "model.onnx", tmp / "model.int8.onnx")
            info["int8"] = {"path": "model.int8.onnx", "bytes": (tmp / "model.int8.onnx").stat().st_size,
                            "fused_operators": fused}
        for name in TOKENIZER_FILES:
            if (model_dir / name).is_file():
                shutil.copy2(model_dir / name, tmp / name)
        info["bytes_on_disk"] = {p.name: disk_size_bytes(p) for p in sorted(tmp.glob("*.onnx"))}
        info["written_by"] = WRITTEN_BY
        info["files"] = sorted(p.name for p in tmp.iterdir()) + [MANIFEST]
        write_json(tmp / MANIFEST, info)
        check_export_target(model_dir, out_dir)  # nothing of the user's appeared there meanwhile
    return info


def _speed(args: argparse.Namespace) -> int:
    import torch

    from distillery.efficiency.export import OnnxModel, check_saved_model, check_tokenizer_fits, load_model_for_export
    from distillery.efficiency.latency import latency_table, measure_latency

    if args.json:
        check_results_file(Path(args.json))
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {}
    for spec in args.models:
        path = Path(spec)
        if not path.exists():
            raise InputNotFoundError(f"speed: {spec} not found (a save_pretrained directory or an .onnx file)")
        if path.suffix != ".onnx":  # every model checked before the first one loads
            check_saved_model(path)
            check_tokenizer_fits(path)
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


def _speed_rows(data) -> bool:
    """A results file of `speed`: a JSON object of per-model rows."""
    return isinstance(data, dict) and bool(data) and all(isinstance(r, dict) and "median_ms" in r
                                                         for r in data.values())


def _budget_rows(data) -> bool:
    """A results file of `budget`: the teacher's time and every candidate's row."""
    return isinstance(data, dict) and "teacher_ms" in data and isinstance(data.get("candidates"), dict)


def check_results_file(path: Path, command: str = "speed", ours=_speed_rows) -> None:
    """`speed --json` / `budget --json` replace only an earlier results file of their own (``ours(data)``)."""
    if path.is_dir():
        raise OutputExistsError(f"{command}: --json {path} is a directory; give a file path")
    if not path.exists():
        return
    try:
        mine = ours(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        mine = False
    if not mine:
        raise OutputExistsError(f"{command}: --json {path} exists and is not a results file of `distillery "
                                f"{command}`; it is left as it is: give another path")


def _budget(args: argparse.Namespace) -> int:
    """The student shapes (and deployed forms) that meet a latency budget on this machine, timed on random weights
    beside the teacher."""
    from distillery.efficiency.budget import (Budget, BudgetError, available_forms, candidates, measured_timer,
                                              time_candidates, within_budget)
    from distillery.efficiency.export import check_saved_model, load_model_for_export
    from distillery.shape import Dims

    if args.json:
        check_results_file(Path(args.json), "budget", _budget_rows)
    budget = Budget(speedup=args.speedup, latency_ms=args.latency_ms, batch=args.batch, seq_len=args.seq)
    check_saved_model(args.teacher)
    teacher = load_model_for_export(args.teacher)
    dims = Dims.of_config(teacher.config)
    if dims.arch != "bert":
        raise BudgetError(f"budget: {args.teacher} is a {dims.arch} model; the shape search builds bert students")
    forms = [f for f in args.forms.split(",") if f] if args.forms else list(available_forms())
    depths = [int(d) for d in args.depths.split(",")] if args.depths else None
    cands = candidates(dims, depths=depths, forms=forms)
    print(f"timing the teacher and {len(cands)} candidates ({budget.describe()}) ...", flush=True)
    timer = measured_timer(budget, **({"reps": args.reps} if args.reps else {}))
    teacher_ms, timed = time_candidates(teacher, cands, budget, timer=timer)
    keep = within_budget(timed, teacher_ms, budget)
    print(f"fp32 teacher: {teacher_ms:.2f} ms; {len(keep)} of {len(timed)} candidates meet the budget "
          f"(<= {budget.limit_ms(teacher_ms):.2f} ms in 9 of 10 rounds), largest first:")
    print("| candidate | layers | hidden | heads | FFN | form | median ms | speedup | speedup p10 |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for t in keep:
        c = t.candidate
        print(f"| {c.name} | {c.layers} | {c.hidden} | {c.heads} | {c.intermediate} | {c.form} | {t.ms:.2f} | "
              f"{t.speedup:.2f}x | {t.speedup_low:.2f}x |")
    if args.json:
        write_json(args.json, {"teacher_ms": teacher_ms, "budget": budget.describe(),
                               "candidates": {t.candidate.name: {"ms": t.ms, "speedup": t.speedup,
                                                                 "speedup_p10": t.speedup_low, "params": t.params,
                                                                 "shape": t.candidate.shape, "form": t.candidate.form,
                                                                 "meets_budget": t in keep} for t in timed}})
    return 0


def _export(args: argparse.Namespace) -> int:
    info = export_dir(args.model_dir, args.out_dir, opset=args.opset, int8=not args.no_int8)
    print(f"exported {args.model_dir} -> {args.out_dir} (max |onnx - torch| {info['onnx']['max_abs_diff']:.2e}); "
          f"files: {info['bytes_on_disk']}")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    sp = subparsers.add_parser("speed", help="latency/throughput of saved models (or .onnx files), interleaved")
    sp.add_argument("models", nargs="+", help="save_pretrained directories or .onnx files; the first is the reference")
    sp.add_argument("--batch", type=positive_int, default=1)
    sp.add_argument("--seq", type=positive_int, default=128)
    sp.add_argument("--reps", type=positive_int, default=20)
    sp.add_argument("--warmup", type=non_negative_int, default=3)
    sp.add_argument("--reference", default=None, help="model name (directory name) the speedups are relative to")
    sp.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    sp.add_argument("--threads", type=non_negative_int, default=0, help="CPU threads (default: torch's)")
    sp.add_argument("--json", default=None, help="also write the results to this JSON file")
    sp.set_defaults(func=_speed)

    bp = subparsers.add_parser("budget", help="student shapes and deployed forms that meet a latency budget here")
    bp.add_argument("teacher", help="the teacher's save_pretrained directory (a bert model)")
    bp.add_argument("--speedup", type=float, default=None, help="at least this many times faster than the teacher")
    bp.add_argument("--latency-ms", type=float, default=None, help="at most this many ms per batch")
    bp.add_argument("--batch", type=positive_int, default=1)
    bp.add_argument("--seq", type=positive_int, default=128)
    bp.add_argument("--depths", default=None, help="comma-separated depths (default 1 .. the teacher's)")
    bp.add_argument("--forms", default=None, help="comma-separated fp32,bf16,int8 (default: those this machine serves)")
    bp.add_argument("--reps", type=positive_int, default=None,
                    help="paired rounds with the teacher per timing session (default: the pipeline's search's)")
    bp.add_argument("--json", default=None, help="also write every candidate's timing to this JSON file")
    bp.set_defaults(func=_budget)

    ep = subparsers.add_parser("export", help="export a saved model to ONNX (dynamic axes) and int8")
    ep.add_argument("model_dir")
    ep.add_argument("out_dir")
    ep.add_argument("--opset", type=int, default=17)
    ep.add_argument("--no-int8", action="store_true", help="skip the int8 dynamic quantisation")
    ep.set_defaults(func=_export)
