"""What a generated wrapper needs to know about one model file, independent of the language.

Names come from the package signature (what users already know from ``deploy inspect``); the
model file's own names (a TFLite converter's ``output_0``) are kept beside them so the wrapper
can call the model by its names and hand results back under the package's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from unideploy.errors import InputError
from unideploy.signature import Dim, Signature

# Dtypes every generator can type (both languages have a primitive array for each).
WRAPPABLE_DTYPES = ("float32", "int32", "int64", "uint8", "int8")

# Words that are reserved in Kotlin or Swift: an identifier equal to one gets a suffix.
_RESERVED = {
    "as",
    "break",
    "case",
    "catch",
    "class",
    "continue",
    "default",
    "do",
    "else",
    "enum",
    "extension",
    "false",
    "for",
    "fun",
    "func",
    "if",
    "import",
    "in",
    "init",
    "interface",
    "internal",
    "is",
    "let",
    "nil",
    "null",
    "object",
    "operator",
    "package",
    "private",
    "protocol",
    "public",
    "repeat",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "switch",
    "this",
    "throw",
    "throws",
    "true",
    "try",
    "typealias",
    "val",
    "var",
    "when",
    "where",
    "while",
}


def _camel(name: str) -> str:
    words = [w for w in re.split(r"[^0-9A-Za-z]+", name) if w]
    return "".join(w[0].upper() + w[1:] for w in words)


def identifier(name: str) -> str:
    """lowerCamelCase identifier for a tensor or dimension name (``input_ids`` -> ``inputIds``)."""
    text = _camel(name)
    if not text:
        return "value"
    text = "t" + text if text[0].isdigit() else text[0].lower() + text[1:]
    return text + "Value" if text in _RESERVED else text


def type_name(name: str) -> str:
    """UpperCamelCase type name for a model (``mini-lm`` -> ``MiniLm``, ``3d-unet`` -> ``Model3dUnet``)."""
    text = _camel(name) or "Model"
    return "Model" + text if text[0].isdigit() else text


@dataclass(frozen=True)
class WrappedTensor:
    name: str  # in the package signature
    model_name: str  # in the model file
    ident: str
    dtype: str
    shape: tuple[Dim, ...]  # in the model file's layout
    layout: str | None = None

    def describe(self) -> str:
        """``ident: dtype [dims]`` and, for a channels-last input, what that asks of the caller."""
        note = " (channels last: move the channel axis of NCHW data to the end)" if self.layout == "NHWC" else ""
        return f"{self.ident}: {self.dtype} [{', '.join(str(d) for d in self.shape)}]{note}"


@dataclass(frozen=True)
class WrappedState:
    """A streaming model's state pair, as the wrappers carry it: the input, the output that feeds it
    on the next call, its value at the start, and its element count (dynamic dims at 1: one stream)."""

    input: WrappedTensor
    output: WrappedTensor
    initial: float

    @property
    def field(self) -> str:
        """The wrapper's property holding it (``carried<Input>``: no clash with the class's own)."""
        return "carried" + self.input.ident[0].upper() + self.input.ident[1:]

    @property
    def count(self) -> int:
        count = 1
        for dim in self.input.shape:
            count *= dim if isinstance(dim, int) else 1
        return count


@dataclass(frozen=True)
class Wrapped:
    """One generated class: a runtime ("tflite" or "onnxruntime") over one model file."""

    type_name: str  # the model's type name: classes are <type_name>Tflite, <type_name>Ort
    runtime: str
    model_file: str
    inputs: tuple[WrappedTensor, ...]
    outputs: tuple[WrappedTensor, ...]
    signature_key: str | None = None  # TFLite signature the wrapper calls
    state: tuple[WrappedState, ...] = ()  # a streaming model's: carried by ``step``

    @property
    def dims(self) -> list[str]:
        """Dynamic dimension names, in first-use order: each becomes a parameter of ``run``."""
        seen: list[str] = []
        for tensor in self.inputs:
            seen += [d for d in tensor.shape if isinstance(d, str) and d not in seen]
        return seen

    @property
    def stream_inputs(self) -> list[WrappedTensor]:
        """The inputs ``step`` takes: all but the state."""
        carried = {pair.input.name for pair in self.state}
        return [t for t in self.inputs if t.name not in carried]

    @property
    def step_arguments(self) -> list[tuple[str, str]]:
        """``run``'s parameters, each with what ``step`` passes it: its own parameter of the same
        name, the state's property, or 1 for a dim the state fixes."""
        fields = {pair.input.name: pair.field for pair in self.state}
        found = [(t.ident, fields.get(t.name, t.ident)) for t in self.inputs]
        return found + [(identifier(d), identifier(d) if d in self.stream_dims else "1") for d in self.dims]

    @property
    def stream_dims(self) -> list[str]:
        """The dynamic dims ``step`` takes: those no state input has (a stream's state is one row)."""
        fixed = {d for pair in self.state for d in pair.input.shape if isinstance(d, str)}
        return [d for d in self.dims if d not in fixed]


def state_lines(model: Wrapped, filled: Callable[[WrappedState], str]) -> tuple[str, str, str]:
    """A streaming model's state in a wrapper, as Kotlin and Swift both write it: the properties'
    declarations, their resets to the initial values (``filled`` makes one), and their updates from
    ``run``'s outputs, one line each."""
    declared = "\n".join(f"    private var {pair.field} = {filled(pair)}" for pair in model.state)
    resets = "\n".join(f"        {pair.field} = {filled(pair)}" for pair in model.state)
    updates = "\n".join(f"        {pair.field} = outputs.{pair.output.ident}" for pair in model.state)
    return declared, resets, updates


def wrapped(
    model_name: str,
    runtime: str,
    model_file: str,
    signature: Signature,
    output_names: dict[str, str] | None = None,
    signature_key: str | None = None,
) -> Wrapped:
    """Describe a model file for the generators; ``output_names`` maps the file's names to the package's."""
    for spec in (*signature.inputs, *signature.outputs):
        if spec.dtype not in WRAPPABLE_DTYPES:
            raise InputError(
                f"tensor '{spec.name}' is {spec.dtype}; mobile wrappers type {', '.join(WRAPPABLE_DTYPES)}",
                "export the model with inputs and outputs of one of those dtypes",
            )
    by_package = {v: k for k, v in (output_names or {}).items()}
    inputs = tuple(
        WrappedTensor(t.name, t.name, identifier(t.name), t.dtype, t.shape, t.layout) for t in signature.inputs
    )
    outputs = tuple(
        WrappedTensor(t.name, by_package.get(t.name, t.name), identifier(t.name), t.dtype, t.shape)
        for t in signature.outputs
    )
    by_name = {t.name: t for t in (*inputs, *outputs)}
    state = tuple(WrappedState(by_name[p.input], by_name[p.output], p.initial) for p in signature.state)
    model = Wrapped(type_name(model_name), runtime, model_file, inputs, outputs, signature_key, state)
    idents = [t.ident for t in inputs] + [identifier(d) for d in model.dims]
    if len(set(idents)) != len(idents) or len({t.ident for t in outputs}) != len(outputs):
        raise InputError(
            f"tensor names {signature.input_names + signature.output_names} do not give distinct "
            "identifiers in Kotlin and Swift",
            "re-export with distinct tensor names",
        )
    return model
