"""Pre-flight: what a params file names checked against the files, the Hub and the teacher before any work, and the
tasks of your own registered (`distillery.config` is the schema alone).

`load_params` is what every flow and stage calls: it reads the file, validates the schema (`parse_params`), registers
its custom tasks (`distillery.custom_tasks`), and checks the recipes against the teacher (`check_params`) and,
with ``inputs``, every path and model reference (`check_inputs`); every problem is one `ConfigError` naming the file
and the dotted key.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import yaml

from distillery.config import CUSTOM_SPLITS, ConfigError, Params, augment_sections, parse_params
from distillery.io import hub_offline, resolve_path
from distillery.recipes import RecipeError, verify
from distillery.shape import Dims


def register_custom_tasks(p: Params, path: str = "params.yaml", root: Path | None = None) -> Params:
    """The tasks of your own (``data.custom``) join the task registry, their paths relative to `root` (default: the
    project the params file is in)."""
    if p.data.custom:
        from distillery import custom_tasks

        custom_tasks.register_tasks(p.data.custom, project_root(path, root))
    return p


def declared_teacher_dims(p: Params, root: Path) -> Dims | None:
    """The teacher's dims from its params shape or its local config.json; None for a Hub name (read at stage time)."""
    t = p.teacher
    if t.init == "scratch":
        from distillery.shape import ModelConfigError

        try:
            return replace(t.shape.resolve(), vocab=t.vocab_size)
        except ModelConfigError as exc:
            raise ConfigError(f"teacher.shape: {exc}") from None
    local = resolve_path(t.name_or_path, root)
    if not local.exists():
        return None
    if not (local / "config.json").is_file():
        raise ConfigError(f"teacher.name_or_path: {local} has no config.json (not a model directory)")
    from transformers import AutoConfig

    return Dims.of_config(AutoConfig.from_pretrained(str(local)))


