"""Beyond one machine, on 127.0.0.1 with real servers (no network):

- a Prefect server, a process work pool and the `nightly` deployment from prefect.yaml (`prefect deploy`); a
  flow run triggered through the API is picked up by `prefect worker start --run-once` and runs every stage;
- an `mlflow server` (SQLite backend, proxied artifact store) that the flow logs to through MLFLOW_TRACKING_URI;
  the champion loads through it with `mlflow.pyfunc`; the pipeline run carries its git commit;
- a local-directory DVC remote: the outputs are committed, pushed, deleted and pulled back; `dvc repro` then runs
  no stage, and a second deployment run is all cache hits (Prefect's `Cached` state for every task run), its
  MLflow run tagged with the hash of the `dvc.lock` it started from;
- schedules that fire: the server's scheduler creates a flow run every minute for `python -m flows.deploy --cron
  "* * * * *"` (flow.serve, the process running beside the server) and for the `nightly` deployment deployed with
  `--cron "* * * * *"` and a long-running `prefect worker start`; each run starts on time and completes;
- continual distillation on the worker, over a task of your own (CSV files in the project): a run over unchanged
  inputs says so; appended training rows re-run that task's stages only; a challenger that does not beat the champion
  by the margin on a changed dev split leaves the champion's alias, the reason tagged (the last test: it changes the
  project).

One module-scoped stack (servers, project copy, first run) serves the tests; every server dies with the module.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from helpers import ONE_STUDENT, Server, clean_env, compiled_packages, free_port, prefect_database, reviews

from tasks import provenance
from tasks.stage import fingerprint

ROOT = Path(__file__).resolve().parents[1]
POOL, DEPLOYMENT = "distillery-process", "distillery-pipeline/nightly"
PREFECT = [sys.executable, "-m", "prefect"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


class Stack:
    def __init__(self, tmp: Path, request: pytest.FixtureRequest):
        self.tmp, self.project = tmp, tmp / "project"
        self.make_project()
        prefect_port, mlflow_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{prefect_port}/api"
        self.mlflow_uri = f"http://127.0.0.1:{mlflow_port}"
        self.artifacts = tmp / "mlflow-artifacts"
        home = tmp / "prefect-home"
        home.mkdir()
        shutil.copyfile(prefect_database(), home / "prefect.db")  # migrated once per machine, not at server start
        # the server's scheduler at its defaults (on; a new or changed deployment's runs are created within 5 s, by
        # its recent-deployments loop): the tests of schedules below see what a user gets
        self.prefect = Server(
            [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            f"{self.api}/health", clean_env(PREFECT_HOME=str(home)), tmp / "prefect-server.log", tmp)
        request.addfinalizer(self.prefect.stop)
        self.mlflow = Server(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
             "--artifacts-destination", str(self.artifacts)],
            f"{self.mlflow_uri}/health", clean_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),  # as docker/compose.yaml
            tmp / "mlflow-server.log", tmp)
        request.addfinalizer(self.mlflow.stop)
        self.env = clean_env(PREFECT_HOME=str(home), PREFECT_API_URL=self.api, MLFLOW_TRACKING_URI=self.mlflow_uri,
                             PYTHONPATH=str(self.project))
        run([*PREFECT, "work-pool", "create", POOL, "--type", "process"], tmp, self.env)
        run([*PREFECT, "--no-prompt", "deploy", "--name", "nightly"], self.project, self.env)
        self.deployment = self.get(f"/deployments/name/{DEPLOYMENT}")
        self.first = self.run_deployment()

    def make_project(self) -> None:
        shutil.copytree(compiled_packages(), self.project)
        shutil.copy(ROOT / "prefect.yaml", self.project)
        # one student, no direct baselines, no ONNX export, a teacher that only has to be no worse than trivial:
        # every kind of stage still runs for real (data, MLM pre-training, fine-tuning, augmentation, both
        # distillations, evaluation, registry, report), on a task of your own: the demo task as CSV files in the
        # project (string labels), which the last test changes
        custom = {**reviews(self.project / "reviews"), "train": "reviews/train.csv", "validation": "reviews/dev.csv"}
        params = {**ONE_STUDENT, "data": {**ONE_STUDENT["data"], "tasks": ["reviews"], "custom": {"reviews": custom}}}
        (self.project / "params.yaml").write_text(yaml.safe_dump(params))
        (self.project / ".gitignore").write_text("__pycache__/\n")
        env = clean_env(PYTHONPATH=str(self.project))
        run([sys.executable, "-m", "flows.dvc"], self.project, env)
        git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
        run(["git", "init", "-q"], self.project, env)
        run([sys.executable, "-m", "dvc", "init", "-q"], self.project, env)
        run(["git", "add", "."], self.project, env)
        run([*git, "commit", "-q", "-m", "pipeline"], self.project, env)

    # ------------------------------------------------------------------ Prefect REST API
    def call(self, req: urllib.request.Request | str):
        """One API call. The server answers 503 for the errors it deems retryable (a busy database, for one; a CI run
        got one on create_flow_run); Prefect's own client retries those with backoff, and so does this one."""
        for attempt in range(6):
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    body = r.read()
                return json.loads(body) if body else None
            except urllib.error.HTTPError as e:
                if e.code != 503 or attempt == 5:
                    raise
                time.sleep(2 ** attempt)

    def get(self, path: str):
        return self.call(self.api + path)

    def post(self, path: str, body: dict):
        return self.call(urllib.request.Request(self.api + path, data=json.dumps(body).encode(),
                                                headers={"Content-Type": "application/json"}))

    def delete(self, path: str) -> None:
        self.call(urllib.request.Request(self.api + path, method="DELETE"))

    def scheduled_runs(self, deployment_id: str) -> list[dict]:
        """The deployment's flow runs that its schedules created, the earliest expected first."""
        runs = self.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment_id]}},
                                               "sort": "EXPECTED_START_TIME_ASC", "limit": 200})
        return [r for r in runs if r["auto_scheduled"]]

    def drop_due_scheduled_runs(self) -> None:
        """`nightly` has runs the scheduler created for 03:00 UTC: should the module straddle that time, the worker
        would pick one up beside the run a test triggers. Delete those that are due within a minute."""
        soon = datetime.now(timezone.utc) + timedelta(minutes=1)
        for r in self.scheduled_runs(self.deployment["id"]):
            if r["state"]["type"] == "SCHEDULED" and datetime.fromisoformat(r["expected_start_time"]) < soon:
                self.delete(f"/flow_runs/{r['id']}")

    def settle(self, timeout: float = 120) -> None:
        """Let the deployment's started runs end, then cancel any still pending or running. A worker stopped just
        after it picked up a run (the every-minute cron's next one) leaves that run PENDING or RUNNING, holding the
        deployment's one concurrency slot; this API-only server runs no lease reaper, so the next run would wait
        for the slot forever (`AwaitingConcurrencySlot`: a CI failure). A forced CANCELLED releases it."""
        filter_ = {"deployments": {"id": {"any_": [self.deployment["id"]]}},
                   "flow_runs": {"state": {"type": {"any_": ["PENDING", "RUNNING", "CANCELLING"]}}}}
        deadline = time.monotonic() + timeout
        while (started := self.post("/flow_runs/filter", filter_)) and time.monotonic() < deadline:
            time.sleep(2)
        for r in started:
            self.post(f"/flow_runs/{r['id']}/set_state", {"state": {"type": "CANCELLED", "name": "Cancelled",
                                                                    "message": "left behind by a stopped worker"},
                                                          "force": True})

    def run_deployment(self) -> dict:
        """Trigger a flow run of the deployment, let one worker poll pick it up and run it to the end."""
        self.settle()
        self.drop_due_scheduled_runs()
        flow_run = self.post(f"/deployments/{self.deployment['id']}/create_flow_run", {})
        t0 = time.perf_counter()
        worker = run([*PREFECT, "worker", "start", "--pool", POOL, "--run-once"], self.tmp, self.env, timeout=600)
        seconds = time.perf_counter() - t0
        flow_run = self.get(f"/flow_runs/{flow_run['id']}")
        assert flow_run["state"]["type"] == "COMPLETED", f"{flow_run['state']}\n{worker.stdout[-6000:]}"
        task_runs = self.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
        print(f"deployment run: {seconds:.1f} s;", "; ".join(line for line in worker.stdout.splitlines()
                                                             if line.endswith((" s", ": cached"))))
        return {"flow_run": flow_run, "task_runs": task_runs, "seconds": seconds, "log": worker.stdout}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request):
    return Stack(tmp_path_factory.mktemp("scale-out"), request)


