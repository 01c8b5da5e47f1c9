"""The shape of the code, checked: layers that only point down (library <- tasks <- flows), no import cycle, no
training or task function wider than 8 parameters, and no code outside `distillery/recipes/` that asks which recipe
a student is."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("distillery", "tasks", "flows")
LAYER = {"distillery": 0, "tasks": 1, "flows": 2}
RECIPE_CLASSES = {"TinyBertRecipe", "MiniLMRecipe", "DistilBertRecipe", "MobileBertRecipe", "PKDRecipe"}


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its file (function-level imports too), each the most specific
    known module (`from a.b import c` is a.b.c when that is a module, else a.b)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
            found.update(resolve(f"{base}.{a.name}") for a in node.names)
    return found - {None, name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def test_layers_only_point_down():
    wrong = [(a, b) for a, deps in graph().items() for b in deps
             if LAYER[b.split(".")[0]] > LAYER[a.split(".")[0]]]
    assert not wrong, f"imports from a lower layer to a higher one (library <- tasks <- flows): {wrong}"


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own submodules is not a cycle of the code, only of the re-export
    g = {a: {b for b in deps if not (a == b.rpartition(".")[0] and ROOT.joinpath(*a.split(".")).is_dir())}
         for a, deps in g.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles: {cycles}"


def functions(paths):
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                yield path, node, len(names) + (a.vararg is not None) + (a.kwarg is not None)


def test_no_training_or_task_function_has_more_than_8_parameters():
    paths = [*(ROOT / "distillery" / "training").rglob("*.py"), *(ROOT / "tasks").rglob("*.py")]
    wide = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({k})" for p, n, k in functions(paths) if k > 8]
    assert not wide, f"functions with more than 8 parameters: {wide}"


def test_nobody_outside_the_recipes_asks_which_recipe_a_student_is():
    found = []
    for path in [*(ROOT / "tasks").rglob("*.py"), *(ROOT / "flows").rglob("*.py"), *(ROOT / "distillery").rglob("*.py")]:
        if "recipes" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if names & RECIPE_CLASSES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"isinstance on recipe classes outside distillery/recipes: {found}"


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string constant of a module, docstrings and comments aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_recipes_own_their_stages():
    """No recipe name and no recipe's student-level stage (or its folder) is named in tasks/ or flows/: the pipeline's
    student stages, their outputs, curves and DVC stages come from `Recipe.STUDENT_STAGES`."""
    from distillery.recipes import RECIPES, student_stage_folders

    folders = student_stage_folders()
    names = set(RECIPES) | set(folders) | set(folders.values())
    found = [f"{p.relative_to(ROOT)}:{line} {value!r}"
             for p in [*(ROOT / "tasks").rglob("*.py"), *(ROOT / "flows").rglob("*.py")]
             for line, value in _string_constants(p) if value in names]
    assert not found, f"recipe or recipe-stage names outside distillery/recipes: {found}"
    assert {"teacher_assistant", "ib_teacher", "knowledge_transfer", "general_distillation"} <= set(folders)


def test_task_kinds_own_their_branching():
    """tasks/ and flows/ never ask whether a task is a span task: they ask its `task_kind`."""
    found = set()
    for path in [*(ROOT / "tasks").rglob("*.py"), *(ROOT / "flows").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name) and node.id in ("is_span", "SPAN_TASKS"):
                found.add(path.relative_to(ROOT).as_posix())
    assert not found, f"span branches outside distillery/task_kinds.py: {found}"


def test_the_checks_see_the_code():
    """The checks above would pass on an empty tree: make sure they read the real one."""
    g = graph()
    assert "distillery.recipes.tinybert" in g and "tasks.distill" in g and "flows.pipeline" in g
    assert "distillery.recipes.base" in g["distillery.recipes.tinybert"]
    assert any(b.startswith("tasks.") for b in g["flows.stages"])
    assert sum(1 for _ in functions((ROOT / "tasks").rglob("*.py"))) > 50


def test_the_params_schema_reads_no_file_and_asks_no_hub():
    """distillery/config.py is the schema alone: the checks against files, the Hub and the teacher and the custom
    tasks' registration are the pre-flight's (distillery/preflight.py)."""
    tree = ast.parse((ROOT / "distillery" / "config.py").read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    outside = {m for m in imported if m.split(".")[0] in ("huggingface_hub", "transformers", "yaml")
               or m in ("distillery.io", "distillery.preflight")}
    assert not outside, f"config.py imports {sorted(outside)}"
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    touching = calls & {"exists", "is_file", "is_dir", "read_text", "read_bytes", "open", "rglob", "glob",
                        "register_tasks"}
    assert not touching, f"config.py calls {sorted(touching)}"
