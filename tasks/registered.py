"""A teacher from the MLflow model registry: `teacher.name_or_path: models:/<name>@<alias>` (or `models:/<name>/<version>`).

The reference resolves, once per process, to the exact version the alias points at, and that version's files to
`models/registered/<name>/v<version>/` (downloaded once). Every stage then reads a local directory whose content hash
is part of its key: when the alias moves to a new version, the stages that read the teacher run again, and the change
report lists the new directory. `register_teacher` logs a model directory as a new version and moves the alias to it
(`python -m flows.teacher register`, which also emits the event a deployment trigger waits for).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from tasks import paths

from distillery.errors import UserError

SCHEME = "models:/"
_REF = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def parse(ref: str) -> tuple[str, str | None, str | None]:
    """(name, alias, version) of a `models:/` reference; a UserError for any other form."""
    m = _REF.match(ref)
    if m is None:
        raise UserError(f"teacher.name_or_path: {ref!r} is not a registered model reference: give "
                        "models:/<name>@<alias> or models:/<name>/<version>")
    return m["name"], m["alias"], m["version"]


@lru_cache(maxsize=None)
def resolve_registered(ref: str) -> Path:
    """The local directory of the model version `ref` names (the alias read once per process: one run, one version)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    name, alias, version = parse(ref)
    client = mlflow.MlflowClient()
    try:
        mv = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException as exc:
        raise UserError(f"teacher.name_or_path: {ref}: no such registered model version in "
                        f"{mlflow.get_tracking_uri()} ({exc.message.splitlines()[0]})") from None
    target = paths.MODELS / "registered" / name / f"v{mv.version}"
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # then moved: whole or not there
            local = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{mv.version}", dst_path=tmp))
            found = sorted((c.parent for c in local.rglob("config.json")), key=lambda d: len(d.parts))
            if not found:
                raise UserError(f"teacher.name_or_path: {ref} (version {mv.version}) holds no model directory "
                                "(no config.json in its files)")
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(found[0]), target)
    return target


def register_teacher(model_dir: Path, name: str, alias: str = "champion") -> int:
    """Log `model_dir` (a Hugging Face model directory) as a new version of the registered model `name` and point
    `alias` at it; returns the version."""
    import mlflow
    from mlflow.exceptions import MlflowException

    if not (Path(model_dir) / "config.json").is_file():
        raise UserError(f"{model_dir}: not a model directory (no config.json)")
    client = mlflow.MlflowClient()
    with mlflow.start_run(run_name=f"register-teacher-{name}") as run:
        mlflow.log_artifacts(str(model_dir), artifact_path="model")
        source = mlflow.get_artifact_uri("model")
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="a teacher of the distillation pipeline")
    version = client.create_model_version(name, source, run_id=run.info.run_id)  # the files as they are: no MLmodel
    client.set_registered_model_alias(name, alias, version.version)
    return int(version.version)
