"""Serve the pipeline on a schedule (one long-lived process; works offline):

    python -m flows.deploy --cron "0 3 * * *" [--params params.yaml | --preset local]

Each scheduled run executes `flows.pipeline.pipeline` with the chosen params file; unchanged stages hit the
Prefect cache, so a nightly run only recomputes what new data, code or params changed. `flow.serve` needs no work
pool and no worker; for a Prefect server with work pools and workers (other machines, GPUs, containers), deploy
from prefect.yaml instead: see the README ("Scale out").
"""

from __future__ import annotations

import argparse
import sys

from tasks import env

from distillery.config import load_params
from distillery.errors import ArgumentParser, debug_requested, run_main
from flows.pipeline import add_params_options, params_path, pipeline


def cron_expression(text: str) -> str:
    """An argparse `type`: a cron expression Prefect's `CronSchedule` accepts (its own validator, the one `serve`
    applies), so a bad one is refused before the params are read or anything is served."""
    import pydantic
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=text)
    except pydantic.ValidationError as exc:
        why = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid cron expression ({why}); e.g. \"0 3 * * *\" "
                                         "(03:00 every day)") from None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m flows.deploy", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="nightly")
    parser.add_argument("--cron", type=cron_expression, default="0 3 * * *",
                        help="cron schedule (default: 03:00 every day)")
    add_params_options(parser)
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)

    def go() -> int:
        path = params_path(args.params, args.preset)
        load_params(path, inputs=True, root=env.ROOT)
        pipeline.serve(name=args.name, cron=args.cron, parameters={"params_file": path})
        return 0

    return run_main(go, debug=args.debug or debug_requested([]))


if __name__ == "__main__":
    sys.exit(main())
