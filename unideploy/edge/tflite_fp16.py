"""fp16 TFLite weights that fp16 cannot carry, put back in fp32.

TensorFlow's converter stores every float constant of a ``tflite-fp16`` model in float16 and
dequantizes it when the model loads; the arithmetic stays fp32. Two kinds of constant lose what
the model needs in that rounding, and this module gives them their fp32 values back (the
constant becomes fp32 and its ``DEQUANTIZE`` goes):

- **constants all of whose values are below fp16's normal range** (6.1e-05; below 6e-08 they
  are 0), epsilons rather than weights: Basic Pitch's spectrogram takes ``log(|X|^2 + 1e-10)``,
  the 1e-10 became 0, and every silent bin gave ``log(0)``: all three outputs NaN (a weight
  tensor's few tiny values cost it nothing beside its large ones);
- **the weights of the computation a magnifier reads where it comes down below fp16's range on
  the calibration rows**: ``log x`` and a divisor (``y / x``) turn the relative error of ``x``
  into an absolute one, and a sum that cancels to a small value (a constant-Q transform's bins
  for a narrow-band signal) carries the rounding of its weights as a large relative error. Walked
  back from the magnifier's input through element-wise, data-moving and summing operators to the
  weighted ones (convolutions, fully connected layers) that compute it, whose weights stay fp32
  too: Basic Pitch's constant-Q kernels, 1.3 % off its contour map in fp16 and 0.08 % with them
  in fp32.

The same rule holds an ONNX model's fp16 (``optimizers/quantize_fp16.py``), where the arithmetic
is fp16 too and it is the operators that stay fp32. The fp32 values come from an fp32 conversion
of the same SavedModel: each fp16 constant is matched to the fp32 constant of its shape whose
rounding to fp16 it is (its name decides between equal roundings; a constant matched to none
keeps fp16).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from unideploy.exporters.tflite_flatbuffer import builtin_of, text
from unideploy.onnx.precision import FP16_TINY
from unideploy.quiet import quiet

PROBE_ROWS = 16  # calibration rows the magnifiers' inputs are measured on


def with_fp32_where_needed(
    fp16: bytes, fp32: Callable[[], bytes], rows: Sequence[Mapping[str, np.ndarray]] = ()
) -> tuple[bytes, dict[str, str]]:
    """``fp16`` with the constants described above in fp32, and why each is (constant name ->
    reason; empty: ``fp16`` as it was). ``fp32``: converts the same SavedModel to fp32, called only
    where a constant may need it (one fp16 holds only below its normal range, or the model has a
    magnifier). ``rows``: calibration rows in the model's own layout, each input under the
    interpreter's name for it (none: only the first rule applies)."""
    with quiet():
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(fp16))
    graph = model.subgraphs[0]
    named = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    kinds = [named.get(builtin_of(code), "") for code in model.operatorCodes]  # by an operator's opcodeIndex
    halves = {  # an fp16 constant's fp32 tensor -> its fp16 values, which a DEQUANTIZE turns into it
        int(op.outputs[0]): _constant(model, graph.tensors[int(op.inputs[0])], np.float16)
        for op in graph.operators
        if kinds[op.opcodeIndex] == "DEQUANTIZE"
    }
    dequantized = {t: v for t, v in halves.items() if v is not None}
    flushed = any(float(np.abs(v.astype(np.float32)).max(initial=0.0)) < FP16_TINY for v in dequantized.values())
    magnifiers = any(kinds[op.opcodeIndex] in _MAGNIFIERS for op in graph.operators)
    if not flushed and not (rows and magnifiers):
        return fp16, {}
    originals = _originals(graph, dequantized, flatbuffer_utils.convert_bytearray_to_object(bytearray(fp32())))
    reasons: dict[int, str] = {}
    for tensor, values in originals.items():
        if values.any() and (largest := float(np.abs(values).max())) < FP16_TINY:  # an epsilon, not a weight
            reasons[tensor] = f"holds values up to {largest:.2g}, below fp16's normal range (from {FP16_TINY:.2g})"
    if rows:
        for tensor, (magnifier, least) in _magnified(model, kinds, schema, rows, reasons, originals).items():
            for weight in _upstream_weights(graph, kinds, tensor, dequantized):
                reasons.setdefault(
                    weight,
                    f"computes what the {magnifier} reads, which comes down to {least:.2g} on the calibration rows",
                )
    kept = {i: why for i, why in reasons.items() if i in originals}
    if not kept:
        return fp16, {}
    _restore(model, graph, schema, {i: originals[i] for i in kept})
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model)), {
        text(graph.tensors[i].name): why for i, why in kept.items()
    }


# What a magnifier reads (the input whose relative error becomes the result's absolute error)
_MAGNIFIERS = {"LOG": 0, "DIV": 1}
# Operators whose output is a sum of products of their weights: where the walk back stops
_WEIGHTED = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL", "TRANSPOSE_CONV", "CONV_3D"}
# Operators the walk goes through: element-wise ones, those that only move or pick values, and sums
# (a spectrogram's magnitude sums the squares of its real and imaginary parts)
_THROUGH = {
    "ADD", "SUB", "MUL", "DIV", "SQUARE", "SQRT", "RSQRT", "POW", "ABS", "MAXIMUM", "MINIMUM", "EXP",
    "SQUARED_DIFFERENCE", "RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "CONCATENATION", "SLICE",
    "STRIDED_SLICE", "GATHER", "PAD", "SUM", "MEAN", "SELECT_V2", "CAST", "NEG", "PACK", "UNPACK", "SPLIT",
    "SPLIT_V", "TILE",
}  # fmt: skip


