"""What an ONNX graph computes in, read from its operators and weights.

A model brought as an ``.onnx`` file may already be reduced: Optimum's ``model_quantized.onnx``
and ddddocr's recognizer hold ONNX Runtime's dynamic INT8 (``ConvInteger``, ``MatMulInteger``),
a QDQ export holds ``QuantizeLinear``/``DequantizeLinear``, a ``model_fp16.onnx`` keeps its
weights in float16. Its artifact is named and judged by what it computes in (``onnx-int8``,
``onnx-fp16``), not by the format it came in, so that no later stage quantizes it again or labels
a run fp32 that was not.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import onnx

from unideploy.onnx.graph import bodies

if TYPE_CHECKING:
    from unideploy.package.manifest import Precision

# Below it fp16 keeps fewer bits, below 6e-08 none: what an fp16 model (ONNX's or TFLite's) keeps
# in fp32 where a log, a reciprocal or a divisor would magnify the loss (6.1e-05)
FP16_TINY = float(np.finfo(np.float16).tiny)

# ONNX Runtime's dynamic INT8: activations quantized at run time, by operators TensorRT cannot take.
DYNAMIC_INT8_OPS = {
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "MatMulInteger",
    "ConvInteger",
    "DynamicQuantizeLSTM",
}
# Operators whose presence shows that quantization happened.
INT8_OPS = {"QuantizeLinear", "QLinearConv", "QLinearMatMul"} | DYNAMIC_INT8_OPS - {"DynamicQuantizeLSTM"}
# Operators that take or make quantized tensors: a model holding them was quantized already.
QUANTIZED_OPS = (
    INT8_OPS
    | DYNAMIC_INT8_OPS
    | {
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QAttention",
        "DequantizeLinear",
    }
)
_FLOATS: dict[int, Precision] = {
    onnx.TensorProto.FLOAT: "fp32",
    onnx.TensorProto.FLOAT16: "fp16",
    onnx.TensorProto.BFLOAT16: "bf16",
}


def quantized_ops(graph: onnx.GraphProto) -> list[str]:
    """The operators on quantized tensors that ``graph`` holds, in its control flow too."""
    found = {n.op_type for n in graph.node if n.op_type in QUANTIZED_OPS}
    for node in graph.node:
        for body in bodies(node):
            found.update(quantized_ops(body))
    return sorted(found)


def _float_weights(graph: onnx.GraphProto, counts: dict[Precision, int]) -> dict[Precision, int]:
    """Weight elements per float type, in ``graph`` and its bodies (sizes from the dims: the
    weights may lie in external data that is not loaded)."""
    tensors = list(graph.initializer) + [
        a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.HasField("t")
    ]
    for tensor in tensors:
        if tensor.data_type in _FLOATS:
            kind = _FLOATS[tensor.data_type]
            counts[kind] = counts.get(kind, 0) + math.prod(tensor.dims)
    for node in graph.node:
        for body in bodies(node):
            _float_weights(body, counts)
    return counts


def graph_precision(model: onnx.ModelProto) -> Precision:
    """int8 where the graph holds quantized operators; otherwise the float type most of its weight
    elements have (fp16 or bf16 for a converted model, whose few fp32 weights are kept on purpose);
    fp32 for a graph without float weights."""
    if quantized_ops(model.graph):
        return "int8"
    counts = _float_weights(model.graph, {})
    return max(counts, key=lambda p: counts[p]) if counts else "fp32"


# Values with a mantissa bit set below which a float32 weight's low bits are read as unused: fewer
# (a bias of a few values, powers of two) say nothing about the precision it was trained or shipped in
MANTISSA_EVIDENCE = 64


def unused_mantissa_bits(weights: np.ndarray) -> int:
    """How many low mantissa bits every value of a float32 tensor leaves zero: 13 for fp16 values
    held in fp32 (a MediaPipe model shipped as a TFLite fp16 file), 16 for bfloat16's, 0 for a
    weight trained in fp32. 0 where fewer than ``MANTISSA_EVIDENCE`` values have any bit set."""
    bits = np.ascontiguousarray(weights, np.float32).view(np.uint32) & np.uint32(0x7FFFFF)
    bits = bits[bits != 0]
    if bits.size < MANTISSA_EVIDENCE:
        return 0
    lowest = bits & (~bits + np.uint32(1))  # each value's lowest set bit
    return int(lowest.min()).bit_length() - 1


# fp16's: the coarsest rounding ``rounded_like`` makes (at most 2**-11 of a value). Weights whose
# values are coarser still (a fixed filter of small integers, bfloat16's) are not a precision that
# new values can be held to: 2 and 3 are exact in two bits, 2.6 is not near either.
FP16_UNUSED_BITS = 13


def rounded_like(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``values`` as float32 rounded (to nearest, ties to even) to the mantissa ``like`` uses
    (``unused_mantissa_bits``), at most to fp16's (``FP16_UNUSED_BITS``): weights computed anew for
    a layer (a re-fit after pruning) keep the precision of those they replace, so a file that
    compressed well before still does (zeroed weights among full-precision ones compressed worse
    than the fp16-precise original: a pruned MediaPipe selfie segmentation gzipped to 112 % of its
    fp32 file, 85 % rounded)."""
    out = np.ascontiguousarray(values, np.float32)
    unused = min(unused_mantissa_bits(like), FP16_UNUSED_BITS)
    if not unused:
        return out
    bits = out.view(np.uint32)
    tie_to_even = (bits >> np.uint32(unused)) & np.uint32(1)
    bits = (bits + np.uint32((1 << (unused - 1)) - 1) + tie_to_even) & ~np.uint32((1 << unused) - 1)
    return bits.view(np.float32)