def test_deployment_from_prefect_yaml_runs_the_pipeline_on_a_worker(stack):
    declared = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"][0]
    deployment = stack.deployment
    assert deployment["work_pool_name"] == declared["work_pool"]["name"] == POOL
    assert deployment["parameters"] == {"params_file": "params.yaml"}
    [schedule] = deployment["schedules"]
    assert schedule["schedule"]["cron"] == declared["schedules"][0]["cron"] and schedule["active"]
    assert deployment["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(stack.project.resolve())}}]

    states = [t["state"]["name"] for t in stack.first["task_runs"]]
    assert len(states) == 11 and set(states) == {"Completed"}, states  # every stage and item ran
    assert "changes: First run" in stack.first["log"], stack.first["log"][-4000:]
    augmented = (stack.project / "data" / "augmented" / "reviews.tsv").read_text().splitlines()
    assert len(augmented) - 1 > 40  # a task of your own is augmented as a GLUE one: its first 40 rows and variants

    # a DAG: each stage waits for the stages whose outputs it reads (Prefect records them), independent ones overlap
    runs = {t["name"]: t for t in stack.first["task_runs"]}  # named like the console: stage[item]
    waits = {name: {i["id"] for i in t["task_inputs"].get("wait_for", [])} for name, t in runs.items()}
    assert runs["pretrain"]["id"] in waits["finetune_teacher[reviews]"], waits
    assert runs["pretrain"]["id"] not in waits["word_vectors"], waits
    readers = {runs[n]["id"] for n in ("task_distillation[micro:reviews]", "finetune_teacher[reviews]")}
    assert readers <= waits["evaluate[reviews]"], waits

    def span(name: str) -> tuple[str, str]:
        return runs[name]["start_time"], runs[name]["end_time"]

    overlapping = [(a, b) for a in runs for b in runs if a < b and span(a)[0] < span(b)[1] and span(b)[0] < span(a)[1]]
    print("overlapping task runs:", overlapping)
    assert ("pretrain", "word_vectors") in overlapping, {n: span(n) for n in runs}  # both wait for the corpus only
    summary = json.loads((stack.project / "metrics" / "summary.json").read_text())
    assert summary["reviews"]["micro"]["params"] < summary["reviews"]["teacher"]["params"]
    record = json.loads((stack.project / "metrics" / "registry" / "micro-reviews.json").read_text())
    assert record["alias"] == "champion" and record["version"] == 1


def test_champion_loads_through_the_mlflow_server(stack):
    # nothing tracked locally: runs, the registry and the model artifacts are on the server
    assert not (stack.project / "mlflow.db").exists() and not (stack.project / "mlruns").exists()
    assert any(p.name == "MLmodel" for p in stack.artifacts.rglob("MLmodel"))
    code = """
import json, mlflow
model = mlflow.pyfunc.load_model("models:/micro-reviews@champion")
labels = list(model.predict(["the film was not good", "the music is truly wonderful"])["label"])
client = mlflow.MlflowClient()
[run] = mlflow.search_runs(experiment_names=["distillery"], filter_string="attributes.run_name = 'pipeline'",
                           output_format="list")
version = client.get_model_version_by_alias("micro-reviews", "champion")
print(json.dumps({"labels": labels, "run": run.data.tags, "version": version.tags,
                  "source": version.source}))
"""
    out = run([sys.executable, "-c", code], stack.project, stack.env, timeout=300).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert len(got["labels"]) == 2 and set(got["labels"]) <= {"pan", "praise"}
    head = provenance.git_commit(stack.project)
    assert head and got["run"]["git_commit"] == head and got["run"]["git_dirty"] == "false"
    assert "dvc.lock.sha256" not in got["run"]  # no dvc.lock yet
    assert got["version"]["git_commit"] == head


def test_dvc_remote_round_trip_then_the_deployment_is_all_cache_hits(stack):
    project, env = stack.project, stack.env
    dvc = [sys.executable, "-m", "dvc"]
    remote = stack.tmp / "dvc-remote"
    run([*dvc, "commit", "-f", "-q"], project, env)  # record what the deployment built in dvc.lock
    run([*dvc, "remote", "add", "-d", "local", str(remote)], project, env)
    run([*dvc, "push"], project, env)
    assert any(p.is_file() for p in remote.rglob("*"))

    outs = sorted({o["path"] for s in provenance.dvc_lock(project).values() for o in s.get("outs") or []
                   if o["path"].startswith(("data/", "models/"))})  # the data and checkpoints
    assert "models/students/micro-reviews/model" in outs and "data/augmented/reviews.tsv" in outs
    before = {p: fingerprint(project / p) for p in outs}
    for path in ("data", "models"):
        shutil.rmtree(project / path)
    run([*dvc, "pull"], project, env)
    assert {p: fingerprint(project / p) for p in outs} == before
    repro = run([*dvc, "repro"], project, env, timeout=300).stdout
    assert "Running stage" not in repro and "Data and pipelines are up to date" in repro, repro

    stamps = {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()}
    second = stack.run_deployment()
    states = [t["state"]["name"] for t in second["task_runs"]]
    assert len(states) == 11 and set(states) == {"Cached"}, states
    assert {p.name: p.stat().st_mtime_ns for p in (project / ".prefect" / "stamps").iterdir()} == stamps
    # continual distillation (a): a worker's run over unchanged inputs retrains nothing and says so in one line
    assert "changes: No change since the last run" in second["log"], second["log"][-4000:]
    changes = (project / "reports" / "changes.md").read_text()
    assert "No change since the last run" in changes and changes.count("\n") <= 3, changes

    code = """
import json, mlflow
runs = mlflow.search_runs(experiment_names=["distillery"], filter_string="attributes.run_name = 'pipeline'",
                          order_by=["attributes.start_time DESC"], output_format="list")
print(json.dumps(runs[0].data.tags))
"""
    tags = json.loads(run([sys.executable, "-c", code], project, env).stdout.strip().splitlines()[-1])
    assert tags["dvc.lock.sha256"] == hashlib.sha256((project / "dvc.lock").read_bytes()).hexdigest()
    assert tags["git_commit"] == provenance.git_commit(project)


# ------------------------------------------------------------------------------------------------ schedules that fire
# Last among the stack's tests: each scheduled run is one more MLflow pipeline run (the tests above count them), and
# all cache hits. Cron's granularity is one minute: each test waits for the next minute boundary (30 s on average).
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def first_scheduled_run(stack: Stack, deployment_id: str, process: Server, timeout: float = 300) -> dict:
    """The first run the deployment's schedule created, once it is over; `process` (the one that runs it) must
    stay up meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [r for r in stack.scheduled_runs(deployment_id) if r["state"]["type"] != "SCHEDULED"]
        if started and started[0]["state"]["type"] in FINAL:
            return started[0]
        assert process.proc.poll() is None, f"exited with {process.proc.returncode}:\n{process.log.read_text()[-6000:]}"
        time.sleep(2)
    raise AssertionError(f"no scheduled run over after {timeout} s: {stack.scheduled_runs(deployment_id)[:3]}\n"
                         f"{process.log.read_text()[-6000:]}")


def assert_on_time(stack: Stack, flow_run: dict, not_before: datetime, what: str, log: Path) -> float:
    """A run the cron schedule created (a minute boundary after `not_before`), completed, all cache hits, started
    at most 30 s after its expected start; returns that lateness (printed)."""
    assert flow_run["state"]["type"] == "COMPLETED", f"{flow_run['state']}\n{log.read_text()[-6000:]}"
    expected = datetime.fromisoformat(flow_run["expected_start_time"])
    started = datetime.fromisoformat(flow_run["start_time"])
    ended = datetime.fromisoformat(flow_run["end_time"])
    assert flow_run["auto_scheduled"] and expected > not_before and expected.second == expected.microsecond == 0
    lateness = (started - expected).total_seconds()
    print(f"{what}: expected {expected:%H:%M:%S}, started {lateness:+.1f} s late, completed after "
          f"{(ended - started).total_seconds():.1f} s")
    assert -1 < lateness <= 30, f"{what} started {lateness:.1f} s after its scheduled time"
    task_runs = stack.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run["id"]]}}})
    states = [t["state"]["name"] for t in task_runs]
    assert len(states) == 11 and set(states) == {"Cached"}, states
    return lateness


def served_deployment(stack: Stack, name: str, process: Server, timeout: float = 120) -> dict:
    """The deployment `name` of the pipeline, once the serving `process` has registered it with the server."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return stack.get(f"/deployments/name/distillery-pipeline/{name}")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404 and time.monotonic() < deadline, process.log.read_text()[-4000:]
            assert process.proc.poll() is None, process.log.read_text()[-4000:]
            time.sleep(1)


def test_served_and_worker_deployments_run_on_their_cron_schedules(stack):
    """Both ways to run on a schedule, waiting for one minute boundary together: `python -m flows.deploy` (flow.serve)
    with PREFECT_API_URL set, whose serving process runs what the server's scheduler creates (stopping it pauses the
    schedule); and the `nightly` deployment of prefect.yaml with an every-minute cron and a long-running worker on its
    pool, whose poll (every 10 s, Prefect's default) runs it on time."""
    since = datetime.now(timezone.utc)
    served = Server([sys.executable, "-m", "flows.deploy", "--name", "served", "--cron", "* * * * *"], None,
                    stack.env, stack.tmp / "served.log", stack.project)
    worker = None
    try:
        # --cron adds a schedule to those prefect.yaml declares
        run([*PREFECT, "--no-prompt", "deploy", "--name", "nightly", "--cron", "* * * * *"], stack.project, stack.env)
        nightly = stack.get(f"/deployments/name/{DEPLOYMENT}")
        assert sorted(s["schedule"]["cron"] for s in nightly["schedules"]) == ["* * * * *", "0 3 * * *"]
        worker = Server([*PREFECT, "worker", "start", "--pool", POOL], None, stack.env, stack.tmp / "worker.log",
                        stack.tmp)
        deployment = served_deployment(stack, "served", served)
        assert deployment["work_pool_name"] is None and deployment["parameters"] == {"params_file": "params.yaml"}
        [schedule] = deployment["schedules"]
        assert schedule["schedule"]["cron"] == "* * * * *" and schedule["active"] and not deployment["paused"]
        served_run = first_scheduled_run(stack, deployment["id"], served)
        worker_run = first_scheduled_run(stack, nightly["id"], worker)
    finally:
        served.stop()  # SIGTERM
        if worker is not None:
            worker.stop()
        # back to prefect.yaml's schedule (which deletes the every-minute runs not yet started)
        run([*PREFECT, "--no-prompt", "deploy", "--name", "nightly"], stack.project, stack.env)
        stack.settle()
    assert_on_time(stack, served_run, since, "served cron run", served.log)
    # stopped, it paused its deployment: no runs pile up for a process that is gone (serving it again resumes it)
    assert stack.get(f"/deployments/{deployment['id']}")["paused"]
    assert not [r for r in stack.scheduled_runs(deployment["id"]) if r["state"]["type"] == "SCHEDULED"]
    assert worker_run["work_pool_name"] == POOL and worker_run["parameters"] == {"params_file": "params.yaml"}
    assert_on_time(stack, worker_run, since, "worker cron run", worker.log)
    # continual distillation (a) on the clock: the scheduled run over unchanged inputs retrained nothing, said so
    changes = (stack.project / "reports" / "changes.md").read_text()
    assert "No change since the last run" in changes and changes.count("\n") <= 3, changes
    took = datetime.fromisoformat(worker_run["end_time"]) - datetime.fromisoformat(worker_run["start_time"])
    assert took < timedelta(minutes=1), took
    assert [s["schedule"]["cron"] for s in stack.get(f"/deployments/{nightly['id']}")["schedules"]] == ["0 3 * * *"]


def test_registering_a_teacher_starts_a_run_through_the_deployment_trigger(stack):
    """`python -m flows.deploy --on-teacher NAME` serves a deployment with an event trigger and no schedule;
    `python -m flows.teacher register DIR --name NAME` (MLflow server) emits the event, and the server's trigger
    service creates a run of the deployment with its params, which the serving process runs to the end."""
    served = Server([sys.executable, "-m", "flows.deploy", "--name", "on-teacher", "--on-teacher", "tiny-teacher"],
                    None, stack.env, stack.tmp / "on-teacher.log", stack.project)
    try:
        deployment = served_deployment(stack, "on-teacher", served)
        assert deployment["schedules"] == [] and deployment["parameters"] == {"params_file": "params.yaml"}
        assert stack.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}}) == []
        time.sleep(5)  # the trigger reaches the server's trigger service with the deployment
        said = run([sys.executable, "-m", "flows.teacher", "register", str(stack.project / "models" / "teacher-mlm"
                                                                          / "model"), "--name", "tiny-teacher"],
                   stack.project, stack.env).stdout
        assert "registered teacher tiny-teacher version 1 (@champion)" in said
        assert "event distillery.teacher.registered emitted" in said
        deadline = time.monotonic() + 300
        while True:
            runs = stack.post("/flow_runs/filter", {"deployments": {"id": {"any_": [deployment["id"]]}}})
            if runs and runs[0]["state"]["type"] in FINAL:
                break
            assert time.monotonic() < deadline, f"{runs[:1]}\n{served.log.read_text()[-6000:]}"
            assert served.proc.poll() is None, served.log.read_text()[-6000:]
            time.sleep(2)
    finally:
        served.stop()
    [flow_run] = runs
    assert not flow_run["auto_scheduled"] and flow_run["parameters"] == {"params_file": "params.yaml"}
    assert flow_run["state"]["type"] == "COMPLETED", f"{flow_run['state']}\n{served.log.read_text()[-6000:]}"
    with urllib.request.urlopen(f"{stack.mlflow_uri}/api/2.0/mlflow/registered-models/alias?name=tiny-teacher"
                                "&alias=champion", timeout=30) as r:
        assert json.load(r)["model_version"]["version"] == "1"


