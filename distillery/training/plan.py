"""A student's task stage as a plan, and the one executor that runs any plan.

A recipe (`distillery.recipes`) says what its student goes through on a task, top to bottom, as a `Plan` of `Step`s:
each step a start (where its weights come from), its data (the gold rows, TinyBERT's augmented set, the teacher-labelled
unlabelled rows), its loss terms (a `DistillSpec`; none: fine-tuning on the gold labels) and its schedule (a section of
``task_distillation``: one run, or an lr x batch grid). TinyBERT's two steps, the fine-tuning grid, the extra step, the
cut of a distilled twin and the direct baseline are all plans. `run_plan` runs one on a `Task` (the fine-tuned teacher,
its tokenizer and the task's data, opened from paths by `open_task`) and keeps the best candidate on dev.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping

from distillery.training.spec import DistillSpec
from distillery.training.task_data import Task

if TYPE_CHECKING:
    from distillery.training.grid import GridResult


@dataclass(frozen=True)
class Start:
    """Where a step's weights come from.

    ``student``: the student's general model when it has one, else ``recipe``'s init; ``init``: ``recipe``'s init
    alone (the direct baseline); ``best``: the best model of the earlier ``steps``; ``cut``: that model cut to
    ``recipe``'s shape (`distillery.pruning`, importance on the first ``init.samples`` training inputs).
    ``pretrained``: an init from teacher layers takes the pre-trained teacher's (a fresh head), not the fine-tuned's."""

    kind: Literal["student", "init", "best", "cut"]
    recipe: Any = None
    steps: tuple[str, ...] = ()
    pretrained: bool = False

    def describe(self, general: bool | None = None) -> str:
        """In words; ``general``: whether the student has a general model (None: not known)."""
        if self.kind in ("best", "cut"):
            what = f"the best of {', '.join(self.steps)}"
            if self.kind == "best":
                return what
            return f"{what}, cut to {_shape(self.recipe)} ({self.recipe.init.samples} inputs rank its parts)"
        init = self.recipe.init.kind + (" (the pre-trained teacher's layers)" if self.pretrained else "")
        if self.kind == "student" and general is not False:
            return "the general student" if general else f"the general student, else init {init}"
        return f"init {init}"


@dataclass(frozen=True)
class Step:
    """One training step of a plan: a start, data, loss terms, a schedule.

    ``schedule``: the ``task_distillation`` section it trains by (``intermediate``: one run; ``prediction``,
    ``finetune``: a grid). ``loss`` None fine-tunes on the gold labels, no teacher. ``unlabeled``: the task's unlabelled
    rows after the others (soft targets; a gold-label term skips them). ``projection``: continue the start's
    hidden-state projection (TinyBERT's W_h: the general student's, or a pruned student's kept channels). ``candidate``:
    a grid whose best run may become the student (the best candidate on dev wins; a tie keeps the later step).
    ``cache_logits``: the grid may share the teacher's logits across its runs."""

    name: str
    start: Start
    schedule: Literal["intermediate", "prediction", "finetune"]
    loss: DistillSpec | None = None
    augmented: bool = False
    unlabeled: bool = False
    projection: bool = False
    candidate: bool = True
    cache_logits: bool = True

    @property
    def grid(self) -> bool:
        return self.schedule != "intermediate"

    def under(self, folder: str) -> "Step":
        """This step in a sub-folder, not a candidate (a distilled twin's, before its cut)."""
        start = self.start if self.start.kind not in ("best", "cut") else replace(
            self.start, steps=tuple(f"{folder}/{s}" for s in self.start.steps))
        return replace(self, name=f"{folder}/{self.name}", start=start, candidate=False)

    def describe(self, sections: Any = None, general: bool | None = None) -> str:
        if self.loss is None:
            what = "fine-tuning on the gold labels"
        else:
            what = " + ".join(f"{w:g} {n}" for n, w in self.loss.objectives.weights.items() if w > 0)
            lm = self.loss.layer_map
            pairs = [f"{kind} {s}<-{t}" for kind, p in (("state", lm.hidden), ("attention", lm.attention))
                     for s, t in p]
            if pairs:
                what += f" (student<-teacher: {', '.join(pairs)})"
        data = "the gold rows" + (" + the augmented set (augment.enabled)" if self.augmented else "") + (
            " + unlabelled rows (data.unlabeled)" if self.unlabeled else "")
        return f"{self.name}: from {self.start.describe(general)}; {what}; {data}; {_schedule(self, sections)}" + (
            "" if self.candidate or not self.grid else "; not a candidate")


@dataclass(frozen=True)
class Plan:
    """A task stage: its steps in order. ``curve``: the step whose training log is the stage's curve (None: the
    student's best run's). ``shared_logits``: one folder (under the stage's output) of teacher logits for every grid
    (a twin and its cut read the same teacher on the same inputs)."""

    steps: tuple[Step, ...]
    curve: str | None = None
    shared_logits: str | None = None

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"a plan's steps need distinct names, got {names}")
        if not any(s.candidate and s.grid for s in self.steps):
            raise ValueError(f"a plan needs a grid step whose best run may become the student: {names}")
        for i, s in enumerate(self.steps):
            if s.start.kind in ("best", "cut") and not set(s.start.steps) <= set(names[:i]):
                raise ValueError(f"step {s.name} starts from {s.start.steps}, which do not run before it")

    @property
    def augmented(self) -> bool:
        """Whether a step reads the augmented set (the task stage then depends on it)."""
        return any(s.augmented for s in self.steps)

    @property
    def pretrained(self) -> bool:
        """Whether a step starts from the pre-trained teacher's layers (the task stage then depends on them)."""
        return any(s.start.pretrained and s.start.kind in ("student", "init") for s in self.steps)

    def describe(self, sections: Any = None, general: bool | None = None) -> list[str]:
        """One line per step (``sections``: the ``task_distillation`` params; ``general``: whether the student has a
        general model)."""
        return [f"{i}. {s.describe(sections, general)}" for i, s in enumerate(self.steps, 1)]


