"""Model signatures: named, typed tensors with named dynamic dimensions.

The signature is the contract every stage checks against: exporters produce it, runtimes validate
each request with it, the server (later) answers metadata from it. Dtypes are numpy names
("float32", "int64", ...) so that they read the same in the manifest and in Python.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from unideploy.errors import InputError, RefusedValues

Dim = int | str  # a fixed size, or the name of a dynamic dimension
BATCH_DIM = "batch"  # what exporters call a dynamic first dimension
CHANNELS_LAST = "NHWC"  # layout tag of an artifact input whose channels moved from axis 1 to the end


def contiguous(array: Any) -> np.ndarray:
    """``array`` in C order with its rank kept: numpy's ``ascontiguousarray`` returns at least one
    dimension, which turned a rank-0 input (a sample rate, a threshold) into shape [1] that the
    signature then refused ("has rank 1, expected rank 0")."""
    return np.require(array, requirements="C")


def as_strings(array: np.ndarray, name: str) -> np.ndarray:
    """A text tensor as numpy unicode, from str, UTF-8 bytes, or objects that are all one of them
    (what ONNX Runtime returns, what a client builds); anything else is refused naming the tensor."""
    if array.dtype.kind == "U":
        return array
    hint = "pass an array of str (numpy dtype 'U', or objects that are all str)"
    try:
        if array.dtype.kind == "S":
            return np.char.decode(array, "utf-8")
        if array.dtype.kind == "O" and all(isinstance(v, str) for v in array.flat):
            return array.astype(str)
        if array.dtype.kind == "O" and all(isinstance(v, bytes) for v in array.flat):
            return np.char.decode(array.astype(bytes), "utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"input '{name}' holds bytes that are not UTF-8 text: {exc}", hint) from exc
    raise InputError(f"input '{name}' has dtype {array.dtype.name}, expected string", hint)


def channels_last(shape: tuple) -> tuple:
    return (shape[0], *shape[2:], shape[1])


def to_channels_last(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(array, 1, -1))


STRING = "string"  # text tensors (ONNX's STRING, the protocol's BYTES), numpy unicode arrays in memory
SUPPORTED_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
    STRING,
)


def normalize_dtype(dtype: Any) -> str:
    """Return the numpy name of ``dtype`` (``string`` for text of any width), refusing types a
    package cannot describe."""
    if isinstance(dtype, str) and dtype == STRING:
        return STRING
    try:
        found = np.dtype(dtype)
    except TypeError as exc:
        raise InputError(f"unknown dtype '{dtype}'", f"use one of: {', '.join(SUPPORTED_DTYPES)}") from exc
    if found.kind in "US":
        return STRING
    name = found.name
    if name not in SUPPORTED_DTYPES:
        raise InputError(f"unsupported dtype '{name}'", f"use one of: {', '.join(SUPPORTED_DTYPES)}")
    return name


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...]
    layout: str | None = None
    # the rows of a table the model looks this input's values up in (token ids into an embedding:
    # ``onnx.interface.table_rows``); values past them are refused before any engine runs
    table_rows: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(self.shape))

    @cached_property
    def np_dtype(self) -> np.dtype:
        return np.dtype(str) if self.dtype == STRING else np.dtype(self.dtype)

    def shape_text(self) -> str:
        return "[" + ", ".join(str(d) for d in self.shape) + "]"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.layout:
            out["layout"] = self.layout
        if self.table_rows:
            out["table_rows"] = self.table_rows
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(data["name"], data["dtype"], tuple(data["shape"]), data.get("layout"), data.get("table_rows"))

    def check_values(self, array: np.ndarray) -> None:
        """Refuse values past ``table_rows`` (ONNX's -rows to rows - 1), naming the input and the first
        such value: ONNX Runtime's CPU kernel refuses them in its own words, its CUDA kernel answers
        zeros for them without a word, TFLite's stops on its bounds check."""
        rows = self.table_rows
        if not rows or array.dtype.kind not in "iu":
            return
        if int(array.min()) < -rows or int(array.max()) >= rows:
            bad = array[(array < -rows) | (array >= rows)].flat[0]
            raise RefusedValues(
                f"input '{self.name}' holds {bad}, past the {rows} rows of the table the model looks it up in "
                f"(it takes 0 to {rows - 1}; ONNX counts -{rows} to -1 from the end)"
            )


@dataclass(frozen=True)
class StateSpec:
    """A streaming model's state: an input that each call's ``output`` feeds back to the next call
    (an LSTM's hidden state, a wake-word model's past features), and the value every element starts
    from. Recorded so that callers need not carry it: ``deploy run`` feeds it back over a file's rows,
    the server keeps it per sequence (Triton's implicit state)."""

    input: str
    output: str
    initial: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial", float(self.initial))

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input, "output": self.output, "initial": self.initial}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StateSpec:
        return cls(data["input"], data["output"], float(data.get("initial", 0.0)))


