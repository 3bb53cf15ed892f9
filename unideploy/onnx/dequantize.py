"""ONNX Runtime's dynamic INT8 undone, for the converters that need a float graph.

Many published ONNX files were quantized by ONNX Runtime's ``quantize_dynamic`` (Optimum's
``model_quantized.onnx``, ddddocr's recognizer): int8 weights in ``ConvInteger`` and
``MatMulInteger`` nodes fed by ``DynamicQuantizeLinear``, and com.microsoft's
``DynamicQuantizeLSTM``. ONNX Runtime runs them as they are; onnx2tf and the MindSpore rebuild
know none of them. Their float equivalent keeps the weights exactly (each int8 weight minus its
zero point, times its scale: what ONNX Runtime multiplies by) and the float bias the quantizer
kept beside its run-time int32 copy; it differs from the model as brought only where ONNX Runtime
rounds activations to 8 bits at run time, which the accuracy guard measures.

Int8 *weights* alone are undone too: a graph whose every ``DequantizeLinear`` reads constants and
that quantizes no activation (a TFLite model with int8 weights, "dynamic range", as tf2onnx writes
it: fer's expression classifier) is the float graph with those constants folded into float
weights, the values the model multiplies by, and no activation ever rounded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from unideploy.errors import ExportError
from unideploy.onnx.files import save_model
from unideploy.onnx.graph import consumers, names_read, upstream

# The dynamic INT8 operators rewritten as float (the DynamicQuantizeLinear feeding one goes with it).
_REWRITTEN = ("ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM")
_LSTM_ATTRIBUTES = (
    "activation_alpha",
    "activation_beta",
    "activations",
    "clip",
    "direction",
    "hidden_size",
    "input_forget",
)
_BIAS_STEPS = ("Reshape", "Cast", "Floor", "Round")  # the bias divided by the accumulator's scale, rounded, reshaped


def dynamic_int8_ops(model: onnx.ModelProto) -> list[str]:
    """The INT8 operators ``dequantized`` makes float in ``model``: dynamic INT8's, and the
    ``DequantizeLinear`` of int8 weights (none: it is float as far as this module goes)."""
    return sorted({n.op_type for n in model.graph.node if n.op_type in _REWRITTEN}) + (
        ["DequantizeLinear"] if _weight_dequantizers(model.graph) else []
    )


def rounds_activations(undone: Sequence[str]) -> bool:
    """Whether the float graph ``dequantized`` made of these operators can answer otherwise than
    the model: dynamic INT8 rounds activations to 8 bits at run time, which the float graph no
    longer does (so what is made from it is judged by the accuracy guard); int8 weights alone fold
    exactly (so it is held to the exact tolerance)."""
    return any(op != "DequantizeLinear" for op in undone)


def _weight_dequantizers(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The ``DequantizeLinear`` nodes of a graph with int8 weights and float activations: each
    reading constants only, and no tensor quantized at run time (where one is, the graph computes
    in int8 and folding its weights would not make it float: none)."""
    constants = {i.name for i in graph.initializer}
    found = [n for n in graph.node if n.op_type == "DequantizeLinear"]
    if any(n.op_type == "QuantizeLinear" for n in graph.node) or any(
        i and i not in constants for n in found for i in n.input
    ):
        return []
    return found


def _folded(node: onnx.NodeProto, lookup: _Graph) -> onnx.TensorProto:
    """A constant ``DequantizeLinear``'s float result as a weight, computed by ONNX's reference
    implementation of the operator (per-tensor, per-axis and blocked scales alike)."""
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph(
        [node],
        "fold",
        [],
        [helper.make_tensor_value_info(node.output[0], TensorProto.UNDEFINED, None)],
        [lookup.constants[i] for i in node.input if i],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx.defs.onnx_opset_version())])
    (value,) = ReferenceEvaluator(model).run(None, {})
    return numpy_helper.from_array(np.asarray(value), node.output[0])


