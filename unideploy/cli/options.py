"""Command-line flags made from the options plug-ins declare (``unideploy/options.py``): one flag
per field, its help the field's description, its choices the field's ``Literal``, repeatable for a
tuple, ``--no-NAME`` for a bool that defaults to True. Every flag defaults to "not given", so
only what the user typed reaches the plug-in, which applies its own defaults."""

from __future__ import annotations

import argparse
import types
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from unideploy.options import PluginOptions, flag, shown_default


def add_plugin_options(
    group: argparse._ArgumentGroup, models: Iterable[type[PluginOptions]], owner: dict[str, str] | None = None
) -> list[str]:
    """Add the flags of every field of ``models`` to ``group`` (a field two plug-ins share, once);
    return the field names. ``owner``: field name -> the plug-in to name in its help."""
    added: list[str] = []
    for model in models:
        for name, field in model.model_fields.items():
            if name not in added:
                group.add_argument(flag(name, field.default), dest=name, default=None, **_argument(name, field, owner))
                added.append(name)
    return added


def given(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The options among ``names`` the user gave (a repeated flag as a tuple)."""
    values = {name: getattr(args, name, None) for name in names}
    return {name: tuple(v) if isinstance(v, list) else v for name, v in values.items() if v is not None}


def _argument(name: str, field: FieldInfo, owner: dict[str, str] | None) -> dict[str, Any]:
    kind = _unwrap(field.annotation)
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    help_text = (field.description or "") + (f" ({owner[name]})" if owner and name in owner else "")
    shown = "" if (default := shown_default(field.default)) is None else f" (default: {default})"
    argument: dict[str, Any] = {"help": (help_text + shown).replace("%", "%%")}
    if kind is bool:
        return {**argument, "action": "store_const", "const": field.default is not True}
    repeated = get_origin(kind) in (tuple, list)
    if repeated:
        kind = get_args(kind)[0]
        argument["action"] = "append"
    if get_origin(kind) is Literal:
        argument["choices"] = list(get_args(kind))
    elif kind in (int, float):
        argument["type"] = kind
    if "metavar" in extra:
        argument["metavar"] = extra["metavar"]
    return argument


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None`` and ``Annotated[X, ...]``."""
    while get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return getattr(annotation, "__origin__", annotation) if hasattr(annotation, "__metadata__") else annotation