def runnable_teacher_needed(plan: Plan) -> str | None:
    """Why ``plan`` needs a teacher it can run on the task, in words: a step whose loss reads the teacher's internals,
    or one that starts from the fine-tuned teacher's layers; None when the teacher's predictions are enough."""
    from distillery.objectives.registry import TERMS

    for step in plan.steps:
        reads = [n for n in (step.loss.objectives.active() if step.loss is not None else ()) if TERMS[n].features]
        if reads:
            return f"its task step {step.name} reads the teacher's internals ({', '.join(reads)})"
        start = step.start
        if start.kind in ("student", "init") and start.recipe.init.kind in ("teacher_layers", "pruned") \
                and not start.pretrained:
            return f"its task step {step.name} starts from the fine-tuned teacher's layers (init {start.recipe.init.kind})"
    return None


def _shape(recipe) -> str:
    s = recipe.shape.resolve()
    return f"{s.layers} x {s.hidden} ({s.heads} heads, FFN {s.intermediate})"


def _schedule(step: Step, sections: Any) -> str:
    key = f"task_distillation.{step.schedule}"
    s = getattr(sections, step.schedule, None) if sections is not None else None
    if s is None:
        return key
    if not step.grid:
        return f"{key}: one run, {s.epochs:g} epochs at lr {s.learning_rate:g}, batch {s.batch_size}"
    lrs = ", ".join(f"{lr:g}" for lr in s.learning_rates)
    return f"{key}: grid lr {{{lrs}}} x batch {set(s.batch_sizes)}, {s.epochs:g} epochs each, best on dev"


@dataclass(frozen=True)
class PlanResult:
    """The best candidate's grid (its best run becomes the student), the stage's curve, the rows read."""

    grid: GridResult
    curve: Path
    rows: dict[str, int]


# ------------------------------------------------------------------------------------------------ the executor

def run_plan(plan: Plan, task: Task, sections: Any, out: Path) -> PlanResult:
    """Run ``plan``'s steps in order on ``task`` under ``out/<step>``, each by its ``task_distillation`` section of
    ``sections``; the student is the best candidate grid's best run on dev (a tie keeps the later step)."""
    from distillery.training.grid import prediction_grid

    done: dict[str, Any] = {}  # step -> its GridResult, or its model directory (one run)
    best: GridResult | None = None
    for step in plan.steps:
        start = start_factory(step.start, task, done, sections)
        if step.grid:
            teacher, run, grid = _grid(step, task, sections, out, plan.shared_logits)
            done[step.name] = result = prediction_grid(teacher, start, step.loss, run, grid)
            if step.candidate and (best is None or result.best["main"] >= best.best["main"]):
                best = result
        else:
            done[step.name] = _one_run(step, task, sections, start, out / step.name)
    curve = (out / plan.curve / "model" if plan.curve else best.best_dir) / "train_log.csv"
    return PlanResult(best, curve, dict(task.rows))


def _best_dir(done: Mapping[str, Any], steps: tuple[str, ...]) -> Path:
    chosen = None
    for name in steps:
        r = done[name]
        if chosen is None or r.best["main"] >= chosen.best["main"]:
            chosen = r
    return chosen.best_dir


