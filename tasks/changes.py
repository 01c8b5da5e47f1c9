"""What changed since the last run, and what the run did about it: `reports/changes.md`.

Every run (the Prefect flow, `python -m flows.stage all`) ends by comparing a snapshot of its state with the last
run's (`metrics/changes.json`):

- inputs: every file or directory a stage reads that no stage writes (task files, corpus, word vectors, a local
  teacher), by content hash; a teacher given by name (the Hub, a registered model) by the revision it resolved to;
- rows: for each task, the digests of its prepared rows per split, so the report says how many were added and removed;
- params: every key whose value changed;
- stages: which ran, which were cached, which were skipped;
- champions: for each student and task, the registry's champion (version, dev score, latency) before and after, and
  the promotion decision of this run's registration.

A run where nothing changed says so in one line. The report is also the flow's MLflow artifact and a Prefect
Markdown artifact (flows/pipeline.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from tasks import paths

from distillery.config import Params
from distillery.io import write_json, write_text

#: The run's (stage, item) pairs, as the flow orders them (flows.stages.nodes).
Graph = list[tuple[Any, "str | None"]]



def snapshot_path() -> Path:
    """The last run's snapshot."""
    return paths.METRICS / "changes.json"


def report_path() -> Path:
    """This run's change report."""
    return paths.REPORTS / "changes.md"


#: Stage statuses of a run: what `execute` did with each (stage, item).
RAN, CACHED, SKIPPED = "ran", "cached", "skipped"


def status(result: dict[str, Any] | None, cached: bool = False) -> str:
    """A stage's status from its result (`tasks.execute.execute`)."""
    if cached or (result or {}).get("cached"):
        return CACHED
    return SKIPPED if (result or {}).get("skipped") else RAN


def external_inputs(p: Params, graph: Graph) -> dict[str, str]:
    """Every path a stage of `graph` reads that no stage writes -> its content hash (`tasks.stage.fingerprint`)."""
    from tasks.stage import fingerprint

    deps: set[Path] = set()
    outs: list[Path] = []
    for stage, item in graph:
        deps.update(Path(d) for d in stage.deps(p, item))
        outs.extend(Path(o) for o in stage.outs(p, item))

    def written(path: Path) -> bool:
        return any(path == o or o in path.parents for o in outs)

    return {_rel(d): fingerprint(d) for d in sorted(deps) if not written(d) and d.exists()}


def _rel(path: Path) -> str:
    return str(path.relative_to(paths.ROOT)) if path.is_relative_to(paths.ROOT) else str(path)


def row_digests(task: str) -> dict[str, list[str]]:
    """split -> the sorted digests of the prepared rows of `task` (what the stages read), {} before it is prepared."""
    from datasets import load_from_disk

    where = paths.task_data(task)
    if not where.is_dir():
        return {}
    out = {}
    for split, ds in load_from_disk(str(where)).items():
        columns = [c for c in ds.column_names if c != "idx"]
        digests = (hashlib.sha256(json.dumps([row[c] for c in columns], default=str).encode()).hexdigest()[:16]
                   for row in ds.select_columns(columns))
        out[split] = sorted(digests)
    return out


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    if not isinstance(d, dict) or not d:
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def champions(p: Params) -> dict[str, dict[str, Any]]:
    """`<student>-<task>` -> the registry's record of this run (metrics/registry/), the champion's figures kept."""
    out = {}
    for student in p.students:
        for task in p.data.tasks:
            f = paths.registry(student, task)
            if not f.is_file():
                continue
            r = json.loads(f.read_text(encoding="utf-8"))
            out[f"{student}-{task}"] = {k: r.get(k) for k in ("version", "champion_version", "promoted", "reason",
                                                               "champion")}
    return out


def snapshot(p: Params, statuses: dict[str, str], graph: Graph) -> dict[str, Any]:
    return {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "inputs": external_inputs(p, graph),
            "rows": {t: row_digests(t) for t in p.data.tasks}, "params": flat(p.model_dump(mode="json")),
            "stages": statuses, "champions": champions(p)}