class _Graph:
    """Lookups over one graph: who makes a tensor, who reads it, its constant value."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.producer = {out: node for node in graph.node for out in node.output}
        self.readers = consumers(graph)
        self.constants = {i.name: i for i in graph.initializer}

    def value(self, name: str) -> np.ndarray | None:
        return numpy_helper.to_array(self.constants[name]) if name in self.constants else None

    def only_reader(self, tensor: str, op_type: str, node: onnx.NodeProto) -> onnx.NodeProto:
        readers = self.readers.get(tensor, [])
        if len(readers) != 1 or readers[0].op_type != op_type:
            raise _unmatched(node, f"its result goes to {[r.op_type for r in readers] or 'nothing'}, not one {op_type}")
        return readers[0]


def _unmatched(node: onnx.NodeProto, why: str) -> ExportError:
    return ExportError(
        f"the model's ONNX Runtime INT8 node '{node.name or node.output[0]}' ({node.op_type}) is not laid out as "
        f"quantize_dynamic writes it, so it cannot be turned back into float for this target: {why}",
        "convert the float model (before quantization) for this target; --target cpu keeps the ONNX as it is",
    )


def float_onnx(path: Path, work: Path, say: Callable[[str], None]) -> tuple[Path, list[str]]:
    """``path`` for a converter that needs float operators: as it is, or, where ONNX Runtime's
    dynamic INT8 is in it, a dequantized copy in ``work``; and the operators undone."""
    model = onnx.load(str(path))
    undone = dynamic_int8_ops(model)
    if not undone:
        return path, []
    say(f"turning the model's INT8 ({', '.join(undone)}) back into float operators to convert it")
    out = work / "dequantized.onnx"
    save_model(dequantized(model), out)
    return out, undone


def dequantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float copy of ``model`` with every dynamic INT8 node replaced by its float operator."""
    lookup = _Graph(model.graph)
    replacements: dict[str, list[onnx.NodeProto]] = {}  # first output of a replaced node -> the float nodes
    weights: list[onnx.TensorProto] = []
    for node in model.graph.node:
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            floats, chain = _linear(node, lookup, weights)
            replacements.update({step.output[0]: [] for step in chain})
            replacements[node.output[0]] = floats
        elif node.op_type == "DynamicQuantizeLSTM":
            replacements[node.output[0]] = [_lstm(node, lookup, weights)]
    for node in _weight_dequantizers(model.graph):
        replacements[node.output[0]] = []
        weights.append(_folded(node, lookup))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        nodes.extend(replacements.get(node.output[0], [node]) if node.output else [node])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(weights)
    kept = upstream(out.graph, [o.name for o in out.graph.output])  # the int8 chains nothing reads any more
    del out.graph.node[:]
    out.graph.node.extend(kept)
    read = names_read(kept) | {i.name for i in out.graph.input} | {o.name for o in out.graph.output}
    unread = [i for i in out.graph.initializer if i.name not in read]
    for tensor in unread:
        out.graph.initializer.remove(tensor)
    return out


