"""Offline hygiene, applied before Prefect, MLflow, DVC or transformers are imported.

No telemetry; PREFECT_HOME inside the project; an ephemeral Prefect server start-up timeout that survives
a cold machine; Hugging Face offline when the Hub cannot be reached; MLflow's tracking URI an absolute
SQLite path in the project (overridable with MLFLOW_TRACKING_URI).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _hub_reachable(timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def apply() -> None:
    defaults = {
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_HOME": str(ROOT / ".prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_TRACKING_URI": f"sqlite:///{ROOT / 'mlflow.db'}",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        # a quiet console: no load-report tables (a fresh classifier head is expected), no per-map dataset
        # bars, no MLflow INFO lines; errors and the training progress bar stay
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' weight loading/saving bars (not the Trainer's)
        "MLFLOW_LOGGING_LEVEL": "WARNING",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "HF_HUB_OFFLINE" not in os.environ and not _hub_reachable():
        for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
            os.environ.setdefault(key, "1")


apply()
