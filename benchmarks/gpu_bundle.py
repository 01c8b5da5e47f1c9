"""Take the `gpu` preset and `benchmarks.gpu` to an offline GPU machine: pack their inputs here, unpack them there.

Here:   python -m benchmarks.gpu_bundle pack [--params params/gpu.yaml] [--out .gpu] [--python-version 3.12]
There:  python3 -m benchmarks.gpu_bundle unpack [--bundle .gpu]
        python3 -m benchmarks.gpu
        DISTILLERY_TRACKING=off python3 -m flows.stage all --params params/gpu.yaml

The machine it is made for has Python, torch and transformers but no network and none of the data (the H100/H200 that
the device tool lends: its image lacks `MISSING_THERE`, and one call carries at most `LIMIT_MIB` with the project).

`pack` writes `<out>/inputs.tar.xz`: the params' local inputs outside the project (teacher, GLUE, SQuAD, corpus, word
vectors) under their paths from the project's parent directory, float32 safetensors stored as float16 (half the bytes;
`unpack` writes float32 again, laid out as the packed file, each weight rounded to float16's 11 significant bits: a
relative change of at most 2^-11, which the manifest records as measured). It downloads `<out>/wheels/`:
`MISSING_THERE` at the versions installed here, built for the other machine's Python. `manifest.json` gives each file's
sha256 as `unpack` writes it (and a packed safetensors file's original sha256). The bundle is built beside `<out>` and
replaces it only when complete: a failure (pip, the size refusal below) leaves the previous bundle as it was. It fails,
saying what takes the room, when the bundle and the project's tracked files do not fit `--limit-mib`.
`unpack` extracts the manifest's files (nothing else: no link, no path outside) into a temporary directory beside the
project, writes float32 again there, checks every file's sha256, and only then renames each into place under the
project's parent; a file already there is kept when its sha256 is the manifest's (or the original's), else replaced. A
killed unpack leaves the files it had not renamed as they were, and a re-run completes it. Then it installs the wheels
into the Python that runs it (pip, no index, no dependencies).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
INPUTS, WHEELS, MANIFEST = "inputs.tar.xz", "wheels", "manifest.json"
LIMIT_MIB = 64
#: The library's requirements (with theirs) that the lent GPU machine's image does not hold (the device tool's
#: KINDS.md, read 2026-11-17); torch, transformers, tokenizers, safetensors, numpy, pandas, pyarrow, scipy,
#: scikit-learn, accelerate, onnx and tqdm are there.
MISSING_THERE = ("datasets", "dill", "multiprocess", "pydantic", "pydantic-core", "annotated-types",
                 "typing-inspection", "nltk")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def local_inputs(params_file: str, root: Path = ROOT) -> list[Path]:
    """The local paths outside the project `root` that the params read (the teacher directory, the GLUE directory,
    the SQuAD file, the corpus files, the word vectors) and the BERT vocabulary `benchmarks.augment` tokenises with
    where it is there (without it that benchmark's generated vocabulary leaves few single-piece words to mask); each
    must lie beside the project (under its parent)."""
    from distillery.config import augment_sections
    from distillery.io import resolve_path
    from distillery.preflight import load_params
    from distillery.errors import UserError
    from distillery.task_kinds import is_span

    p = load_params(params_file, inputs=True, root=root)
    named = [p.teacher.name_or_path] if p.teacher.init == "pretrained" else []
    if p.data.source == "local":
        named += [p.data.glue_dir] if any(not is_span(t) for t in p.data.tasks) else []
        named += [p.data.squad_file] if "squad" in p.data.tasks else []
    named += list(p.corpus.paths) if p.corpus.source == "files" else []
    if any(a.enabled for a in augment_sections(p)) and p.word_vectors.source == "file":
        named.append(p.word_vectors.path)
    vocab = root.parent / "shared" / "data" / "vocab" / "bert-base-uncased-vocab.txt"  # benchmarks.augment's VOCAB
    named += [str(vocab)] if vocab.is_file() else []
    paths = [q for q in dict.fromkeys(resolve_path(n, root) for n in named if n) if not q.is_relative_to(root)]
    if far := [str(q) for q in paths if not q.is_relative_to(root.parent)]:
        raise UserError(f"{params_file}: {', '.join(far)} not beside the project ({root.parent}): the bundle keeps "
                        "paths relative to the project's parent")
    return paths


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def _header(path: Path) -> str:
    """A safetensors file's JSON header as it is on disk (padding included)."""
    with open(path, "rb") as f:
        return f.read(int.from_bytes(f.read(8), "little")).decode()


def halve(src: Path, dst: Path) -> dict[str, object]:
    """Write `src`'s safetensors with float32 tensors as float16; return what `restore` needs (the halved tensors,
    `src`'s header) and the largest relative change of a tensor (max |w - fp16(w)| / max |w|)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(src)
    halved = [k for k, v in tensors.items() if v.dtype == torch.float32]
    worst = 0.0
    for k in halved:
        v = tensors[k]
        h = v.half()
        if not torch.isfinite(h).all():
            raise ValueError(f"{src}: tensor {k} does not fit float16 (|w| up to {v.abs().max():.3g})")
        scale = v.abs().max().item()
        worst = max(worst, (v - h.float()).abs().max().item() / scale if scale else 0.0)
        tensors[k] = h.contiguous()
    save_file(tensors, dst)
    return {"float16": halved, "max_rel_change": worst, "header": _header(src)}


def restore(path: Path, halved: list[str], header: str) -> None:
    """Make the `halved` tensors of a packed safetensors file float32 again, in place (atomically), laid out as the file
    it was packed from (`header`, then each tensor's bytes at its offset): the same bytes on any safetensors version."""
    import torch
    from safetensors.torch import load_file

    from distillery.io import atomic_path

    tensors = load_file(path)
    order = sorted((v["data_offsets"][0], k) for k, v in json.loads(header).items() if k != "__metadata__")
    raw = header.encode()
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for _, k in order:
            t = tensors[k].float() if k in halved else tensors[k]
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def download_wheels(dest: Path, python_version: str) -> list[str]:
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in MISSING_THERE]
    platforms = [a for plat in PLATFORMS for a in ("--platform", plat)]
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                          "--python-version", python_version, "--implementation", "cp", *platforms, "-d", str(dest),
                          *pins], capture_output=True, text=True)
    if got.returncode:
        from distillery.errors import UserError

        errors = [line for line in got.stderr.splitlines() if line.startswith("ERROR")] or got.stderr.splitlines()[-1:]
        raise UserError(f"pip download of {' '.join(pins)} for Python {python_version} failed: {' '.join(errors)}")
    return pins