def _rows_line(task: str, old: dict[str, list[str]], new: dict[str, list[str]]) -> list[str]:
    lines = []
    for split in sorted(set(old) | set(new)):
        a, b = set(old.get(split, [])), set(new.get(split, []))
        if a != b:
            lines.append(f"- `{task}` {split}: {len(b - a)} rows added, {len(a - b)} removed ({len(a)} -> {len(b)})")
    return lines


def _figure(c: dict[str, Any] | None) -> str:
    if not c or not c.get("champion"):
        return "none"
    ch = c["champion"]
    latency = f", {ch['latency_ms_b1']:.2f} ms" if isinstance(ch.get("latency_ms_b1"), (int, float)) else ""
    return f"v{ch['version']} {ch['dev.main']:.4f}{latency}" if ch.get("dev.main") is not None else f"v{ch['version']}"


def render(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """The Markdown report of `new` against `old` (None: the first run)."""
    ran = sorted(k for k, v in new["stages"].items() if v == RAN)
    skipped = sorted(k for k, v in new["stages"].items() if v == SKIPPED)
    cached = sorted(k for k, v in new["stages"].items() if v == CACHED)
    if old is None:
        return (f"# Changes\n\nFirst run ({new['time']}): nothing to compare with. {len(ran)} stages ran, "
                f"{len(cached)} cached, {len(skipped)} skipped.\n")
    inputs = [f"- `{k}`: {old['inputs'].get(k, 'absent')[:12]} -> {v[:12]}"
              for k, v in sorted(new["inputs"].items()) if old["inputs"].get(k) != v]
    inputs += [f"- `{k}`: gone" for k in sorted(set(old["inputs"]) - set(new["inputs"]))]
    rows = [line for t in new["rows"] for line in _rows_line(t, old.get("rows", {}).get(t, {}), new["rows"][t])]
    keys = sorted(k for k in set(old["params"]) | set(new["params"]) if old["params"].get(k) != new["params"].get(k))
    params = [f"- `{k}`: {json.dumps(old['params'].get(k))} -> {json.dumps(new['params'].get(k))}" for k in keys]
    if not (inputs or rows or params or ran or skipped):
        return f"# Changes\n\nNo change since the last run ({old['time']}): every stage cached, the champions as they were.\n"
    out = [f"# Changes since the last run ({old['time']})", ""]
    for title, lines in (("Inputs", inputs), ("Rows", rows), ("Params", params)):
        out += [f"## {title}", "", *(lines or ["- none"]), ""]
    out += ["## Stages", "", f"- ran ({len(ran)}): " + (", ".join(ran) or "none"),
            f"- cached ({len(cached)}): " + (", ".join(cached) or "none")]
    if skipped:
        out.append(f"- skipped ({len(skipped)}): " + ", ".join(skipped))
    out += ["", "## Champions", "", "| student-task | before | after | this run |", "|---|---|---|---|"]
    for name in sorted(set(old.get("champions", {})) | set(new["champions"])):
        before, after = old.get("champions", {}).get(name), new["champions"].get(name)
        decision = (after or {}).get("reason") if after and after != before else "no new version"
        out.append(f"| {name} | {_figure(before)} | {_figure(after)} | {decision} |")
    return "\n".join(out) + "\n"


def record(p: Params, statuses: dict[str, str], graph: Graph) -> str:
    """Write reports/changes.md for this run (`statuses`: stage label -> ran / cached / skipped) and keep its snapshot
    for the next; returns the report."""
    from distillery.io import read_state

    from tasks.execute import say

    old = read_state(snapshot_path(), say=say)  # a damaged snapshot: set aside, this run reported as the first
    new = snapshot(p, statuses, graph)
    text = render(old, new)
    write_text(report_path(), text)
    write_json(snapshot_path(), new)
    return text


def console_line(report: str) -> str:
    """The run's one console line about its change report: what it says when nothing changed, else where it is."""
    first = next(line for line in report.splitlines()[1:] if line.strip())
    return "changes: " + (first if first.startswith(("No change", "First run")) else
                          f"{_rel(report_path())} (inputs, rows, params, stages, champions)")
