"""GLUE: task registry, local and Hub loaders, metrics, encoding and server submission files."""

from distillery.glue.encode import encode
from distillery.glue.loaders import (
    HUB_ID,
    UNLABELED,
    GlueFileError,
    available_splits,
    load_hub,
    load_local,
    load_split_file,
    task_dir,
)
from distillery.glue.metrics import compute_metrics, main_score, trivial_baseline, trivial_predictions
from distillery.glue.stats import glue_stats, split_stats
from distillery.glue.submission import (
    GLUE_TEST_ROWS,
    check_submission,
    format_predictions,
    submission_filename,
    write_submission,
    zip_submission,
)
from distillery.glue.tasks import (
    GLUE_TASKS,
    TASKS,
    TaskSpec,
    UnknownTaskError,
    get_task,
    register_task,
    tasks_evaluated_with,
)

__all__ = [
    "GLUE_TASKS", "GLUE_TEST_ROWS", "HUB_ID", "TASKS", "UNLABELED", "GlueFileError", "TaskSpec", "UnknownTaskError",
    "available_splits", "check_submission", "compute_metrics", "encode", "format_predictions", "get_task",
    "glue_stats", "load_hub", "load_local", "load_split_file", "main_score", "register_task", "split_stats",
    "submission_filename", "task_dir", "tasks_evaluated_with", "trivial_baseline", "trivial_predictions",
    "write_submission", "zip_submission",
]