def tracked_bytes(root: Path) -> int:
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def pack(params_file: str, out: Path, python_version: str = "3.12", limit_mib: float = LIMIT_MIB, *,
         wheels: bool = True, root: Path = ROOT) -> dict:
    from distillery.errors import OutputExistsError, UserError
    from distillery.io import atomic_dir, write_json

    if out.is_dir() and (other := sorted(q.name for q in out.iterdir() if q.name not in (INPUTS, WHEELS, MANIFEST))):
        raise OutputExistsError(f"{out}: holds {', '.join(other)}, not a bundle; it is left as it is")
    files: dict[str, dict] = {}
    with atomic_dir(out) as staged, tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(staged / INPUTS, "w:xz", preset=6) as tar:
            for top in local_inputs(params_file, root):
                for f in sorted([top] if top.is_file() else (q for q in top.rglob("*") if q.is_file())):
                    name = f.relative_to(root.parent).as_posix()
                    src = f
                    files[name] = {"sha256": sha256(f)}
                    if f.suffix == ".safetensors":  # its sha256 as unpack writes it: restored here
                        src, restored = Path(tmp) / "halved", Path(tmp) / "restored"
                        files[name] = {**halve(f, src), "original_sha256": files[name]["sha256"]}
                        restore(shutil.copy(src, restored), files[name]["float16"], files[name]["header"])
                        files[name]["sha256"] = sha256(restored)
                    tar.add(src, arcname=name)
        pins = download_wheels(staged / WHEELS, python_version) if wheels else []
        manifest = {"params": params_file, "python": python_version, "wheels": pins, "files": files}
        write_json(staged / MANIFEST, manifest)
        sizes = {"inputs": (staged / INPUTS).stat().st_size,
                 "wheels": sum(w.stat().st_size for w in staged.glob(f"{WHEELS}/*.whl")), "project": tracked_bytes(root)}
        total = sum(sizes.values())
        line = ", ".join(f"{k} {mib(v)}" for k, v in sizes.items())
        if total > limit_mib * 2**20:
            raise UserError(f"{out}: {line}: {mib(total)} is over the {limit_mib:g} MiB one call carries")
    worst = max((f.get("max_rel_change", 0.0) for f in files.values()), default=0.0)
    print(f"bundle {out}: {len(files)} files, {line}: {mib(total)} of {limit_mib:g} "
          f"(float16 weights: largest relative change {worst:.1e})")
    return manifest


def read_manifest(bundle: Path, root: Path = ROOT) -> dict[str, dict]:
    """The manifest's files, each a path under the project's parent (not in the project) with its sha256."""
    from distillery.errors import UserError

    path = bundle / MANIFEST
    if not path.is_file():
        raise UserError(f"{path}: missing (make the bundle with `python -m benchmarks.gpu_bundle pack`)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("sha256"), str)
            and (not e.get("float16") or isinstance(e["float16"], list) and isinstance(e.get("header"), str))
            for e in files.values()):
        raise UserError(f"{path}: not a bundle's manifest (an object whose 'files' give each file's sha256): "
                        "make the bundle again with `python -m benchmarks.gpu_bundle pack`")
    for name in files:
        q = PurePosixPath(name)
        if q.is_absolute() or ".." in q.parts or q.as_posix() != name or q.parts[0] == root.name:
            raise UserError(f"{path}: file {name!r} is not a path under the project's parent, outside the project")
    return files


