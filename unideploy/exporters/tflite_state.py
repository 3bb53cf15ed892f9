"""A streaming ``.tflite``'s state as inputs and outputs, for tf2onnx and for callers.

A streaming model converted from Keras keeps what it has seen in resource variables: ``VAR_HANDLE``
names one, ``READ_VARIABLE`` gives its value, ``ASSIGN_VARIABLE`` stores the next, and a
``CALL_ONCE`` runs an initializer subgraph that assigns each its starting value on the first call
(microWakeWord's wake-word detectors, which Home Assistant ships, keep six such buffers of past
audio features). ONNX has no variables, and tf2onnx stops on them with "list index out of range".
A copy of the model reads each variable from an input of the variable's name and gives its next
value as an output of that name with ``_next`` after it, as stateless streaming models do (Silero
VAD): the caller feeds each call's ``_next`` outputs back to the next call, starting from the
initializer's values, which the export names in the package's provenance. The copy is checked
against the source on LiteRT, call after call, before anything is converted (``check_unrolled``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError
from unideploy.exporters.tflite_flatbuffer import builtin_of, text
from unideploy.quiet import quiet

NEXT = "_next"  # an output holding a variable's value for the next call: the variable's input name and this
CHECKED_CALLS = 3  # calls the copy and the source are compared over, each state fed back


@dataclass(frozen=True)
class StateVariable:
    """One variable: the input and output names the copy gives it, and its starting value."""

    name: str
    initial: np.ndarray

    @property
    def next_name(self) -> str:
        return self.name + NEXT


def unrolled(src: Path, out: Path) -> list[StateVariable]:
    """Write ``src`` to ``out`` with every resource variable of its main subgraph read from an input
    and written to an output, the initializer subgraph gone; the variables, in input order (none:
    the model keeps no state, and nothing is written)."""
    with quiet():
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(src))
    op = schema.BuiltinOperator
    kind = {i: builtin_of(code) for i, code in enumerate(model.operatorCodes)}
    graph = model.subgraphs[0]
    handles: dict[int, str] = {}  # resource tensor -> variable
    reads: dict[str, int] = {}  # variable -> the tensor its value on entry is read into: an input
    writes: dict[str, int] = {}  # variable -> the tensor its latest value is: an output
    aliases: dict[int, int] = {}  # a later read's tensor -> the tensor holding what it reads
    init_graphs: set[int] = set()
    kept = []
    for node in graph.operators:
        code = kind[node.opcodeIndex]
        if code == op.VAR_HANDLE:
            handles[int(node.outputs[0])] = text(node.builtinOptions.sharedName)
        elif code == op.READ_VARIABLE:
            variable, tensor = handles[int(node.inputs[0])], int(node.outputs[0])
            current = writes.get(variable, reads.get(variable))  # read after a write: the value written
            if current is None:
                reads[variable] = tensor
            else:
                aliases[tensor] = current
        elif code == op.ASSIGN_VARIABLE:
            writes[handles[int(node.inputs[0])]] = int(node.inputs[1])
        elif code == op.CALL_ONCE:
            init_graphs.add(int(node.builtinOptions.initSubgraphIndex))
        else:
            kept.append(node)
    if not handles:
        return []
    for node in kept:
        node.inputs = np.asarray([aliases.get(int(t), int(t)) for t in node.inputs], np.int32)
    graph.outputs = np.asarray([aliases.get(int(t), int(t)) for t in graph.outputs], np.int32)
    variables = sorted(set(handles.values()))
    unread = [v for v in variables if v not in reads or v not in writes]
    if unread:
        raise ExportError(
            f"'{src.name}' holds resource variables that are not both read and written in its main subgraph "
            f"({', '.join(unread)}), which only a stateful runtime can keep",
            "export the model it was converted from, or a version that takes its state as inputs",
        )
    initial = _initial_values(model, schema, kind, init_graphs, src)
    unset = [v for v in variables if v not in initial]
    if unset:
        raise ExportError(
            f"'{src.name}' gives no starting value to its resource variables {', '.join(unset)}, so a caller "
            "could not know what to feed them first",
            "export the model it was converted from, or a version that takes its state as inputs",
        )
    names = _input_names(variables)
    graph.operators = kept
    graph.inputs = np.concatenate([np.asarray(graph.inputs, np.int32), [reads[v] for v in variables]]).astype(np.int32)
    graph.outputs = np.concatenate([np.asarray(graph.outputs, np.int32), [writes[v] for v in variables]]).astype(
        np.int32
    )
    for variable in variables:
        graph.tensors[reads[variable]].name = names[variable].encode()
        graph.tensors[writes[variable]].name = (names[variable] + NEXT).encode()
    for signature in model.signatureDefs or []:
        if signature.subgraphIndex == 0:
            for tensor in signature.outputs:
                tensor.tensorIndex = aliases.get(int(tensor.tensorIndex), int(tensor.tensorIndex))
            signature.inputs += [_signature_tensor(schema, names[v], reads[v]) for v in variables]
            signature.outputs += [_signature_tensor(schema, names[v] + NEXT, writes[v]) for v in variables]
    if len(model.subgraphs) > 1:
        if init_graphs != set(range(1, len(model.subgraphs))):
            raise ExportError(
                f"'{src.name}' holds subgraphs besides its variables' initializer, which the TFLite exporter "
                "cannot convert with its state",
                "export the model it was converted from",
            )
        model.subgraphs = model.subgraphs[:1]
    flatbuffer_utils.write_model(model, str(out))
    return [StateVariable(names[v], initial[v]) for v in variables]


def _input_names(variables: list[str]) -> dict[str, str]:
    """Each variable's input name: its shared name with anything but letters, digits and ``_``
    made ``_`` (``stream_10/states``: ``stream_10_states``), as callers and generated code name it."""
    return {v: re.sub(r"\W", "_", v) for v in variables}


def _initial_values(model: Any, schema: Any, kind: dict[int, int], init_graphs: set[int], src: Path) -> dict[str, Any]:
    """Each variable's starting value, as its initializer subgraph assigns it from a constant."""
    op = schema.BuiltinOperator
    values: dict[str, np.ndarray] = {}
    for index in init_graphs:
        graph = model.subgraphs[index]
        handles: dict[int, str] = {}
        for node in graph.operators:
            code = kind[node.opcodeIndex]
            if code == op.VAR_HANDLE:
                handles[int(node.outputs[0])] = text(node.builtinOptions.sharedName)
                continue
            constant = graph.tensors[int(node.inputs[1])] if code == op.ASSIGN_VARIABLE else None
            if constant is None or model.buffers[constant.buffer].data is None or constant.type not in _NUMPY:
                raise ExportError(
                    f"'{src.name}' starts its state with computed values (operator {code} in subgraph {index}), "
                    "which the TFLite exporter cannot take out of the model",
                    "export the model it was converted from, or a version that takes its state as inputs",
                )
            data, dtype = model.buffers[constant.buffer].data, _NUMPY[constant.type]
            values[handles[int(node.inputs[0])]] = np.frombuffer(bytes(data), dtype).reshape(constant.shape)
    return values


