"""Serve the pipeline on a schedule (one long-lived process beside a Prefect server; works offline):

    prefect server start                                   # the scheduler: creates the runs on time
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m flows.deploy --cron "0 3 * * *" [--params params.yaml | --preset local]   # keep it running

    python -m flows.deploy --on-teacher NAME [--cron ...]  # a run whenever a new version of the teacher NAME is
                                                           # registered (python -m flows.teacher register)

Each scheduled run executes `flows.pipeline.pipeline` with the chosen params file; unchanged stages hit the
Prefect cache, so a nightly run only recomputes what new data, code or params changed. `flow.serve` needs no work
pool and no worker, but it needs a Prefect server: without PREFECT_API_URL Prefect would serve on an ephemeral
server, which runs no scheduler (the cron would never fire), so this command refuses. For work pools and workers
(other machines, GPUs, containers), deploy from prefect.yaml instead: see docs/operations.md ("Scale out").
"""

from __future__ import annotations

import argparse
import sys

from tasks import env

from distillery.preflight import load_params
from distillery.errors import ArgumentParser, UserError, debug_requested, run_main
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


def scheduling_server() -> str:
    """The API URL of the Prefect server whose scheduler will create the runs; a UserError when there is none.

    With no PREFECT_API_URL, `serve` runs on Prefect's ephemeral server, which starts none of the server's
    scheduling services: Prefect only logs a warning and the process would wait forever for runs nobody creates."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    start = "start one with `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api"
    url = PREFECT_API_URL.value()
    if not url:
        raise UserError("python -m flows.deploy: PREFECT_API_URL is not set: a schedule needs a running Prefect "
                        f"server (the ephemeral one Prefect starts without it has no scheduler); {start}")
    with get_client(sync_client=True) as client:
        failure = client.api_healthcheck()
    if failure is not None:
        why = " ".join(f"{type(failure).__name__}: {failure}".split())  # one line (an HTTP error has several)
        raise UserError(f"python -m flows.deploy: no Prefect server answers at PREFECT_API_URL={url} ({why}); "
                        f"{start}, or point PREFECT_API_URL at yours")
    return url


def teacher_trigger(name: str, params_file: str):
    """A deployment trigger: one run (with the same params) per `distillery.teacher.registered` event of `name`."""
    from prefect.events import DeploymentEventTrigger

    from flows.teacher import EVENT, resource

    return DeploymentEventTrigger(name=f"new teacher {name}", expect={EVENT},
                                  match={"prefect.resource.id": resource(name)},
                                  parameters={"params_file": params_file})


def pause(deployment: str) -> None:
    """Pause the served deployment once this process stops (Ctrl-C, SIGTERM): its runs would otherwise pile up as
    late runs that a later `serve` starts all at once. `serve` pauses it too, but not reliably on SIGTERM (measured:
    a SIGTERM soon after a run left it active); serving it again resumes it. Best effort: the server may be gone."""
    from prefect import get_client

    try:
        with get_client(sync_client=True) as client:
            client.pause_deployment(client.read_deployment_by_name(deployment).id)
    except Exception:  # noqa: BLE001 - nothing to pause, or no server to tell
        pass


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m flows.deploy", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="nightly")
    parser.add_argument("--cron", type=cron_expression, default=None,
                        help="cron schedule (default: 03:00 every day, none with --on-teacher alone)")
    parser.add_argument("--on-teacher", metavar="NAME", default=None,
                        help="also run when a new version of the registered teacher NAME is registered "
                             "(python -m flows.teacher register ... --name NAME)")
    add_params_options(parser)
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)

    def go() -> int:
        path = params_path(args.params, args.preset)
        load_params(path, inputs=True, root=env.ROOT)
        scheduling_server()
        cron = args.cron or (None if args.on_teacher else "0 3 * * *")
        try:
            pipeline.serve(name=args.name, cron=cron, parameters={"params_file": path},
                           triggers=[teacher_trigger(args.on_teacher, path)] if args.on_teacher else None)
        finally:
            pause(f"{pipeline.name}/{args.name}")
        return 0

    return run_main(go, debug=args.debug or debug_requested([]))


if __name__ == "__main__":
    sys.exit(main())
