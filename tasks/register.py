"""Registration stage: log a task's distilled student with MLflow's transformers flavour and register it
as `<student>-<task>` with the alias `champion` (loadable with
`mlflow.pyfunc.load_model("models:/<student>-<task>@champion")`, which predicts labels for raw text)."""

from __future__ import annotations

from typing import Any

from tasks import paths
from tasks.stage import Stage, split_item

from distillery.config import Params
from distillery.io import write_json

ALIAS = "champion"


def pip_requirements() -> list[str]:
    import torch
    import transformers

    return [f"torch=={torch.__version__.split('+')[0]}", f"transformers=={transformers.__version__}"]


def run_register(p: Params, item: str) -> dict[str, Any]:
    import mlflow
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    student, task = split_item(item)
    model_dir = paths.student(student, task) / "model"
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    name = f"{student}-{task}"
    info = mlflow.transformers.log_model(
        {"model": model, "tokenizer": tokenizer}, name="model", task="text-classification",
        registered_model_name=name, pip_requirements=pip_requirements(),
    )
    version = info.registered_model_version
    mlflow.MlflowClient().set_registered_model_alias(name, ALIAS, version)
    record = {"name": name, "version": int(version), "alias": ALIAS, "uri": f"models:/{name}@{ALIAS}",
              "run_id": mlflow.active_run().info.run_id if mlflow.active_run() else None}
    write_json(paths.registry(student, task), record)
    return {"metrics": {"registered_version": int(version)}}


REGISTER = Stage(
    "register", run_register,
    deps=lambda p, item: [paths.student(*split_item(item)) / "model"],
    outs=lambda p, item: [paths.registry(*split_item(item))],
    params=lambda p, item: {},
    code=("tasks/register.py",),
)