def start_factory(start: Start, task: Task, done: Mapping[str, Any], sections: Any):
    """A factory of the step's starting model (each call a fresh copy; a grid calls it once per run)."""
    if start.kind == "best":
        runs = [done[s] for s in start.steps]
        path = runs[0] if len(runs) == 1 and isinstance(runs[0], Path) else _best_dir(done, start.steps)
        return lambda: task.load(path)
    if start.kind == "cut":
        factory = _cut(start, task, _best_dir(done, start.steps))
    elif start.kind == "student" and task.general is not None:
        def factory():
            return task.load(task.general)
    else:
        recipe, from_pretrained = start.recipe, start.pretrained and task.pretrained is not None
        from_pretrained = from_pretrained or task.teacher is None  # a predicted teacher: its shape is the pre-trained's

        def factory():
            teacher = task.load(task.pretrained) if from_pretrained else task.teacher
            data = task.data(False)[0] if recipe.init.kind == "pruned" else None  # pruning ranks on the task's inputs
            return recipe.start_student(teacher, task.tokenizer, head=task.head, data=data, **task.labels)
    rate = sections.student_dropout
    if rate is None:
        return factory
    from distillery.models import set_dropout

    return lambda: set_dropout(factory(), rate)


def _cut(start: Start, task: Task, wide: Path):
    from distillery.pruning import measure_importance, prune_teacher, sample_batches

    shape, train = start.recipe.shape.resolve(), task.data(False)[0]

    def cut():
        model = task.load(wide)
        layers = list(range(shape.layers))
        importance = measure_importance(model, sample_batches(train, task.tokenizer, start.recipe.init.samples), layers)
        return prune_teacher(model, layers, hidden=shape.hidden, heads=shape.heads, intermediate=shape.intermediate,
                             importance=importance)
    return cut


def _one_run(step: Step, task: Task, sections: Any, start, out: Path) -> Path:
    """One run of ``step`` (TinyBERT's task step 1): its model directory, reused when it finished before an
    interruption (under the same stage key)."""
    from distillery.training.distill import distill
    from distillery.training.spec import TrainRun

    model_dir = out / "model"
    if (model_dir / "config.json").is_file():
        return model_dir
    model = start()
    train, _ = task.data(step.augmented, unlabeled=step.unlabeled)
    spec = step.loss
    if step.projection:
        spec = replace(spec, projection=task.general or kept_channel_projection(model, task.teacher, spec))
    args = getattr(sections, step.schedule).train_args(task.seed, **task.train_args)
    # (the saved config carries task_distillation.student_dropout, so a reload keeps it)
    return distill(task.teacher, model, spec, TrainRun(out, train, tokenizer=task.tokenizer, args=args))


def kept_channel_projection(student, teacher, spec: DistillSpec):
    """W_h for a student pruned from the teacher (``init: pruned``): the selection of its kept channels (CoFi's
    identity start), one per mapped state with ``per_layer_projection``; None (a fresh W_h) for other students."""
    channels = getattr(student, "kept_channels", None)
    if channels is None:
        return None
    from distillery.models import hidden_size
    from distillery.objectives.tinybert import HiddenProjection

    n_states = max(1, len(spec.layer_map.hidden))
    return HiddenProjection.selecting(channels, hidden_size(teacher), n_states, shared=not spec.per_layer_projection)


def _grid(step: Step, task: Task, sections: Any, out: Path, shared_logits: str | None):
    """What `prediction_grid` takes for a grid ``step``: the teacher (None when it fine-tunes), the run (the task's data
    and metrics, its section's TrainingArguments options) and the grid of its section."""
    from distillery.training.spec import TrainRun

    section = getattr(sections, step.schedule)
    train, dev = task.data(step.augmented, unlabeled=step.unlabeled)
    grid = section.grid(cache=step.cache_logits and task.caches_logits)
    if shared_logits is not None:
        grid = replace(grid, cache_dir=out / shared_logits)
    if step.loss is not None and task.soft_targets is not None:  # a teacher known by its predictions
        from distillery.teacher_predictions import with_soft_targets

        train, grid = with_soft_targets(train, task.soft_targets), replace(grid, cache_teacher_logits=False)
    compute, main = task.metrics
    run = TrainRun(out / step.name, train, dev, tokenizer=task.tokenizer, compute_metrics=compute, main_score=main,
                   args=section.run_args(task.seed, **task.train_args))
    return (task.teacher if step.loss is not None else None), run, grid
