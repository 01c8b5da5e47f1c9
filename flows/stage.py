"""Run one pipeline stage for one item, as `dvc repro` does:

    python -m flows.stage finetune_teacher --item sst2 [--params params.yaml]
    python -m flows.stage task_distillation --item tinybert4:sst2

DVC decides what to rerun (deps/params/outs in dvc.yaml), so this runs the stage body directly, without
a Prefect server: the same code and outputs as the Prefect task, with its own MLflow run.

    python -m flows.stage all [--params params/gpu.yaml]

runs every stage of the params, one after another in the flow's order (fresh ones are cached), without Prefect: for
a machine that has the library but not the `pipeline` extra. With `DISTILLERY_TRACKING=off` (tasks.tracking) it
needs no MLflow either and leaves the register stage out.

    python -m flows.stage evaluate --item sst2 --upstream

runs that stage after every stage it needs (fresh ones cached), in the same order: one task or student without DVC.
"""

from __future__ import annotations

import argparse
import os
import sys

from tasks import env  # noqa: F401

from distillery.preflight import load_params
from distillery.errors import UserError, debug_requested, report


def main(argv: list[str] | None = None) -> int:
    from flows.stages import STAGES, items, needed, nodes
    from tasks import changes, tracking
    from tasks.execute import execute, label, say
    from tasks.lock import project_lock

    parser = argparse.ArgumentParser(prog="python -m flows.stage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["all", *sorted(STAGES)], help="a stage, or all of them in order")
    parser.add_argument("--item", default=None, help="task, student, or student:task")
    parser.add_argument("--params", default=os.environ.get("DISTILLERY_PARAMS", "params.yaml"))
    parser.add_argument("--upstream", action="store_true",
                        help="first run every stage this one needs (fresh ones cached), as `dvc repro STAGE` does")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    parser.add_argument("--no-wait", action="store_true",
                        help="stop with one line when another run holds the project, instead of waiting for it")
    args = parser.parse_args(argv)

    try:  # a user error is its `error:` line(s) and exit code 2 (its traceback with --debug)
        p = load_params(args.params, inputs=True, root=env.ROOT)
        with project_lock(wait=not args.no_wait):  # one run at a time per project (tasks.lock)
            if args.stage == "all":
                if args.item is not None:
                    raise UserError("all: --item names one stage's item; `all` runs every item")
                from distillery.precision import describe

                say(describe(p.precision))
                statuses = {}
                for name, item in nodes(p):
                    if name == "register" and not tracking.enabled():
                        say(f"register[{item}]: left out ({tracking.SWITCH}=off)")
                        continue
                    statuses[label(STAGES[name], item)] = changes.status(execute(STAGES[name], p, item))
                order = [(STAGES[name], item) for name, item in nodes(p)]
                say(changes.console_line(changes.record(p, statuses, order)))
                from tasks.evaluate import verdict_lines

                for line in verdict_lines(p):
                    say(line)
            else:
                valid = items(args.stage, p)
                if args.item not in valid:
                    raise UserError(f"{args.stage}: item {args.item!r} is not one of {valid} under {args.params}")
                if args.stage == "register":  # refused before the stage starts: no `.started` stamp left behind
                    tracking.require("the register stage")
                for name, item in needed(p, (args.stage, args.item)) if args.upstream else [(args.stage, args.item)]:
                    execute(STAGES[name], p, item)
            if args.stage in ("all", "report") and p.teacher_finetune.stop_on_failed_gate:
                from tasks.teacher import failed_gates

                if failed := failed_gates(p):  # the run ends as the flow's does: one `error:` line per task, exit 2
                    raise UserError("\n".join(failed))
            return 0
    except UserError as exc:
        if args.debug or debug_requested([]):
            raise
        return report(exc)


if __name__ == "__main__":
    sys.exit(main())