def test_the_champion_answers_raw_text_with_a_label_name_over_http(stack):
    """`mlflow models serve` of the task's champion from the MLflow server, on 127.0.0.1: a raw sentence in, one of
    the task's label names out."""
    import httpx

    port = free_port()
    serve = Server([sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/micro-reviews@champion",
                    "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)], f"http://127.0.0.1:{port}/ping",
                   stack.env, stack.tmp / "serve.log", stack.project)
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/invocations", timeout=60,
                            json={"dataframe_records": [{"text": "the movie was truly wonderful"},
                                                        {"text": "the plot was awful"}]})
    finally:
        serve.stop()
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert len(predictions) == 2 and all(p["label"] in ("pan", "praise") and 0.0 <= p["score"] <= 1.0
                                         for p in predictions), predictions


def test_worker_runs_rerun_what_changed_and_keep_a_champion_no_challenger_beats(stack):
    """Continual distillation through the worker (last: it changes the project's data and params). (b) Rows appended
    to the task's training file: that task's stages run again, not the corpus's; the report says what and how much.
    (c) A challenger that cannot beat the champion by `promote_margin` on a changed dev split: the champion (measured
    again on the new split) keeps its alias, the new version is tagged with the reason."""
    project = stack.project

    def changes() -> str:
        return (project / "reports" / "changes.md").read_text()

    def record() -> dict:
        return json.loads((project / "metrics" / "registry" / "micro-reviews.json").read_text())

    assert record()["alias"] == "champion" and record()["version"] == 1
    train = project / "reviews" / "train.csv"
    train.write_text(train.read_text() + "the script was truly wonderful,praise\nthe acting was dull,pan\n"
                     "the ending felt so lovely,praise\n")
    changed = stack.run_deployment()
    assert "changes: reports/changes.md (inputs, rows, params, stages, champions)" in changed["log"]
    report = changes()
    assert "`reviews` train: 3 rows added, 0 removed (200 -> 203)" in report, report
    assert "`reviews/train.csv`" in report  # the input file, old -> new hash
    ran = next(line for line in report.splitlines() if line.startswith("- ran ("))
    assert "prepare_task[reviews]" in ran and "finetune_teacher[reviews]" in ran and "augment[reviews]" in ran
    assert "prepare_corpus" not in ran and "word_vectors" not in ran and "pretrain" not in ran
    assert "| micro-reviews | v1 " in report
    states = {t["name"]: t["state"]["name"] for t in changed["task_runs"]}
    assert states["prepare_corpus"] == states["pretrain"] == "Cached" and states["prepare_task[reviews]"] == "Completed"

    params = project / "params.yaml"
    params.write_text(params.read_text() + "registry: {promote_margin: 1.0}\n")
    dev = project / "reviews" / "dev.csv"
    dev.write_text("\n".join(dev.read_text().splitlines()[:-10]) + "\n")  # and the dev split changes
    stack.run_deployment()
    now = record()
    assert now["alias"] == "candidate" and not now["promoted"] and now["champion"]["version"] == 1, now
    assert now["reason"].startswith("the task data changed since the champion (version 1) was registered: "
                                    "re-evaluated on the new dev split"), now["reason"]
    assert "does not beat the champion (version 1)" in now["reason"]
    report = changes()
    assert "`reviews` dev: 0 rows added, 10 removed (60 -> 50)" in report
    assert "`registry.promote_margin`: 0.0 -> 1.0" in report and "re-evaluated on the new dev split" in report
    code = """
import json, mlflow
client = mlflow.MlflowClient()
champion = client.get_model_version_by_alias("micro-reviews", "champion")
latest = max(client.search_model_versions("name = 'micro-reviews'"), key=lambda v: int(v.version))
print(json.dumps({"champion": champion.version, "latest": latest.version, "tags": latest.tags}))
"""
    got = json.loads(run([sys.executable, "-c", code], project, stack.env).stdout.strip().splitlines()[-1])
    assert got["champion"] == "1" and int(got["latest"]) > 1, got
    assert got["tags"]["promoted"] == "false" and "does not beat the champion" in got["tags"]["promotion"], got["tags"]


