"""The configuration reference page, generated from the run config's own models.

Every key of an ``rlvr train`` config is a field of :class:`~rlvr.config.run.RunConfig`'s
sections; the page lists each section (its docstring) and each key with its type, default and
field description, so the documentation cannot drift from what the loader accepts. The docs site
builds it on every build (``docs/hooks/config_reference.py``); ``python -m rlvr.config.reference``
prints it. Standard library + pydantic only.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Iterator
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rlvr.config.run import WRITE_ONLY_KEYS, RunConfig

# reStructuredText roles in docstrings, written as Markdown code: :mod:`~rlvr.x.y` -> `y`, ``x`` -> `x`
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def markdown_of(docstring: str | None) -> str:
    text = inspect.cleandoc(docstring or "")
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    return _LITERAL.sub(r"`\1`", text)


def type_name(annotation: Any) -> str:
    """A short, readable spelling of a field's type: ``int | None``, ``"a" | "b"``, ``list[str]``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # a constrained type: int >= 1, not pydantic's repr of its FieldInfo
        bounds = [f"{sign} {getattr(c, attr)}" for extra in args[1:] for c in getattr(extra, "metadata", [extra])
                  for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if hasattr(c, attr)]
        return " ".join([type_name(args[0]), *bounds])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def default_of(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.get_default(call_default_factory=True)
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, Enum):
        value = value.value
    return f"`{json.dumps(value, default=str)}`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (``AlgoSection | None`` included), or None for a plain value."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """Every leaf key of a section, nested sub-tables flattened as ``sub.key``."""
    for name, field in model.model_fields.items():
        inner = _model_of(field.annotation)
        if inner is not None and typing.get_origin(field.annotation) is not dict:
            yield from rows(inner, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section_markdown(name: str, model: type[BaseModel]) -> str:
    lines = [f"## `[{name}]`", "", markdown_of(model.__doc__), "", "| key | type | default | description |",
             "|---|---|---|---|"]
    for key, field in rows(model):
        lines.append(f"| `{key}` | {_cell(type_name(field.annotation))} | {_cell(default_of(field))} "
                     f"| {_cell(field.description or '')} |")
    for key, said in WRITE_ONLY_KEYS.get(name, {}).items():
        lines.append(f"| `{key}` | alias | — | {_cell(said)} |")
    return "\n".join(lines) + "\n"


def config_reference() -> str:
    """The whole page: one section per table of a run config, in the order the config declares them."""
    out = ["# Configuration reference", "",
           "Every key an `rlvr train` config (or `rlvr.train(...)`, or a `--section.key=value` override) "
           "accepts, generated from the loader's own models. A key not listed here is refused at load.", ""]
    for name, field in RunConfig.model_fields.items():
        model = _model_of(field.annotation)
        if model is None:
            continue
        if typing.get_origin(field.annotation) is dict:
            out.append(f"## `[{name}.NAME]`\n\n{_cell(field.description or '')}\n\n"
                       f"{markdown_of(model.__doc__)}\n\nIts keys are those of `[task]`, plus `[{name}.NAME.algo]` "
                       "with the keys of `[algo]`.\n")
            continue
        out.append(section_markdown(name, model))
    return "\n".join(out)


if __name__ == "__main__":
    print(config_reference())