# TFLite's TensorType -> NumPy, for the types a variable's starting value holds
_NUMPY = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 7: np.int16, 9: np.int8}


def _signature_tensor(schema: Any, name: str, index: int) -> Any:
    tensor = schema.TensorMapT()
    tensor.name, tensor.tensorIndex = name.encode(), index
    return tensor


def check_unrolled(src: Path, copy: Path, variables: list[StateVariable], inputs: list[dict[str, Any]]) -> None:
    """Run the source and the copy on LiteRT side by side for ``CHECKED_CALLS`` calls of the same
    inputs (random over each input's range, seeded), the copy fed its ``_next`` outputs back from
    the starting values; refuse the copy unless every output matches exactly (the same kernels)."""
    with quiet():
        from ai_edge_litert.interpreter import Interpreter

        source, unrolled_model = Interpreter(model_path=str(src)), Interpreter(model_path=str(copy))
    source.allocate_tensors()
    unrolled_model.allocate_tensors()
    by_name = {d["name"]: d for d in unrolled_model.get_input_details()}
    state = {v.name: v.initial for v in variables}
    rng = np.random.default_rng(0)
    for call in range(CHECKED_CALLS):
        for details in inputs:
            values = _random_like(rng, details)
            source.set_tensor(details["index"], values)
            unrolled_model.set_tensor(by_name[details["name"]]["index"], values)
        for variable in variables:
            detail = by_name[variable.name]
            unrolled_model.set_tensor(detail["index"], state[variable.name].reshape(detail["shape"]))
        source.invoke()
        unrolled_model.invoke()
        outputs = {d["name"]: d for d in unrolled_model.get_output_details()}
        for got in source.get_output_details():
            if not np.array_equal(
                source.get_tensor(got["index"]), unrolled_model.get_tensor(outputs[got["name"]]["index"])
            ):
                raise ExportError(
                    f"'{src.name}' with its state as inputs and outputs answers otherwise than the model itself "
                    f"on call {call + 1} (output '{got['name']}')",
                    "export the model it was converted from, or a version that takes its state as inputs",
                )
        state = {v.name: unrolled_model.get_tensor(outputs[v.next_name]["index"]) for v in variables}


def _random_like(rng: np.random.Generator, details: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(details["dtype"])
    if np.issubdtype(dtype, np.integer):
        bounds = np.iinfo(dtype)
        return rng.integers(bounds.min, bounds.max, size=details["shape"], endpoint=True).astype(dtype)
    return rng.standard_normal(details["shape"]).astype(dtype)
