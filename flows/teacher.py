"""Register a teacher in the MLflow model registry, and tell the deployments that wait for one:

    python -m flows.teacher register MODEL_DIR --name NAME [--alias champion]

MODEL_DIR (a Hugging Face model directory) becomes a new version of the registered model NAME, and the alias moves to
it; a pipeline whose params say `teacher.name_or_path: models:/NAME@champion` distils from that version at its next
run. With a Prefect server (PREFECT_API_URL), the command then emits the event `distillery.teacher.registered` for
the resource `distillery.teacher.NAME`: a deployment served with `python -m flows.deploy --on-teacher NAME` starts a
run on it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tasks import env  # noqa: F401  (before prefect)

from distillery.errors import ArgumentParser, UserError, debug_requested, run_main
from tasks.execute import say

EVENT = "distillery.teacher.registered"


def resource(name: str) -> str:
    """The Prefect resource id of the registered teacher `name` (what a deployment trigger matches)."""
    return f"distillery.teacher.{name}"


def announce(name: str, version: int, alias: str) -> bool:
    """Emit the registration event to the Prefect server of PREFECT_API_URL; False when there is none."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return False
    emit_event(event=EVENT, resource={"prefect.resource.id": resource(name), "prefect.resource.name": name},
               payload={"version": version, "alias": alias})
    EventsWorker.drain_all()  # sent before this short process ends
    return True


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m flows.teacher", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("register", help="a model directory as a new version of a registered teacher")
    reg.add_argument("model_dir", type=Path)
    reg.add_argument("--name", required=True, help="the registered model's name")
    reg.add_argument("--alias", default="champion", help="the alias that moves to the new version")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)

    def go() -> int:
        from tasks.registered import register_teacher

        if not args.model_dir.is_dir():
            raise UserError(f"{args.model_dir}: no such model directory")
        version = register_teacher(args.model_dir, args.name, args.alias)
        told = announce(args.name, version, args.alias)
        say(f"registered teacher {args.name} version {version} (@{args.alias}): models:/{args.name}@{args.alias}"
            + (f"; event {EVENT} emitted" if told else "; no Prefect server (PREFECT_API_URL): no event emitted"))
        return 0

    return run_main(go, debug=args.debug or debug_requested([]))


if __name__ == "__main__":
    sys.exit(main())
