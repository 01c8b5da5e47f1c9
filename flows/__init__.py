"""Prefect flows composing the pipeline stages (`tasks/`)."""

from tasks import env as _env  # noqa: F401  (offline/telemetry settings before Prefect is imported)
