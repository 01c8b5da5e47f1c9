"""Offline hygiene, applied before Prefect, MLflow, DVC or transformers are imported.

No telemetry; PREFECT_HOME inside the project; an ephemeral Prefect server start-up timeout that survives
a cold machine; Hugging Face offline unless the user sets HF_HUB_OFFLINE=0 (nothing is probed: importing this
opens no connection; models and datasets come from local directories or the Hugging Face cache, and a params
check names what is missing); MLflow's tracking URI an absolute SQLite path in the project (overridable with
MLFLOW_TRACKING_URI).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: Warnings a user cannot act on, filtered from the console (messages are regular expressions matched at the start):
#: MobileBERT's MLM head has a zero-width dense part when the embedding is as wide as the hidden state (by design).
QUIET_WARNINGS = (
    r"Initializing zero-element tensors is a no-op",
    # MLflow's advice while it loads the registered pyfunc (whose signature is logged explicitly), seen once in a
    # dask worker; the message starts with a colour code
    r"(\x1b\[[0-9;]*m)?Any type hint is inferred",
)


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
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # the register stage downloads the run's model
        "DASK_LOGGING__DISTRIBUTED": "warning",  # orchestration.runner dask: no scheduler/worker INFO lines
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if "HF_HUB_OFFLINE" not in os.environ:  # HF_HUB_OFFLINE=0 lets the Hub client download
        for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
            os.environ.setdefault(key, "1")
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


apply()
