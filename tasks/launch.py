"""One rank of a training stage on several processes: with `distributed.nproc_per_node: N` (N > 1) in params, the body
of a stage declared `distributed` runs under `torchrun --standalone --nproc_per_node N` (DistributedDataParallel
through the Trainer; `tasks.stage.launch`):

    the stage (flow task or `python -m flows.stage`): MLflow run, curve, stamp
        └─ python -m torch.distributed.run --standalone --nproc_per_node N -m tasks.launch MODULE:FUNCTION ...
              rank 0 .. N-1 run the same body; rank 0 writes the outputs and the result file, the others write nothing

The stage's MLflow run, training curve and stamp stay in the calling process, so they are written once. With N = 1
the body runs in the calling process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from tasks import env  # noqa: F401  (offline hygiene in the ranks too)
from tasks.stage import SkipStage

from distillery.errors import UserError


def main(argv: list[str] | None = None) -> int:
    """One rank: join the process group, seed as `tasks.stage.staged` does, run the body, rank 0 reports."""
    parser = argparse.ArgumentParser(prog="python -m tasks.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", help="MODULE:FUNCTION, a stage body (params, item) -> result")
    parser.add_argument("--params", required=True, help="the validated params as JSON")
    parser.add_argument("--result", required=True, help="where rank 0 writes the body's result (JSON)")
    parser.add_argument("--item", default=None)
    args = parser.parse_args(argv)

    from transformers import set_seed

    from distillery.config import parse_params
    from distillery.preflight import register_custom_tasks
    from distillery.io import write_json
    from distillery.training.distributed import is_main, start

    from tasks import paths

    p = register_custom_tasks(parse_params(json.loads(Path(args.params).read_text(encoding="utf-8")), args.params),
                              args.params, paths.ROOT)
    module, name = args.target.split(":")
    run = getattr(importlib.import_module(module), name)
    start(None if p.distributed.backend == "auto" else p.distributed.backend)
    set_seed(p.seed)
    from distillery import precision
    from distillery.training import compiled

    try:
        with precision.use(p.precision), compiled.use(p.compile):  # as in tasks.stage.staged
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
