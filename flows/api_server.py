"""When the Prefect API server goes away in the middle of a run (the ephemeral server the flow started died, or a
`prefect server` is restarted): one console line, not a dump per event.

The stages do not need the server: a task run's states travel as events, the stages' outputs, stamps and cache
records are local files, so every stage runs to its end. What needs the server is the flow's own bookkeeping: the
report's artifacts and the flow run's final state. Prefect's client retries those requests (PREFECT_CLIENT_MAX_RETRIES,
about a minute with the default 5), so a server that is back by then records them; one that is not leaves the run
finished on disk and not on the server. Without this module each later task event printed a multi-kilobyte
`EventsWorker failed to process item` record and a websocket warning, and the run ended in a 60-line
`httpx.ConnectError` traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import httpx

#: the loggers that report a lost server: the events client (websocket), the services (EventsWorker, log
#: shipping), and the flow and task run loggers (a failed state proposal)
LOGGERS = ("prefect.events.clients", "prefect._internal.concurrency", "prefect.flow_runs", "prefect.task_runs",
           *(SERVICES := ("EventsWorker", "APILogWorker")))

#: messages that mean the server is unreachable even without an exception attached (Prefect logs them so)
SIGNS = ("Unable to connect to 'ws://", "Unable to connect to 'wss://", "'EventsWorker' failed to process item",
         "'APILogWorker' failed to process item")


def unreachable(exc: BaseException | None) -> bool:
    """`exc`, or an exception it was raised from, is a failure to reach an HTTP server (connection refused or
    reset, a timeout, a dropped websocket)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (httpx.TransportError, ConnectionError)) or type(exc).__module__.startswith("websockets"):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def url() -> str:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or "the ephemeral server this run started"


class ServerGone(logging.Filter):
    """Lets through the first record that says the API server is unreachable, rewritten as one line, and drops every
    later one; other records pass unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.said and record.name in SERVICES:  # draining towards the lost server at exit ("Still processing")
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if not (unreachable(exc) or any(sign in record.getMessage() for sign in SIGNS)):
            return True
        with self._lock:
            first, self.said = not self.said, True
        if not first:
            return False
        record.msg, record.args = self.line(), ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True

    def say_once(self) -> None:
        """The one line, unless a record said it already."""
        with self._lock:
            first, self.said = not self.said, True
        if first:
            logging.getLogger("prefect").warning(self.line())

    @staticmethod
    def line() -> str:
        return (f"the Prefect API server ({url()}) is not answering: the stages go on and keep their outputs; "
                "the flow run's state may not reach the server")


GONE = ServerGone()

#: seconds the event and log services get, once a run that lost its server has finished, to deliver what they hold
#: (a server back by then records it); Prefect's own exit hook waits for every queued item to fail against the lost
#: server, which kept a finished run's process alive another 45 s on 2 cores (tests/test_api_server.py)
DRAIN_S = 10.0


def end(code: int) -> None:
    """End the command's process with `code`. When the server was lost during the run, the services get `DRAIN_S`
    and the process then ends without waiting for the rest (`os._exit`: every stage's outputs are on disk by now)."""
    if GONE.said:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        pending = set()
        for service in (EventsWorker, APILogWorker):
            pending |= service.drain_all(timeout=DRAIN_S / 2)[1]
        if pending:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


def install() -> None:
    """Collapse a lost server's log records to one line (idempotent). Also stops the standard library's
    `--- Error logging to API ---` dumps: `logging.raiseExceptions` off, as its documentation advises for production."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if GONE not in logger.filters:
            logger.addFilter(GONE)
    logging.raiseExceptions = False
