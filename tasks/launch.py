"""Training stages on several processes: with `distributed.nproc_per_node: N` (N > 1) in params, a training stage's
body runs under `torchrun --standalone --nproc_per_node N` (DistributedDataParallel through the Trainer):

    the stage (flow task or `python -m flows.stage`): MLflow run, curve, stamp
        └─ python -m torch.distributed.run --standalone --nproc_per_node N -m tasks.launch MODULE:FUNCTION ...
              rank 0 .. N-1 run the same body; rank 0 writes the outputs and the result file, the others write nothing

The stage's MLflow run, training curve and stamp stay in the calling process, so they are written once. With N = 1
the body runs in the calling process, as without this module.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from tasks import env  # noqa: F401  (offline hygiene in the ranks too)
from tasks.env import ROOT
from tasks.stage import SkipStage

from distillery.config import Params
from distillery.errors import UserError

RunFn = Callable[[Params, "str | None"], dict[str, Any]]


def distributed(run: RunFn) -> RunFn:
    """A stage body that runs on `distributed.nproc_per_node` processes (in place when 1, or inside a rank)."""

    @functools.wraps(run)
    def launch_or_run(p: Params, item: str | None) -> dict[str, Any]:
        from distillery.training.distributed import launched

        if p.distributed.nproc_per_node <= 1 or launched():
            return run(p, item)
        return launch(f"{run.__module__}:{run.__name__}", p, item)

    return launch_or_run


def distributed_params(p: Params) -> dict[str, Any]:
    """The `distributed` section as a stage param when it changes the run (N > 1: other reduction order and dropout
    masks), so that a one-process run's cache key, stamp and dvc.yaml stay what they were."""
    return {"distributed": p.distributed.model_dump(mode="json")} if p.distributed.nproc_per_node > 1 else {}


def launch(target: str, p: Params, item: str | None) -> dict[str, Any]:
    """Run `target` (MODULE:FUNCTION, a stage body) on N processes; return rank 0's result."""
    n = p.distributed.nproc_per_node
    with tempfile.TemporaryDirectory(prefix="distillery-launch-") as tmp:
        params_file, result_file = Path(tmp) / "params.json", Path(tmp) / "result.json"
        params_file.write_text(p.model_dump_json(), encoding="utf-8")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
               "-m", "tasks.launch", target, "--params", str(params_file), "--result", str(result_file)]
        if item is not None:
            cmd += ["--item", item]
        returncode = subprocess.run(cmd, cwd=ROOT).returncode
        result = json.loads(result_file.read_text(encoding="utf-8")) if result_file.is_file() else {}
    if "skipped" in result:  # the body found nothing to do (tasks.stage.SkipStage), in every rank alike
        raise SkipStage(result["message"], result["skipped"])
    if "error" in result:
        raise UserError(result["error"])
    if returncode != 0 or "result" not in result:
        raise RuntimeError(f"{target} on {n} processes (torchrun) exited with status {returncode}; the ranks' "
                           "output is above")
    return result["result"]


def main(argv: list[str] | None = None) -> int:
    """One rank: join the process group, seed as `tasks.stage.run_stage` does, run the body, rank 0 reports."""
    parser = argparse.ArgumentParser(prog="python -m tasks.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="MODULE:FUNCTION, a stage body (params, item) -> result")
    parser.add_argument("--params", required=True, help="the validated params as JSON")
    parser.add_argument("--result", required=True, help="where rank 0 writes the body's result (JSON)")
    parser.add_argument("--item", default=None)
    args = parser.parse_args(argv)

    from transformers import set_seed

    from distillery.config import parse_params
    from distillery.io import write_json
    from distillery.training.distributed import is_main, start

    from tasks import paths

    p = parse_params(json.loads(Path(args.params).read_text(encoding="utf-8")), args.params, paths.ROOT)
    module, name = args.target.split(":")
    run = getattr(importlib.import_module(module), name)
    start(None if p.distributed.backend == "auto" else p.distributed.backend)
    set_seed(p.seed)
    from distillery import precision

    try:
        with precision.use(p.precision):  # as in tasks.stage.run_stage
            result = run(p, args.item)
    except SkipStage as exc:
        if is_main():
            write_json(args.result, {"skipped": exc.reason, "message": str(exc)})
        return 0
    except UserError as exc:
        if is_main():
            write_json(args.result, {"error": str(exc)})
        return 1
    if is_main():
        write_json(args.result, {"result": json.loads(json.dumps(result, default=str))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
