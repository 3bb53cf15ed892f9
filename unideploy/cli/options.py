"""Command-line flags made from the options plug-ins declare (``unideploy/options.py``): one flag
per field, its help the field's description, its choices the field's ``Literal``, repeatable for a
tuple, ``--no-NAME`` for a bool that defaults to True. Every flag defaults to "not given", so
only what the user typed reaches the plug-in, which applies its own defaults."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic.fields import FieldInfo

from unideploy.options import PluginOptions, flag, form, shown_default


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
    given = form(field)
    help_text = (field.description or "") + (f" ({owner[name]})" if owner and name in owner else "")
    shown = "" if (default := shown_default(field.default)) is None else f" (default: {default})"
    argument: dict[str, Any] = {"help": (help_text + shown).replace("%", "%%")}
    if given.kind is bool:
        return {**argument, "action": "store_const", "const": field.default is not True}
    if given.repeated:
        argument["action"] = "append"
    if given.choices is not None:
        argument["choices"] = list(given.choices)
    elif given.kind in (int, float):
        argument["type"] = given.kind
    if given.metavar:
        argument["metavar"] = given.metavar
    return argument