def test_provenance_names_the_data_inputs_of_dvc_lock(tmp_path):
    lock = {"schema": "2.0", "stages": {
        "prepare_task-sst2": {"cmd": "python -m flows.stage prepare_task --item sst2",
                              "deps": [{"path": "../shared/data/glue/SST-2", "md5": "aa.dir"},
                                       {"path": "tasks/data.py", "md5": "bb"}],
                              "outs": [{"path": "data/tasks/sst2", "md5": "cc.dir"}]},
        "finetune_teacher-sst2": {"cmd": "python -m flows.stage finetune_teacher --item sst2",
                                  "deps": [{"path": "data/tasks/sst2", "md5": "cc.dir"},
                                           {"path": "../shared/models/all-MiniLM-L6-v2", "md5": "dd.dir"}],
                                  "outs": [{"path": "models/teacher/sst2/model", "md5": "ee.dir"}]}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    assert provenance.lock_inputs(tmp_path) == {"../shared/data/glue/SST-2": "aa.dir",
                                                "../shared/models/all-MiniLM-L6-v2": "dd.dir"}
    assert provenance.lock_outs(tmp_path)["models/teacher/sst2/model"] == "ee.dir"
    tags = provenance.run_tags(tmp_path)
    assert tags["dvc.input.../shared/data/glue/SST-2.md5"] == "aa.dir"
    assert tags["dvc.lock.sha256"] == hashlib.sha256((tmp_path / "dvc.lock").read_bytes()).hexdigest()
    assert "git_commit" not in tags  # not a git repository
