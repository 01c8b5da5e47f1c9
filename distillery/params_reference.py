"""The params reference, generated from the schema (`distillery.config.Params` and the recipes' sections): every key
with its type, its default and its meaning, the meaning being the comment the schema's source gives the field (on its
line, or the lines just above it). The docs build renders it (docs/hooks.py), so it cannot drift from the code.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
import typing
from typing import Any, Iterator

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


@functools.lru_cache(maxsize=None)
def _comments(cls: type) -> dict[str, str]:
    """field name -> the comment on its line in `cls`'s source, else the comment lines right above it."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = textwrap.dedent("".join(lines))
    src_lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        own = src_lines[node.end_lineno - 1]
        trailing = own.split("  # ", 1)[1].strip() if "  # " in own else ""
        above = []
        i = node.lineno - 2
        while i >= 0 and src_lines[i].strip().startswith("#"):
            above.insert(0, src_lines[i].strip().lstrip("#").lstrip(":").strip())
            i -= 1
        out[node.target.id] = (trailing or " ".join(above)).lstrip(":").strip()
    return out


def meaning(cls: type, name: str) -> str:
    """The comment of field `name` where it is declared in `cls`'s MRO."""
    for klass in cls.__mro__:
        if name in getattr(klass, "__annotations__", {}):
            text = _comments(klass).get(name, "")
            if text:
                return text
    return ""


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) if not isinstance(a, str) else a for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(dict.fromkeys(_type_name(a) for a in typing.get_args(tp)))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin in (list, tuple, set, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(tp))}]"
    if tp is type(None):
        return "null"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.default if field.default is not PydanticUndefined else field.default_factory()
    if isinstance(value, BaseModel):
        return "-"
    return "`null`" if value is None else f"`{value!r}`".replace("|", "\\|")


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The sections a field's type holds: itself, the values of a dict, the members of a union."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(tp):
        out += _models_in(arg)
    return out


def rows(model: type[BaseModel], prefix: str = "", seen: dict[type, str] | None = None,
         skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, str, str, str]]:
    """(dotted key, type, default, meaning) of every key under `model`, sections depth first. A dict of sections
    (``students.<name>``, ``per_task.<task>``) shows its keys under ``<name>``; a union of recipes shows the keys every
    recipe has once, then each recipe's own under ``[recipe]``. A section type met before is shown once, where it
    first appears (later: "as `key`")."""
    seen = {} if seen is None else seen
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        key = f"{prefix}{name}"
        tp = field.annotation
        inner = [m for m in _models_in(tp) if m is not model]
        repeated = next((seen[m] for m in inner if m in seen), None) if len(inner) == 1 else None
        text = meaning(model, name)
        if repeated:
            text = f"{text} (keys as under `{repeated}`)".strip()
        yield key, _type_name(tp), _default(field), text
        if repeated or not inner:
            continue
        if typing.get_origin(tp) is dict:
            key += ".<name>"
        if len(inner) == 1:
            seen[inner[0]] = key
            yield from rows(inner[0], f"{key}.", seen)
            continue
        shared = frozenset.intersection(*(frozenset(m.model_fields) for m in inner))
        label = {m: (f"[{typing.get_args(m.model_fields['recipe'].annotation)[0]}]" if "recipe" in m.model_fields
                     else f"[{m.__name__}]") for m in inner}
        common = inner[0]
        for shared_name in [n for n in common.model_fields if n in shared and n != "recipe"]:
            types_ = dict.fromkeys(_type_name(m.model_fields[shared_name].annotation) for m in inner)
            if len(types_) > 1:  # a tag (init.kind): every member's value
                yield f"{key}.{shared_name}", " \\| ".join(types_), "-", meaning(common, shared_name)
                continue
            yield from rows(common, f"{key}.", seen, skip=frozenset(common.model_fields) - {shared_name})
        for sub in inner:
            yield from rows(sub, f"{key}{label[sub]}.", seen, skip=shared - {"recipe"})


def render() -> str:
    """The reference page as Markdown."""
    from distillery.config import Params

    out = ["# Params reference\n\n",
           "Every key a params file may hold (`params.yaml`, `params/*.yaml`), generated from the schema in "
           "`distillery/config.py` and the recipes' sections when the docs are built: its type, its default "
           "(\"required\" where there is none, \"-\" for a section) and what it means. An unknown key, a wrong type "
           "or an impossible value stops a run before any work, naming the key. A student's keys depend on its "
           "`recipe`: `students.<name>[tinybert].layer_map` is a TinyBERT student's.\n\n",
           "| key | type | default | meaning |\n|---|---|---|---|\n"]
    for key, tp, default, text in rows(Params):
        out.append(f"| `{key}` | {tp} | {default} | {text.replace('|', chr(92) + '|')} |\n")
    return "".join(out)