def has_mlm_head(name_or_path: str, root: Path) -> bool | None:
    """Whether a local checkpoint was saved with an MLM head (None when it cannot be told: a Hub name)."""
    local = resolve_path(name_or_path, root)
    if not (local / "config.json").is_file():
        return None
    import json

    archs = json.loads((local / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    return any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs)


def project_root(path: str, root: Path | None) -> Path:
    """Where a params file's relative paths start: ``root`` when given, else the file's directory (its parent for a
    preset in ``params/``)."""
    root = Path(root) if root is not None else Path(path).resolve().parent
    return root.parent if root.name == "params" else root  # a preset in params/: paths are relative to the project


def check_params(p: Params, path: str = "params.yaml", root: Path | None = None) -> Params:
    """What params alone can tell beyond the schema: every student recipe against its teacher (layer maps,
    heads, widths, relation heads, teacher layers, MLM head for pre-training distillation), local checkpoints."""
    root = project_root(path, root)
    from distillery.precision import PrecisionError, resolve

    try:
        used = resolve(p.precision)
    except PrecisionError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for name, recipe in p.students.items():  # a served form is one the evaluate stage measures in this run
        if recipe.budget is not None and "bf16" in (recipe.budget.forms or ()) and used != "bf16":
            raise ConfigError(f"{path}: students.{name}.budget.forms: bf16 is not served in this run (precision: "
                              f"{p.precision} runs {used} here, and the evaluate stage measures no bf16 form): drop "
                              "it, or set precision: bf16 on a machine with fast bf16")
    if any(a.enabled and a.mlm == "teacher" for a in augment_sections(p)) and not p.pretrain.enabled:
        raise ConfigError(f"{path}: augment.mlm: 'teacher' is the pre-training stage's MLM and needs pretrain.enabled; "
                          "give a masked-LM checkpoint (directory or Hub name) instead, or set augment.enabled: false")
    _check_span_windows(p, path)
    _check_unlabeled(p, path)
    teacher = declared_teacher_dims(p, root)
    _check_students(p, teacher, path, root)
    _check_predicted_teachers(p, teacher, path)
    return p


def _check_predicted_teachers(p: Params, teacher: Dims | None, path: str) -> None:
    """A task whose teacher is known by its predictions (``teacher.predictions``, ``teacher.ensemble``) has students
    that distil its predictions only: no span task, no augmentation (its new rows have no prediction), no budget (a
    speedup over a teacher that cannot be timed), no step that reads the teacher's internals or starts from its layers
    (with the teacher's dims: known here for a local or scratch teacher)."""
    from distillery.recipes import direct_plan, task_plan
    from distillery.task_kinds import is_span
    from distillery.training.plan import runnable_teacher_needed

    for task in [t for t in p.data.tasks if p.teacher.predicted(t)]:
        key = f"teacher.{'predictions' if task in p.teacher.predictions else 'ensemble'}.{task}"
        q = p.for_task(task)
        only = f"task {task}'s teacher is known by its predictions only ({key})"
        if is_span(task):
            raise ConfigError(f"{path}: {key}: task {task} is a span task; a teacher known by predictions gives each "
                              "row's class probabilities, logits or score (classification and regression tasks)")
        if q.augment.enabled:
            raise ConfigError(f"{path}: augment.enabled: augmentation labels its new rows with the task's fine-tuned "
                              f"teacher, and {only}; set augment.enabled: false (for this task alone: "
                              f"per_task.{task}.augment.enabled: false)")
        for name, recipe in p.students.items():
            if recipe.budget is not None:
                raise ConfigError(f"{path}: students.{name}.budget: a budget is a speedup over the teacher, and {only}, "
                                  "which cannot be timed; give the student a shape")
            if teacher is None:
                continue
            for plan in (task_plan(recipe, teacher, q.task_distillation), direct_plan(recipe)):
                if (why := runnable_teacher_needed(plan)) is not None:
                    raise ConfigError(f"{path}: students.{name}: {why}, and {only}; give a runnable teacher for the task "
                                      f"(teacher.finetuned.{task}) or a student that distils predictions only (e.g. "
                                      "pkd with beta: 0, or a recipe's task_distillation: true)")


def _check_span_windows(p: Params, path: str) -> None:
    """Each span task's windows (`distillery.squad.FeatureConfig`) checked before any stage: one error naming the
    keys."""
    from distillery.task_kinds import is_span

    for task in (t for t in p.data.tasks if is_span(t)):
        from distillery.squad.features import FeatureConfig  # with `datasets`: only where a span task is

        d = p.for_task(task).data
        try:
            FeatureConfig(max_length=d.max_length, doc_stride=d.doc_stride, max_query_length=d.max_query_length)
        except ValueError as exc:
            where = f"per_task.{task}.data" if task in p.per_task and p.per_task[task].data else "data"
            raise ConfigError(f"{path}: {where}.doc_stride (task {task}): {exc}") from None


def _data_key(p: Params, task: str, key: str) -> str:
    """Where a task's `data` key is set: its own section (`per_task.<task>.data`) or the run's."""
    own = p.per_task.get(task)
    return f"per_task.{task}.data.{key}" if own is not None and key in own.data else f"data.{key}"


def _check_unlabeled(p: Params, path: str) -> None:
    """Unlabelled rows (``data.unlabeled``) only where a task can have them: a classification or regression task, and
    for ``rest`` a training split cut by ``max_train_examples``."""
    from distillery.task_kinds import is_span

    for task in p.data.tasks:
        d = p.for_task(task).data
        if d.unlabeled is None:
            continue
        key = _data_key(p, task, "unlabeled")
        if is_span(task):
            raise ConfigError(f"{path}: {key}: task {task} is a span task; unlabelled rows are for classification "
                              "and regression tasks (the teacher's soft targets per row)")
        if d.unlabeled == "rest" and d.max_train_examples is None:
            raise ConfigError(f"{path}: {key}: rest is the training rows data.max_train_examples leaves out, and task "
                              f"{task} reads its whole training split; set max_train_examples, or give a file")


def _check_students(p: Params, teacher: Dims | None, path: str, root: Path) -> None:
    mlm_teacher = p.pretrain.enabled or (p.teacher.init == "pretrained" and has_mlm_head(p.teacher.name_or_path, root))
    for name, recipe in p.students.items():
        key = f"students.{name}"
        if recipe.init.kind == "checkpoint":
            ckpt = resolve_path(recipe.init.checkpoint, root)
            from distillery.models import _looks_local

            if _looks_local(recipe.init.checkpoint) and not (ckpt / "config.json").is_file():
                problem = ("is not a model directory (no config.json)" if ckpt.exists() else "not found; give an "
                           "existing directory (relative paths start at the project root) or a Hub model id")
                raise ConfigError(f"{path}: {key}.init.checkpoint: {ckpt} {problem}")
        if recipe.needs_mlm_teacher and mlm_teacher is False:
            raise ConfigError(f"{path}: {key}: pre-training distillation needs a teacher with an MLM head: set "
                              "pretrain.enabled, or a teacher checkpoint saved with one")
        if teacher is not None:
            try:
                verify(recipe, teacher, key)
            except RecipeError as exc:
                raise ConfigError(f"{path}: {exc}") from None


def _check_model_ref(name: str, root: Path, key: str, path: str, what: str = "model") -> Path | None:
    """A params model reference (local directory or Hub name) that can be used: an existing directory with a
    config.json (returned), or a valid Hub id that is cached when the Hub is offline (its cached config.json is
    returned, or None when it will be downloaded). Raises ConfigError naming ``key`` otherwise."""
    from distillery.models import _looks_local

    local = resolve_path(name, root)
    if local.exists():
        if not (local / "config.json").is_file():
            raise ConfigError(f"{path}: {key}: {local} is not a {what} directory (no config.json)")
        return local / "config.json"
    if _looks_local(name):
        raise ConfigError(f"{path}: {key}: {what} directory {local} not found; give an existing directory "
                          "(relative paths start at the project root) or a Hub model id")
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ConfigError(f"{path}: {key}: {name!r} is neither an existing directory ({local}) nor a Hub model id "
                          "(org/name)") from None
    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return Path(cached)
    if hub_offline():
        raise ConfigError(f"{path}: {key}: {name!r} is not a directory ({local} not found) and not in the Hugging "
                          "Face cache, and the Hub is offline (HF_HUB_OFFLINE); give a local model directory, or run "
                          "with HF_HUB_OFFLINE=0 to download it")
    return None


def _check_file(entry: str, root: Path, key: str, path: str, *, directory_ok: bool = False) -> Path:
    local = resolve_path(entry, root)
    if not local.exists() or (not directory_ok and local.is_dir()):
        what = "file or directory" if directory_ok else "file"
        raise ConfigError(f"{path}: {key}: {what} {local} not found (relative paths start at the project root)")
    return local


def check_inputs(p: Params, path: str = "params.yaml", root: Path | None = None) -> Params:
    """Every input the params name exists and is what it should be, before the first stage runs: the teacher
    (a local model directory, or a Hub id, cached when the Hub is offline; a cached Hub teacher's config is read
    for the recipe checks), its tokenizer, the GLUE directory with each task's files, the corpus files, the
    word-vector file, the augmentation MLM (with an MLM head) and the students' init checkpoints."""
    from distillery.glue.tasks import get_task, tasks_evaluated_with

    root = project_root(path, root)
    t = p.teacher
    if t.init == "pretrained":
        config = _check_model_ref(t.name_or_path, root, "teacher.name_or_path", path, "teacher")
        if config is not None and not resolve_path(t.name_or_path, root).exists():  # a cached Hub teacher
            from transformers import AutoConfig

            _check_students(p, Dims.of_config(AutoConfig.from_pretrained(str(config.parent))), path, root)
    if t.tokenizer not in (None, "demo"):
        _check_file(t.tokenizer, root, "teacher.tokenizer", path, directory_ok=True)
    for task, ref in t.finetuned.items():
        config = _check_model_ref(ref, root, f"teacher.finetuned.{task}", path, "fine-tuned teacher")
        if config is not None and resolve_path(ref, root).is_dir():  # a local one: checked whole before any work
            from distillery.models import ModelFilesError, check_model_files

            try:
                check_model_files(config.parent, f"teacher.finetuned.{task}")
            except ModelFilesError as exc:
                raise ConfigError(f"{path}: {exc}") from None
    if p.data.source == "local" and "squad" in p.data.tasks:
        _check_file(p.data.squad_file, root, "data.squad_file", path)
    if p.data.source == "local" and p.data.glue_dir:
        glue_dir = resolve_path(p.data.glue_dir, root)
        if not glue_dir.is_dir():
            raise ConfigError(f"{path}: data.glue_dir: directory {glue_dir} not found (the GLUE download layout: "
                              "<glue_dir>/SST-2/train.tsv, ...)")
        for task in [t for t in p.data.tasks if t != "squad" and t not in p.data.custom]:
            for name in tasks_evaluated_with(task):
                spec = get_task(name)
                needed = [f for s, f in spec.files.items() if s in ("train", "dev")]
                missing = [f for f in needed if not (glue_dir / spec.dirname / f).is_file()]
                if not (glue_dir / spec.dirname).is_dir() or missing:
                    raise ConfigError(f"{path}: data.tasks: {name} needs {glue_dir / spec.dirname}/ with "
                                      f"{', '.join(needed) or 'its files'} (missing: {', '.join(missing) or 'the directory'})")
    for name, own in p.data.custom.items():
        for split in CUSTOM_SPLITS:
            if getattr(own, split) is not None:
                _check_file(getattr(own, split), root, f"data.custom.{name}.{split}", path)
    given = [(task, f"teacher.predictions.{task}", g) for task, g in t.predictions.items()]
    given += [(task, f"teacher.ensemble.{task}[{i}]", m) for task, ms in t.ensemble.items() for i, m in enumerate(ms)]
    files = []
    for task, key, g in given:
        if g.file is not None:
            files.append((task, key, g.file, g.values))
        elif (config := _check_model_ref(g.model, root, key, path, "fine-tuned teacher")) is not None \
                and resolve_path(g.model, root).is_dir():
            from distillery.models import ModelFilesError, check_model_files

            try:
                check_model_files(config.parent, key)
            except ModelFilesError as exc:
                raise ConfigError(f"{path}: {exc}") from None
    for task, key, file, values in files:  # read whole: format and values (its rows: by the teacher stage)
        from distillery import teacher_predictions
        from distillery.glue.tasks import get_task

        try:
            teacher_predictions.read(_check_file(file, root, key, path), get_task(task), values, key)
        except teacher_predictions.PredictionsError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if p.corpus.source == "files":
        for i, entry in enumerate(p.corpus.paths):
            local = _check_file(entry, root, f"corpus.paths[{i}]", path, directory_ok=True)
            if local.is_dir() and not any(local.rglob("*.txt")):
                raise ConfigError(f"{path}: corpus.paths[{i}]: directory {local} holds no .txt file")
    augments = [a for a in augment_sections(p) if a.enabled]
    if augments and p.word_vectors.source == "file":
        _check_file(p.word_vectors.path, root, "word_vectors.path", path)
    for mlm in dict.fromkeys(a.mlm for a in augments if a.mlm != "teacher"):
        config = _check_model_ref(mlm, root, "augment.mlm", path, "masked-LM")
        if config is not None:
            import json

            archs = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
            if archs and not any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
                raise ConfigError(f"{path}: augment.mlm: {mlm} has no MLM head (saved as {archs[0]}); "
                                  "give a masked-LM checkpoint (…ForMaskedLM), or 'teacher' with pretrain.enabled")
    for name, recipe in p.students.items():
        if recipe.init.kind == "checkpoint":
            _check_model_ref(recipe.init.checkpoint, root, f"students.{name}.init.checkpoint", path, "checkpoint")
    return p


def load_params(path: str | Path = "params.yaml", *, check: bool = True, inputs: bool = False,
                root: Path | None = None) -> Params:
    """Read and validate a params file; raise ConfigError naming the file and key on any problem.
    ``check`` also runs :func:`check_params` (reads the teacher's config.json when it is local); ``inputs`` also
    :func:`check_inputs` (every path the params name exists; relative paths start at ``root``).
    The same bytes are parsed and checked once per process (the result is immutable); the inputs, which may change
    on disk, are checked at every call."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found")
    p = _parsed(str(path), path.read_bytes(), check, None if root is None else str(root))
    register_custom_tasks(p, str(path), root)  # parsed once per process, registered at every load (another params
    # file may share a name)
    if inputs:
        check_inputs(p, str(path), root)
    return p


@functools.lru_cache(maxsize=32)
def _parsed(path: str, text: bytes, check: bool, root: str | None) -> Params:
    try:
        data = yaml.safe_load(text.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    p = register_custom_tasks(parse_params(data, path), path, None if root is None else Path(root))
    if check:
        check_params(p, path, None if root is None else Path(root))
    return p