def _linear(
    node: onnx.NodeProto, lookup: _Graph, weights: list[onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """ConvInteger/MatMulInteger with its chain (DynamicQuantizeLinear before; the int32 bias Add,
    Cast and scale Mul after) as Conv/MatMul on the float input, ending in the chain's output;
    and the chain's nodes after it, which the float nodes replace."""
    quantizer = lookup.producer.get(node.input[0])
    if quantizer is None or quantizer.op_type != "DynamicQuantizeLinear":
        raise _unmatched(node, "its input is not quantized by a DynamicQuantizeLinear")
    weight = lookup.value(node.input[1])
    if weight is None:
        raise _unmatched(node, "its weight is not a constant")
    zero = lookup.value(node.input[3]) if len(node.input) > 3 and node.input[3] else np.zeros((), weight.dtype)
    if zero is None:
        raise _unmatched(node, "its weight's zero point is not a constant")
    tensor, bias, chain = node.output[0], None, []
    reader = lookup.readers.get(tensor, [])
    if len(reader) == 1 and reader[0].op_type == "Add":  # a bias quantized at run time to the int32 scale
        other = next(t for t in reader[0].input if t != tensor)
        bias = _float_bias(other, lookup, node)
        tensor = reader[0].output[0]
        chain.append(reader[0])
    cast = lookup.only_reader(tensor, "Cast", node)
    scale_mul = lookup.only_reader(cast.output[0], "Mul", node)
    scales = lookup.producer.get(next(t for t in scale_mul.input if t != cast.output[0]))
    if scales is None or scales.op_type != "Mul" or quantizer.output[1] not in scales.input:
        raise _unmatched(node, "its result is not multiplied by the input's scale times the weight's")
    chain += [cast, scale_mul]
    scale = lookup.value(next(t for t in scales.input if t != quantizer.output[1]))
    if scale is None:
        raise _unmatched(node, "its weight's scale is not a constant")
    conv = node.op_type == "ConvInteger"
    per_row = (-1,) + (1,) * (weight.ndim - 1) if conv else (1, -1)  # Conv: per output channel; MatMul: per column
    floats = (weight.astype(np.float64) - zero.reshape(per_row if zero.size > 1 else ())) * scale.reshape(
        per_row if scale.size > 1 else ()
    )
    name = f"{node.input[1]}_dequantized"
    weights.append(numpy_helper.from_array(floats.astype(np.float32), name))
    x, result = quantizer.input[0], scale_mul.output[0]
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    channels = weight.shape[0] if conv else weight.shape[-1]
    if bias is not None and bias.size == channels and (not conv or bias.shape[-2:] in ((1, 1), (channels,))):
        weights.append(numpy_helper.from_array(bias.reshape(channels).astype(np.float32), f"{name}_bias"))
        if conv:
            return [helper.make_node("Conv", [x, name, f"{name}_bias"], [result], name=node.name, **attributes)], chain
        product = f"{result}_product"
        return [
            helper.make_node("MatMul", [x, name], [product], name=node.name),
            helper.make_node("Add", [product, f"{name}_bias"], [result], name=f"{node.name}_bias"),
        ], chain
    if bias is not None:
        raise _unmatched(node, f"its bias of shape {list(bias.shape)} does not match its {channels} outputs")
    return [helper.make_node("Conv" if conv else "MatMul", [x, name], [result], name=node.name, **attributes)], chain


def _float_bias(tensor: str, lookup: _Graph, node: onnx.NodeProto) -> np.ndarray:
    """The float bias behind a run-time int32 bias: Reshape(Cast(Floor(Div(bias, scale)))) read back
    to the Div's constant numerator, in the Reshape's shape."""
    shape = None
    step = lookup.producer.get(tensor)
    while step is not None and step.op_type in _BIAS_STEPS:
        if step.op_type == "Reshape" and shape is None:
            shape = lookup.value(step.input[1])
        step = lookup.producer.get(step.input[0])
    bias = lookup.value(step.input[0]) if step is not None and step.op_type == "Div" else None
    if bias is None:
        raise _unmatched(node, "its int32 bias is not a constant divided by the accumulator's scale")
    return bias.reshape(shape) if shape is not None else bias


def _lstm(node: onnx.NodeProto, lookup: _Graph, weights: list[onnx.TensorProto]) -> onnx.NodeProto:
    """DynamicQuantizeLSTM as the standard LSTM: its weights, stored [directions, input, 4 x hidden]
    in int8, become float in the LSTM's [directions, 4 x hidden, input]."""
    inputs = list(node.input) + [""] * (12 - len(node.input))
    x, w, r, bias, lengths, h0, c0, peepholes, w_scale, w_zero, r_scale, r_zero = inputs
    floats = []
    for tensor, scale, zero in ((w, w_scale, w_zero), (r, r_scale, r_zero)):
        value, s = lookup.value(tensor), lookup.value(scale)
        z = lookup.value(zero) if zero else np.zeros_like(s, dtype=np.int64)
        if value is None or s is None or z is None:
            raise _unmatched(node, f"'{tensor}', its scale or its zero point is not a constant")
        per = (-1, 1, 1) if s.ndim <= 1 else (s.shape[0], 1, -1)  # per direction, or per direction and gate row
        dequantized = (value.astype(np.float64) - z.reshape(per)) * s.reshape(per)
        name = f"{tensor}_dequantized"
        weights.append(numpy_helper.from_array(dequantized.transpose(0, 2, 1).astype(np.float32), name))
        floats.append(name)
    operands = [x, *floats, bias, lengths, h0, c0, peepholes]
    while operands and not operands[-1]:
        operands.pop()
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in _LSTM_ATTRIBUTES}
    return helper.make_node("LSTM", operands, list(node.output), name=node.name, **attributes)