def _constant(model: Any, tensor: Any, dtype: type) -> np.ndarray | None:
    """A constant tensor's values (None: not a constant of that dtype)."""
    data = model.buffers[tensor.buffer].data if tensor.buffer < len(model.buffers) else None
    if data is None or len(data) == 0:
        return None
    values = np.frombuffer(bytes(data), np.uint8)
    if values.size != np.dtype(dtype).itemsize * int(np.prod(tensor.shape if tensor.shape is not None else ())):
        return None
    return values.view(dtype).reshape(tuple(tensor.shape) if tensor.shape is not None else ())


def _originals(graph: Any, dequantized: Mapping[int, np.ndarray], twin: Any) -> dict[int, np.ndarray]:
    """Each fp16 constant's fp32 values in the fp32 ``twin`` (see the module docstring)."""
    found: dict[int, np.ndarray] = {}
    pool = [
        (text(t.name), values)
        for t in twin.subgraphs[0].tensors
        if (values := _constant(twin, t, np.float32)) is not None
    ]
    for tensor, half in dequantized.items():
        matching = [
            (name, v) for name, v in pool if v.shape == half.shape and np.array_equal(v.astype(np.float16), half)
        ]
        named = [v for name, v in matching if name == text(graph.tensors[tensor].name)]
        if len(named) == 1 or len(matching) == 1:
            found[tensor] = named[0] if len(named) == 1 else matching[0][1]
    return found


def _magnified(
    model: Any,
    kinds: Sequence[str],
    schema: Any,
    rows: Sequence[Mapping[str, np.ndarray]],
    restored: Mapping[int, str],
    originals: Mapping[int, np.ndarray],
) -> dict[int, tuple[str, float]]:
    """The tensors a magnifier reads that come down below fp16's normal range on ``rows``: tensor
    -> (the magnifier, the least magnitude). Measured on the model with the first rule's constants
    already in fp32 (a flushed epsilon would read as the 0 it became, not as what fp32 computes)."""
    with quiet():
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
        from tensorflow.lite.tools import flatbuffer_utils

    graph = model.subgraphs[0]
    read = {
        int(op.inputs[_MAGNIFIERS[kind]]): kind.lower()
        for op in graph.operators
        if (kind := kinds[op.opcodeIndex]) in _MAGNIFIERS and len(op.inputs) > _MAGNIFIERS[kind]
    }
    read = {t: kind for t, kind in read.items() if _constant(model, graph.tensors[t], np.float32) is None}
    if not read:
        return {}
    probe = flatbuffer_utils.convert_bytearray_to_object(flatbuffer_utils.convert_object_to_bytearray(model))
    _restore(probe, probe.subgraphs[0], schema, {i: originals[i] for i in restored})
    with quiet():
        interpreter = Interpreter(
            model_content=bytes(flatbuffer_utils.convert_object_to_bytearray(probe)),
            experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
    least = dict.fromkeys(read, np.inf)
    for row in rows[:PROBE_ROWS]:
        details = interpreter.get_input_details()
        for detail in details:
            interpreter.resize_tensor_input(detail["index"], np.shape(row[detail["name"]]))
        interpreter.allocate_tensors()
        for detail in details:
            interpreter.set_tensor(detail["index"], np.asarray(row[detail["name"]], detail["dtype"]))
        interpreter.invoke()
        for tensor in read:
            magnitudes = np.abs(interpreter.get_tensor(tensor).astype(np.float64))
            least[tensor] = min(least[tensor], float(magnitudes.min(initial=np.inf, where=magnitudes > 0)))
    return {t: (read[t], least[t]) for t in read if least[t] < FP16_TINY}


def _upstream_weights(
    graph: Any, kinds: Sequence[str], tensor: int, dequantized: Mapping[int, np.ndarray]
) -> list[int]:
    """The fp16 constants that compute ``tensor``: those read on the way back through ``_THROUGH``'s
    operators, and the weights of the weighted operators where the way stops (anything else stops
    it too, keeping nothing)."""
    producer = {int(out): op for op in graph.operators for out in op.outputs}
    found, pending, seen = [], [tensor], set()
    while pending:
        current = pending.pop()
        if current in seen or current < 0:
            continue
        seen.add(current)
        if current in dequantized:
            found.append(current)
            continue
        op = producer.get(current)
        if op is None:
            continue
        kind = kinds[op.opcodeIndex]
        if kind in _WEIGHTED:
            found.extend(int(i) for i in op.inputs if int(i) in dequantized)
        elif kind in _THROUGH:
            pending.extend(int(i) for i in op.inputs)
    return found


def _restore(model: Any, graph: Any, schema: Any, values: Mapping[int, np.ndarray]) -> None:
    """Make each tensor of ``values`` an fp32 constant holding them, without the DEQUANTIZE that
    made it (what read it reads the constant now), and without the fp16 copy it read where
    nothing else does (the file would otherwise hold both)."""
    for tensor, value in values.items():
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(np.ascontiguousarray(value, np.float32).tobytes(), np.uint8)
        model.buffers.append(buffer)
        graph.tensors[tensor].buffer = len(model.buffers) - 1
    dropped = [op for op in graph.operators if set(map(int, op.outputs)) & set(values)]
    graph.operators = [op for op in graph.operators if op not in dropped]
    read = {int(i) for op in graph.operators for i in op.inputs} | {int(i) for i in graph.outputs}
    for half in {int(op.inputs[0]) for op in dropped} - read:
        graph.tensors[half].buffer = 0  # TFLite's empty buffer: a tensor nothing reads or writes
    held = {int(t.buffer) for g in model.subgraphs for t in g.tensors}
    held |= {int(entry.buffer) for entry in model.metadata or ()}  # the runtime version, the converter's notes
    for index, buffer in enumerate(model.buffers):
        if index and index not in held:
            buffer.data = None
