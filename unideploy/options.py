"""Options a plug-in declares for itself: one typed model per optimizer pass or deployment target.

Like ONNX Runtime's quantizer (one config class per method), the options belong to the plug-in
that reads them, not to a union every caller re-lists. A field's name is the Python API's keyword
and the command line's flag (``int8_variant`` -> ``--int8-variant``; a bool that defaults to True
is turned off by ``--no-NAME``); its description is the help text; a ``Literal`` type gives the
choices; a tuple is a repeatable flag. The CLI (``cli/options.py``), the Python API's validation,
``deploy doctor`` and docs/cli.md are made from these models, so a plug-in added through an entry
point brings its options with it.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from unideploy.errors import InputError


@dataclass(frozen=True)
class Form:
    """How an option is given on a command line: its value's type, its choices (a ``Literal``),
    whether it repeats (a tuple) and its placeholder (``json_schema_extra={"metavar": ...}``)."""

    kind: Any
    choices: tuple[Any, ...] | None
    repeated: bool
    metavar: str | None


def form(field: FieldInfo) -> Form:
    kind = field.annotation
    while get_origin(kind) in (Union, types.UnionType):  # X | None
        kind = next(a for a in get_args(kind) if a is not type(None))
    repeated = get_origin(kind) in (tuple, list)
    if repeated:
        kind = get_args(kind)[0]
    choices = get_args(kind) if get_origin(kind) is Literal else None
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    metavar = extra.get("metavar")
    return Form(kind, choices, repeated, metavar if isinstance(metavar, str) else None)


def shown_default(default: Any) -> str | None:
    """A default worth printing beside an option's help: not a switch's, an empty list or None."""
    if default is None or isinstance(default, bool) or default == ():
        return None
    return ", ".join(map(str, default)) if isinstance(default, tuple) else str(default)


def flag(name: str, default: Any = None) -> str:
    """The command-line flag of option ``name``."""
    return ("--no-" if default is True else "--") + name.replace("_", "-")


class PluginOptions(BaseModel):
    """The options of one plug-in (none, unless a subclass declares fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def parse(cls, values: Mapping[str, Any], owner: str) -> Self:
        """The options ``values`` gives (by field name), checked; a bad one is refused naming its flag,
        ``owner`` (the plug-in) and what it takes."""
        try:
            return cls.model_validate(dict(values))
        except ValidationError as exc:
            error = exc.errors()[0]
            name = str(error["loc"][0]) if error["loc"] else ""
            field = cls.model_fields.get(name)
            where = flag(name, field.default if field else None) if name else "options"
            raise InputError(
                f"{where} of {owner}: {error['msg']} (got {error.get('input')!r})",
                f"{where}: {field.description}" if field and field.description else f"see deploy --help for {owner}",
            ) from None
