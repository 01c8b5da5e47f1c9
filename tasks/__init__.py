"""Pipeline stages: read params, call the library, write outputs atomically, log to MLflow, return paths.

Importing this package applies the offline/telemetry environment (tasks.env) before anything else.
"""

from tasks import env as _env  # noqa: F401  (must come first)
