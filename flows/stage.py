"""Run one pipeline stage for one item, as `dvc repro` does:

    python -m flows.stage finetune_teacher --item sst2 [--params params.yaml]
    python -m flows.stage task_distillation --item tinybert4:sst2

DVC decides what to rerun (deps/params/outs in dvc.yaml), so this runs the stage body directly, without
a Prefect server: the same code and outputs as the Prefect task, with its own MLflow run.
"""

from __future__ import annotations

import argparse
import os
import sys

from tasks import env  # noqa: F401

from distillery.config import load_params
from distillery.errors import UserError, debug_requested, run_main


def main(argv: list[str] | None = None) -> int:
    from flows.stages import STAGES, items
    from tasks.execute import execute

    parser = argparse.ArgumentParser(prog="python -m flows.stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--item", default=None, help="task, student, or student:task")
    parser.add_argument("--params", default=os.environ.get("DISTILLERY_PARAMS", "params.yaml"))
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)

    def run() -> int:
        p = load_params(args.params, inputs=True, root=env.ROOT)
        valid = items(args.stage, p)
        if args.item not in valid:
            raise UserError(f"{args.stage}: item {args.item!r} is not one of {valid} under {args.params}")
        execute(STAGES[args.stage], p, args.item)
        if args.stage == "report" and p.finetune.stop_on_failed_gate:
            from tasks.teacher import failed_gates

            if failed := failed_gates(p):  # the run ends as the flow's does: one `error:` line per task, exit 2
                raise UserError("\n".join(failed))
        return 0

    return run_main(run, debug=args.debug or debug_requested([]))


if __name__ == "__main__":
    sys.exit(main())