def extract(archive: Path, files: dict[str, dict], names: list[str], dest: Path) -> None:
    """Extract the members `names` of `archive` into `dest`, refusing an archive that holds anything but the manifest's
    `files` (a link, a directory, another path) or lacks one of them."""
    from distillery.errors import UserError

    if not archive.is_file():
        raise UserError(f"{archive}: missing (make the bundle again with `python -m benchmarks.gpu_bundle pack`)")
    try:
        with tarfile.open(archive, "r:xz") as tar:
            members = tar.getmembers()
            for m in members:
                if m.issym() or m.islnk() or not m.isreg() or m.name not in files:
                    what = "a link" if m.issym() or m.islnk() else "not a file" if not m.isreg() else "not in the manifest"
                    raise UserError(f"{archive}: member {m.name!r} is {what}; nothing was written")
            if missing := sorted(set(files) - {m.name for m in members}):
                raise UserError(f"{archive}: lacks {missing[0]} (of the manifest's files); nothing was written")
            tar.extractall(dest, members=[m for m in members if m.name in names], filter="data")
    except (tarfile.TarError, EOFError, lzma.LZMAError, OSError) as e:
        raise UserError(f"{archive}: not a complete .tar.xz ({type(e).__name__}: {e}): make the bundle again") from None


def unpack(bundle: Path, install: bool = True, root: Path = ROOT) -> None:
    from distillery.errors import UserError

    files = read_manifest(bundle, root)
    dest = root.parent
    if clash := [n for n in files if (dest / n).exists() and not (dest / n).is_file()]:
        raise UserError(f"{dest / clash[0]}: not a file, where the bundle has one; nothing was written")
    todo = [n for n, e in files.items()
            if not ((dest / n).is_file() and sha256(dest / n) in (e["sha256"], e.get("original_sha256")))]
    if todo:  # staged beside the destination, checked, then renamed: a kill leaves whole files or none
        with tempfile.TemporaryDirectory(prefix=".gpu_bundle.", dir=dest) as tmp:
            extract(bundle / INPUTS, files, todo, Path(tmp))
            for n in todo:
                if halved := files[n].get("float16"):
                    restore(Path(tmp) / n, halved, files[n]["header"])
                if sha256(Path(tmp) / n) != files[n]["sha256"]:
                    raise UserError(f"{bundle / INPUTS}: {n} does not match the manifest's sha256; nothing was written")
            for n in todo:
                (dest / n).parent.mkdir(parents=True, exist_ok=True)
                os.replace(Path(tmp) / n, dest / n)
    wheels = sorted(str(w) for w in (bundle / WHEELS).glob("*.whl"))
    if install and wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--disable-pip-version-check", *wheels], check=True)
        modules = ", ".join(name.replace("-", "_") for name in MISSING_THERE)  # each wheel's module is its name
        check = subprocess.run([sys.executable, "-c", f"import {modules}, distillery.config"], cwd=root,
                               capture_output=True, text=True)
        if check.returncode:  # a wheel that needs a newer package than the machine has (e.g. datasets and pyarrow)
            raise UserError(f"{bundle}: the installed wheels do not import here: {check.stderr.strip().splitlines()[-1]}")
    kept = len(files) - len(todo)
    print(f"unpacked {bundle}: {len(todo)} files under {dest}" + (f" ({kept} already there)" if kept else "")
          + f", {len(wheels) if install else 0} wheels installed into {sys.prefix}")


def main(argv: list[str] | None = None) -> int:
    from distillery.errors import run_main

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_bundle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("pack", help="here: the inputs and wheels into a folder that fits one call")
    a.add_argument("--params", default="params/gpu.yaml")
    a.add_argument("--out", type=Path, default=ROOT / ".gpu")
    a.add_argument("--python-version", default="3.12", help="the other machine's Python (its wheels)")
    a.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    b = sub.add_parser("unpack", help="there: install the wheels, put the inputs where the params expect them")
    b.add_argument("--bundle", type=Path, default=ROOT / ".gpu")
    b.add_argument("--no-install", action="store_true", help="only the inputs")
    args = p.parse_args(argv)

    def run() -> int:
        if args.command == "pack":
            pack(args.params, args.out, args.python_version, args.limit_mib)
        else:
            unpack(args.bundle, install=not args.no_install, root=ROOT)
        return 0

    return run_main(run)


if __name__ == "__main__":
    sys.exit(main())
