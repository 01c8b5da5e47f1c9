"""Pipeline stages: read params, call the library, write outputs atomically, log to MLflow, return paths.

Importing this package applies the offline/telemetry environment (tasks.env) before anything else.
"""

from tasks import env as _env  # noqa: F401  (must come first)

from distillery.io import REFERENCE_RESOLVERS  # noqa: E402
from tasks.registered import SCHEME, resolve_registered  # noqa: E402

REFERENCE_RESOLVERS[SCHEME] = resolve_registered  # teacher.name_or_path: models:/<name>@<alias> (the MLflow registry)
