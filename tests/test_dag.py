"""The flow's DAG (flows.stages.upstream) and the device slots that bound concurrent device stages."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime
import gc
import json
import logging
import sys
import threading
import time

import pytest

from tasks import env  # noqa: F401

from distillery.preflight import load_params
from flows.pipeline import DeviceSlots, _drop_dask_close_timeout
from flows.stages import STAGES, needed, nodes, upstream
from helpers import EVENT_LINE, ONE_STUDENT, make_project, run, stage_lines


def test_upstream_follows_the_declared_inputs_and_outputs():
    p = load_params(env.ROOT / "params.yaml")
    graph = upstream(p)
    assert list(graph) == nodes(p)
    assert graph[("prepare_corpus", None)] == [] and graph[("prepare_task", "demo")] == []
    assert graph[("word_vectors", None)] == [("prepare_corpus", None)]  # independent of pre-training: overlaps it
    assert ("augment", "demo") in graph[("task_distillation", "tinybert-demo:demo")]
    assert ("augment", "demo") not in graph[("task_distillation", "minilm-demo:demo")]  # MiniLM uses no augmentation
    assert ("task_distillation", "minilm-demo:demo") not in graph[("task_distillation", "tinybert-demo:demo")]
    students = {("task_distillation", f"{s}:demo") for s in p.students}
    assert students <= set(graph[("evaluate", "demo")])
    order = {node: i for i, node in enumerate(graph)}
    assert all(order[u] < order[node] for node, ups in graph.items() for u in ups)  # acyclic, in sequential order
    devices = {name for name, stage in STAGES.items() if stage.device}
    assert {"pretrain", "finetune_teacher", "augment", "task_distillation", "evaluate", "register"} <= devices
    assert not devices & {"prepare_corpus", "prepare_task", "word_vectors", "report"}


def test_a_stage_with_its_upstream_is_what_it_needs_in_the_flows_order():
    p = load_params(env.ROOT / "params.yaml")
    need = needed(p, ("task_distillation", "minilm-demo:demo"))
    assert need[-1] == ("task_distillation", "minilm-demo:demo") and ("finetune_teacher", "demo") in need
    assert ("augment", "demo") not in need and not any(name in ("evaluate", "baseline") for name, _ in need)
    assert need == [n for n in nodes(p) if n in need]
    graph = upstream(p)
    assert all(set(graph[n]) <= set(need) for n in need)  # closed: nothing it needs is left out
    assert needed(p, ("prepare_corpus", None)) == [("prepare_corpus", None)]


def _hold(slots: DeviceSlots, events: list, name: str, exclusive: bool = False, seconds: float = 0.2) -> None:
    with slots.hold(exclusive=exclusive):
        events.append((time.perf_counter(), +1, name))
        time.sleep(seconds)
        events.append((time.perf_counter(), -1, name))


def _most_at_once(events: list) -> int:
    level = peak = 0
    for _, step, _ in sorted(events):
        level += step
        peak = max(peak, level)
    return peak


def test_device_slots_bound_shared_stages_and_an_exclusive_one_runs_alone():
    slots, events = DeviceSlots(2), []
    threads = [threading.Thread(target=_hold, args=(slots, events, f"train{i}")) for i in range(4)]
    threads.append(threading.Thread(target=_hold, args=(slots, events, "latency", True)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _most_at_once(events) == 2
    start, end = (next(t for t, step, n in events if n == "latency" and step == s) for s in (+1, -1))
    assert not [n for t, _, n in events if n != "latency" and start < t < end]  # nothing else ran beside it


def test_device_work_runs_on_the_device_threads_in_the_callers_context():
    """Whichever pool thread submits it, device work runs on the slots' own threads (one torch OpenMP team per
    device thread, however many pool threads), and sees the caller's context variables (Prefect's run context)."""
    var = contextvars.ContextVar("var", default="unset")
    slots = DeviceSlots(1)

    def submit(value: str) -> tuple[int, str]:
        var.set(value)
        return slots.run(lambda: (threading.get_ident(), var.get()))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(submit, [f"v{i}" for i in range(8)]))
    assert len({ident for ident, _ in results}) == 1 and results[0][0] != threading.get_ident()
    assert [value for _, value in results] == [f"v{i}" for i in range(8)]


@pytest.mark.slow
def test_the_flow_runs_on_a_dask_cluster(tmp_path):
    """`orchestration.runner: dask` (prefect-dask; a local in-process cluster when no address is given) runs every
    stage of a one-student micro pipeline, a second run is all cache hits, and the console stays one line per event."""
    params = {**ONE_STUDENT, "evaluation": {**ONE_STUDENT["evaluation"], "baselines": True},
              "orchestration": {"runner": "dask", "max_workers": 2}}
    project = make_project(tmp_path, params, dvc_yaml=False)
    out = run([sys.executable, "-m", "flows.pipeline"], project)
    first = stage_lines(out.stdout + out.stderr)
    assert [line for line in first if not EVENT_LINE.match(line)] == []
    assert "task_distillation[micro:demo]: started" in first and "register[micro:demo]: started" in first
    summary = json.loads((project / "metrics" / "summary.json").read_text())["demo"]
    assert summary["teacher"]["passed_gate"] and "accuracy" in summary["micro"] and "accuracy" in summary["micro-direct"]
    second = stage_lines(run([sys.executable, "-m", "flows.pipeline"], project).stdout)
    assert not [line for line in second if line.endswith(": started")]
    ran = [line for line in first if line.endswith(": started")]
    assert len([line for line in second if line.endswith(": cached")]) == len(ran)


def test_only_a_dask_close_timeout_left_unread_leaves_the_asyncio_log(caplog):
    """The asyncio record of tornado's timeout future that a closing in-process Dask worker leaves unread is dropped;
    any other unread future's error is still logged."""
    from tornado import gen
    from tornado.concurrent import Future

    async def unread_timeout():
        return gen.with_timeout(datetime.timedelta(seconds=0.01), Future())  # what BatchedSend.close waits on

    async def unread(exc):
        asyncio.get_running_loop().create_future().set_exception(exc)

    def unread_errors() -> list[str]:
        caplog.clear()
        loop = asyncio.new_event_loop()
        try:
            with caplog.at_level(logging.ERROR, logger="asyncio"):
                timeout = loop.run_until_complete(unread_timeout())
                loop.run_until_complete(asyncio.sleep(0.1))
                assert timeout.done()
                del timeout
                loop.run_until_complete(unread(TimeoutError("connect timed out")))
                loop.run_until_complete(unread(ValueError("boom")))
                gc.collect()
        finally:
            loop.close()
        return sorted(repr(r.exc_info[1]) for r in caplog.records
                      if r.getMessage().startswith("Future exception was never retrieved"))

    everything = ["TimeoutError('Timeout')", "TimeoutError('connect timed out')", "ValueError('boom')"]
    assert unread_errors() == everything
    log = logging.getLogger("asyncio")
    log.addFilter(_drop_dask_close_timeout)
    try:
        assert unread_errors() == everything[1:]
    finally:
        log.removeFilter(_drop_dask_close_timeout)