def _holds(spec: TensorSpec, value: float) -> bool:
    """Whether every element of ``spec`` can start at ``value`` exactly."""
    if spec.dtype == STRING:
        return False
    kind = spec.np_dtype.kind
    if kind == "b":
        return value in (0.0, 1.0)
    if kind in "iu":
        info = np.iinfo(spec.np_dtype)
        return value.is_integer() and info.min <= value <= info.max
    return bool(np.isfinite(spec.np_dtype.type(value)))


def parse_state(text: str) -> StateSpec:
    """Parse ``--state INPUT=OUTPUT[:INITIAL]`` (INITIAL: the value every element starts from, 0 if
    not given)."""
    hint = "write INPUT=OUTPUT or INPUT=OUTPUT:INITIAL, e.g. state=stateN or h0=hn:0"
    pair, _, initial = text.partition(":")
    name, _, output = pair.partition("=")
    if not name or not output:
        raise InputError(f"bad --state '{text}'", hint)
    try:
        start = float(initial) if initial else 0.0
    except ValueError as exc:
        raise InputError(f"bad --state '{text}': its initial value '{initial}' is not a number", hint) from exc
    if not np.isfinite(start):
        raise InputError(f"bad --state '{text}': its initial value must be finite", hint)
    return StateSpec(name.strip(), output.strip(), start)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...] = field(default_factory=tuple)
    state: tuple[StateSpec, ...] = ()  # inputs fed back from outputs (a streaming model's state)
    # a fixed-size artifact's rows lie where its package's do, which its fixed sizes cannot say (a
    # batch-1 TFLite's recurrent state [2, 1, 128] has them on axis 1): ``Manifest.signature_of``
    rows_like: Signature | None = field(default=None, compare=False, repr=False)

    def with_table_rows(self, rows: Mapping[str, int]) -> Signature:
        """This signature with each integer input of ``rows`` checked against its table's rows
        (``TensorSpec.table_rows``)."""
        inputs = tuple(
            replace(t, table_rows=rows[t.name]) if t.name in rows and t.np_dtype.kind in "iu" else t
            for t in self.inputs
        )
        return replace(self, inputs=inputs)

    def with_state(self, state: tuple[StateSpec, ...]) -> Signature:
        """This signature with ``state`` recorded, each pair checked: an input and an output of this
        signature, of one dtype and shape (the output is the next call's input), an input at most
        once, and an initial value the dtype can hold."""
        inputs, outputs = self._inputs_by_name, {t.name: t for t in self.outputs}
        seen: set[str] = set()
        for pair in state:
            spec, out = inputs.get(pair.input), outputs.get(pair.output)
            if spec is None:
                raise InputError(
                    f"state input '{pair.input}' is not an input of the model",
                    f"the model's inputs: {', '.join(self.input_names)}",
                )
            if out is None:
                raise InputError(
                    f"state output '{pair.output}' (for input '{pair.input}') is not an output of the model",
                    f"the model's outputs: {', '.join(self.output_names)}",
                )
            if pair.input in seen:
                raise InputError(f"state input '{pair.input}' is given twice", "pair each state input once")
            seen.add(pair.input)
            if (
                spec.dtype != out.dtype
                or len(spec.shape) != len(out.shape)
                or any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(spec.shape, out.shape))
            ):
                raise InputError(
                    f"state input '{pair.input}' {spec.dtype} {spec.shape_text()} cannot take output "
                    f"'{pair.output}' {out.dtype} {out.shape_text()} back",
                    "pair an input with the output of the same dtype and shape that the model returns for it",
                )
            if not _holds(spec, pair.initial):
                raise InputError(
                    f"state input '{pair.input}' ({spec.dtype}) cannot start from {pair.initial:g}",
                    "give an initial value its dtype holds",
                )
        return Signature(self.inputs, self.outputs, tuple(state))

    def initial_state(self, pair: StateSpec, rows: int) -> np.ndarray:
        """``pair``'s starting value for a call of ``rows`` rows: its input's shape, the batch
        dimension at ``rows`` (any other dynamic one cannot be guessed, and is refused)."""
        spec = self._inputs_by_name[pair.input]
        axis = self.batch_axes.get(pair.input)
        shape = []
        for i, dim in enumerate(spec.shape):
            if isinstance(dim, int):
                shape.append(dim)
            elif i == axis:
                shape.append(rows)
            else:
                raise InputError(
                    f"state input '{pair.input}' has a dynamic dimension '{dim}' {spec.shape_text()}: its "
                    "starting value's size is unknown",
                    f"send '{pair.input}' with the request, or re-export with its size fixed (--input-shape)",
                )
        return np.full(shape, pair.initial, spec.np_dtype)

    @cached_property
    def state_inputs(self) -> dict[str, StateSpec]:
        """The state pairs by input name."""
        return {pair.input: pair for pair in self.state}

    @cached_property
    def state_outputs(self) -> dict[str, StateSpec]:
        """The state pairs by output name (an output each call hands to the next, not to the caller)."""
        return {pair.output: pair for pair in self.state}

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def has_dynamic_batch(self) -> bool:
        return bool(self.inputs) and all(t.shape and isinstance(t.shape[0], str) for t in self.inputs)

    @cached_property
    def batch_dim(self) -> str | None:
        """The batch dimension's name: ``batch`` where an input names a dim so, else the dynamic dim
        at axis 0 of the first input that has one; None where no input has a dynamic dim."""
        named = {d for t in self.inputs for d in t.shape if isinstance(d, str)}
        if BATCH_DIM in named:
            return BATCH_DIM
        return next((t.shape[0] for t in self.inputs if t.shape and isinstance(t.shape[0], str)), None)

    @cached_property
    def batch_axes(self) -> dict[str, int | None]:
        """Each input's batch axis, found by the batch dimension's name (recurrent state laid out as
        ``[layers, batch, hidden]`` has it at axis 1); None for an input without one (a scalar, or a
        table every row shares). A model without a dynamic dim has its rows on axis 0."""
        dim = self.batch_dim
        like = self.rows_like.batch_axes if dim is None and self.rows_like is not None else {}

        def axis(spec: TensorSpec) -> int | None:
            if not spec.shape:
                return None
            if dim is None:
                return like.get(spec.name, 0)
            return spec.shape.index(dim) if dim in spec.shape else None

        return {t.name: axis(t) for t in self.inputs}

    @cached_property
    def output_batch_axes(self) -> dict[str, int | None]:
        """Each output's batch axis, by the batch dimension's name as for the inputs (a recurrent
        model's state ``[layers, batch, hidden]``: axis 1); axis 0 where the output does not name
        it (exporters name output dims their own way), None for a scalar."""
        dim = self.batch_dim
        like = self.rows_like.output_batch_axes if dim is None and self.rows_like is not None else {}
        return {
            t.name: (t.shape.index(dim) if dim is not None and dim in t.shape else like.get(t.name) or 0)
            if t.shape
            else None
            for t in self.outputs
        }

    @property
    def has_dynamic_inputs(self) -> bool:
        """Whether any input dim is dynamic, the batch included."""
        return any(isinstance(d, str) for t in self.inputs for d in t.shape)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }
        if self.state:
            out["state"] = [pair.to_dict() for pair in self.state]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Signature:
        return cls(
            tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
            tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
            tuple(StateSpec.from_dict(s) for s in data.get("state", ())),
        )

    def dim_sizes(self, inputs: Mapping[str, Any]) -> dict[str, int]:
        """The size ``inputs`` (arrays, or anything with a ``shape``) give each named dim, as the
        first input naming it has it."""
        sizes: dict[str, int] = {}
        for spec in self.inputs:
            if spec.name in inputs:
                for dim, size in zip(spec.shape, np.shape(inputs[spec.name])):
                    if isinstance(dim, str):
                        sizes.setdefault(dim, int(size))
        return sizes

    def output_shapes(self, inputs: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """The shape each output will have for ``inputs``, where its dims are fixed or follow the
        inputs' (not where one is the model's own, such as a detector's count)."""
        sizes = self.dim_sizes(inputs)
        return {
            spec.name: tuple(d if isinstance(d, int) else sizes[d] for d in spec.shape)
            for spec in self.outputs
            if all(isinstance(d, int) or d in sizes for d in spec.shape)
        }

    def output_mismatches(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> list[str]:
        """Output dims that contradict the signature: a fixed size that differs, or a named dim
        (``batch``) of another size than the inputs gave it. For engines whose results can come
        back with a stale shape."""
        sizes = self.dim_sizes(inputs)
        wrong = []
        for spec in self.outputs:
            value = outputs.get(spec.name)
            if value is None:
                continue
            expected = tuple(sizes.get(d, "?") if isinstance(d, str) else d for d in spec.shape)
            if len(expected) != value.ndim or any(e != "?" and e != got for e, got in zip(expected, value.shape)):
                wrong.append(f"'{spec.name}' has shape {tuple(value.shape)}, expected {expected}")
        return wrong

    def validate_inputs(self, inputs: Mapping[str, Any], unread: Collection[str] = ()) -> dict[str, np.ndarray]:
        """Check named inputs against the signature and return them as numpy arrays.

        Runtimes call this before touching their engine, so a bad request fails with a message
        naming the tensor instead of crashing inside native code. A dynamic dimension named in
        several inputs must have one size across them (e.g. ``batch``). Values are checked where
        the signature knows their range (``TensorSpec.table_rows``), but for ``unread`` inputs,
        stand-ins whose bytes are still in a client's shared memory.
        """
        expected = self._inputs_by_name
        if len(inputs) != len(expected) or any(n not in expected for n in inputs):
            self._refuse_names(inputs)
        arrays: dict[str, np.ndarray] = {}
        bound: dict[str, tuple[int, str]] = {}
        for name, spec in expected.items():
            value = inputs[name]
            try:
                array = np.asarray(value)
            except (ValueError, TypeError) as exc:
                raise InputError(f"input '{name}' is not a tensor: {exc}") from exc
            if spec.dtype == STRING:
                array = as_strings(array, name)
            elif array.dtype != spec.np_dtype:
                given = STRING if array.dtype.kind in "US" else array.dtype.name
                raise InputError(
                    f"input '{name}' has dtype {given}, expected {spec.dtype}",
                    f"cast it, e.g. array.astype('{spec.dtype}')",
                )
            if array.ndim != len(spec.shape):
                raise InputError(
                    f"input '{name}' has rank {array.ndim} (shape {list(array.shape)}), "
                    f"expected rank {len(spec.shape)} {spec.shape_text()}"
                )
            for axis, (size, dim) in enumerate(zip(array.shape, spec.shape)):
                if isinstance(dim, int):
                    if size != dim:
                        raise InputError(
                            f"input '{name}' has size {size} on axis {axis}, expected {dim} "
                            f"(shape {list(array.shape)} vs {spec.shape_text()})"
                        )
                elif dim in bound and bound[dim][0] != size:
                    other_size, other = bound[dim]
                    raise InputError(
                        f"dimension '{dim}' is {size} in input '{name}' but {other_size} in input '{other}'",
                        "inputs sharing a dynamic dimension must agree on its size",
                    )
                else:
                    bound.setdefault(dim, (size, name))
            if array.size == 0:
                raise InputError(f"input '{name}' is empty (shape {list(array.shape)})")
            if name not in unread:
                spec.check_values(array)
            arrays[name] = contiguous(array)
        return arrays

    @cached_property
    def _inputs_by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.inputs}

    def _refuse_names(self, inputs: Mapping[str, Any]) -> None:
        expected = self._inputs_by_name
        unknown = sorted(set(inputs) - set(expected))
        missing = [n for n in expected if n not in inputs]
        if unknown:
            raise InputError(
                f"unknown input(s) {', '.join(repr(n) for n in unknown)}",
                f"the model expects: {', '.join(self.input_names)}",
            )
        if missing:
            raise InputError(
                f"missing input(s) {', '.join(repr(n) for n in missing)}",
                f"the model expects: {', '.join(self.input_names)}",
            )


_SHAPE_ITEM = re.compile(r"^(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)=)?(?P<size>\d+)$")


@dataclass(frozen=True)
class InputShape:
    """One ``--input-shape`` item: example sizes plus the dimensions the user named dynamic."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dim_names: dict[int, str]


def parse_input_shape(text: str) -> InputShape:
    """Parse ``NAME:DIMS[:DTYPE]``.

    DIMS are separated by ``x`` or ``,``; a dim written ``seq=128`` is dynamic, named ``seq``,
    with 128 as the example size (use ``,`` as the separator when a name contains an ``x``).
    Examples: ``x:1x3x224x224``, ``ids:1,seq=128:int64``.
    """
    hint = "write NAME:DIMS[:DTYPE], e.g. x:1x3x224x224 or input_ids:1,seq=128:int64"
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise InputError(f"bad --input-shape '{text}'", hint)
    name, dims_text = parts[0], parts[1]
    dtype = normalize_dtype(parts[2]) if len(parts) == 3 else "float32"
    items = dims_text.split(",") if "," in dims_text else dims_text.split("x")
    shape: list[int] = []
    dim_names: dict[int, str] = {}
    for axis, item in enumerate(items):
        match = _SHAPE_ITEM.match(item.strip())
        if not match or int(match["size"]) <= 0:
            raise InputError(f"bad dimension '{item}' in --input-shape '{text}'", hint)
        shape.append(int(match["size"]))
        if match["name"]:
            dim_names[axis] = match["name"]
    return InputShape(name, tuple(shape), dtype, dim_names)


def _kind_of(value_type: Any) -> str:
    """What an ONNX value that is not a tensor is, in words."""
    which = value_type.WhichOneof("value")
    if which == "sequence_type" and value_type.sequence_type.elem_type.WhichOneof("value") == "map_type":
        return "a sequence of maps, not a tensor"
    return f"a {which.removesuffix('_type')}, not a tensor" if which else "not a typed tensor"


def _non_tensor_hint(value_type: Any) -> str:
    if value_type.WhichOneof("value") == "sequence_type":  # scikit-learn's ZipMap: one dict per row
        return (
            "if it is scikit-learn's ZipMap (class probabilities as dicts), convert without it: skl2onnx's "
            "to_onnx(model, X, options={id(model): {'zipmap': False}}) gives a [rows, classes] tensor"
        )
    return "only tensor inputs and outputs can be served: make the model return tensors"


def signature_from_onnx(model: Any) -> Signature:
    """Read the signature of an ONNX ModelProto (graph inputs minus initializers)."""
    from onnx import TensorProto, helper

    initializers = {init.name for init in model.graph.initializer}
    channels_first = {n.input[0] for n in model.graph.node if n.op_type in _CHANNELS_FIRST_OPS and n.input}

    def spec(value: Any) -> TensorSpec:
        ttype = value.type.tensor_type
        if not value.type.HasField("tensor_type") or ttype.elem_type == 0:
            raise InputError(f"ONNX value '{value.name}' is {_kind_of(value.type)}", _non_tensor_hint(value.type))
        dtype = STRING if ttype.elem_type == TensorProto.STRING else helper.tensor_dtype_to_np_dtype(ttype.elem_type)
        dims: list[Dim] = []
        if not ttype.HasField("shape"):
            raise InputError(f"ONNX value '{value.name}' has no shape", "re-export the model with shape information")
        for axis, d in enumerate(ttype.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.dim_param.isascii() and d.dim_param.isdigit():  # torch.export writes constant dims as "3"
                dims.append(int(d.dim_param))
            else:  # a name, an expression, -1 or 0, or nothing: dynamic (readable names: exporters/shapes.py)
                named = d.dim_param if any(c.isalnum() for c in d.dim_param) else ""  # Paddle writes "?"
                dims.append(dim_identifier(named) or unnamed_dim(value.name, axis))
        layout = _CHANNELS_FIRST_LAYOUTS.get(len(dims)) if value.name in channels_first else None
        return TensorSpec(value.name, normalize_dtype(dtype), tuple(dims), layout)

    return Signature(
        tuple(spec(v) for v in model.graph.input if v.name not in initializers),
        tuple(spec(v) for v in model.graph.output),
    )


# ONNX defines these operators on channels-first data, so an input feeding one directly has a
# known layout (what the edge target needs to know before converting to NHWC).
_CHANNELS_FIRST_OPS = {
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "BatchNormalization",
    "InstanceNormalization",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "LpPool",
}
_CHANNELS_FIRST_LAYOUTS = {3: "NCW", 4: "NCHW", 5: "NCDHW"}


def default_output_names(count: int) -> list[str]:
    """Names for outputs a model leaves unnamed: ``output``, or ``output_0``, ``output_1``, ..."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def dim_identifier(text: str) -> str:
    """A dynamic dimension's name made an identifier, as the manifest schema requires: other
    characters become underscores, and a leading digit gets ``d_``; empty where nothing is left."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_")
    return f"d_{name}" if name[:1].isdigit() else name


def undeclared_dim(tensor: str, axis: int) -> str:
    """A dynamic dim whose size its model leaves open: the batch on axis 0, else unnamed (every
    exporter reads a model's -1 or None this way)."""
    return BATCH_DIM if axis == 0 else unnamed_dim(tensor, axis)


def unnamed_dim(tensor: str, axis: int) -> str:
    """The name of a dynamic dim its model leaves unnamed (every exporter's; ``--input-shape`` and
    ``exporters/shapes.py`` may give it a better one)."""
    return dim_identifier(f"{tensor}_dim{axis}")
