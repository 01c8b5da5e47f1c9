"""The pipeline's stages in order, and the items each runs for (tasks, students, student-task pairs)."""

from __future__ import annotations

from tasks.augment import AUGMENT
from tasks.data import PREPARE_CORPUS, PREPARE_TASK, WORD_VECTORS
from tasks.distill import BASELINE, STUDENT_STAGES, TASK_DISTILLATION, students_with
from tasks.evaluate import EVALUATE, REPORT
from tasks.register import REGISTER
from tasks.search import SEARCH, budgeted
from tasks.stage import Stage
from tasks.teacher import FINETUNE_TEACHER, PRETRAIN

from distillery.config import Params
from distillery.task_kinds import task_kind

STAGES: dict[str, Stage] = {s.name: s for s in (
    PREPARE_CORPUS, PREPARE_TASK, PRETRAIN, WORD_VECTORS, FINETUNE_TEACHER, AUGMENT, *STUDENT_STAGES,
    SEARCH, TASK_DISTILLATION, BASELINE, EVALUATE, REGISTER, REPORT,
)}
STUDENT_STAGE_NAMES = frozenset(s.name for s in STUDENT_STAGES)


def items(stage: str, p: Params) -> list[str | None]:
    """The items a stage runs for under params `p` ([] when the stage is switched off)."""
    if stage in STUDENT_STAGE_NAMES:  # the students whose recipe adds it
        return students_with(p, stage)
    tasks, students = list(p.data.tasks), list(p.students)
    pairs = [f"{s}:{t}" for s in students for t in tasks]
    augmented = [t for t in tasks if p.for_task(t).augment.enabled and task_kind(t).augmentable]
    return {
        "prepare_corpus": [None],
        "prepare_task": tasks,
        "pretrain": [None] if p.pretrain.enabled else [],
        "word_vectors": [None] if augmented else [],
        "finetune_teacher": tasks,
        "augment": augmented,
        "search": budgeted(p),
        "task_distillation": pairs,
        "baseline": pairs if p.evaluation.baselines else [],
        "evaluate": tasks,
        "register": pairs if p.registry.enabled else [],
        "report": [None],
    }[stage]


Node = tuple[str, "str | None"]  # (stage name, item)


def nodes(p: Params) -> list[Node]:
    """Every (stage, item) the pipeline runs under `p`, in a valid sequential order."""
    return [(name, item) for name in STAGES for item in items(name, p)]


def upstream(p: Params) -> dict[Node, list[Node]]:
    """Each node's producers: the earlier nodes with an output that is, holds or lies inside one of its inputs. The
    same deps and outs that `dvc.yaml` declares, so the flow's DAG and DVC's are one graph."""
    from pathlib import Path

    def overlap(a: Path, b: Path) -> bool:
        return a == b or a in b.parents or b in a.parents

    made: dict[Node, list[Path]] = {}
    graph: dict[Node, list[Node]] = {}
    for node in nodes(p):
        stage = STAGES[node[0]]
        deps = [Path(d).resolve() for d in stage.deps(p, node[1])]
        graph[node] = [other for other, outs in made.items() if any(overlap(d, o) for d in deps for o in outs)]
        made[node] = [Path(o).resolve() for o in stage.outs(p, node[1])]
    return graph


def needed(p: Params, node: Node) -> list[Node]:
    """`node` and every node it needs, transitively through `upstream`, in `nodes`' order."""
    graph, todo, seen = upstream(p), [node], {node}
    while todo:
        for other in graph[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return [n for n in nodes(p) if n in seen]
