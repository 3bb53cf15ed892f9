"""Reading and tidying an ONNX graph's wiring: who reads a tensor, what a tensor depends on, and
weights written as Constant nodes moved where every tool looks for them."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

import onnx


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes that read it."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for tensor in node.input:
            readers.setdefault(tensor, []).append(node)
    return readers


def upstream(graph: onnx.GraphProto, tensors: Sequence[str]) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` that ``tensors`` depend on, in graph order."""
    needed = set(tensors)
    nodes = []
    for node in reversed(graph.node):
        if needed.intersection(node.output):
            nodes.append(node)
            needed |= names_read([node])
    return nodes[::-1]


def cut(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[str],
) -> onnx.ModelProto:
    """A model of ``nodes`` alone, fed ``inputs`` and answering ``outputs`` (undeclared: a runtime
    infers their types), with the initializers they read or name (an input's initializer stays its
    default: an optional input stays optional)."""
    needed = names_read(nodes) | {i.name for i in inputs} | set(outputs)
    part = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    part.graph.name = model.graph.name
    part.graph.node.extend(nodes)
    part.graph.input.extend(inputs)
    part.graph.initializer.extend(i for i in model.graph.initializer if i.name in needed)
    part.graph.output.extend(onnx.ValueInfoProto(name=t) for t in dict.fromkeys(outputs))
    return part


def bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds: an If's branches, a Loop's or Scan's body."""
    return [graph for a in node.attribute for graph in ([a.g] if a.HasField("g") else list(a.graphs))]


def names_read(nodes: Sequence[onnx.NodeProto]) -> set[str]:
    """Every tensor name ``nodes`` read, inside their subgraphs too (If/Loop/Scan bodies may read
    the enclosing graph's tensors without listing them as inputs)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for body in bodies(node):
            names |= names_read(body.node)
    return names


def weight_names(graph: onnx.GraphProto) -> set[str]:
    """The tensors of ``graph`` that hold weights: its initializers and its Constant nodes' outputs."""
    return {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}


def operator_list(graph: onnx.GraphProto, leaving: AbstractSet[str] = frozenset()) -> str:
    """The operator types of ``graph`` for a message (domain-qualified, at most 12), but ``leaving``."""
    found = sorted({f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in graph.node} - leaving)
    return ", ".join(found[:12]) + (", ..." if len(found) > 12 else "")


def counted(kinds: list[str]) -> str:
    """``["grouped convolution", "grouped convolution"]`` as "2 grouped convolution": each kind with its count."""
    return ", ".join(f"{kinds.count(kind)} {kind}" for kind in sorted(set(kinds)))


def branch_layers(graph: onnx.GraphProto, ops: set[str], weights: frozenset[str] = frozenset()) -> list[str]:
    """The ``ops`` nodes fed by a weight inside ``graph``'s control flow (If branches, Loop and Scan
    bodies, at any depth), as ``op_type in NodeType``: layers that the quantizer and the pruners,
    which edit the top-level graph, do not reach (Silero VAD keeps its Conv and LSTM layers in If
    branches). ``weights``: the enclosing graphs' initializers and constants, which a body may read."""
    weights = weights | weight_names(graph)
    found: list[str] = []
    for node in graph.node:
        for body in bodies(node):
            inner = weights | weight_names(body)
            found += [
                f"{n.op_type} in {node.op_type}"
                for n in body.node
                if n.op_type in ops and any(i in inner for i in n.input)
            ]
            found += branch_layers(body, ops, weights)
    return found


def control_flow_note(layers: list[str], tool: str) -> str:
    """The words for weighted layers that only control flow holds (``branch_layers``), or nothing."""
    if not layers:
        return ""
    return f"; its weighted layers ({counted(layers)}) sit inside control-flow branches, which {tool} does not enter"


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Move top-level ``Constant`` tensors into initializers, where every tool looks for weights.

    Some exporters (Paddle2ONNX) write every weight as a Constant node: quantizers, pruners and
    converters that read initializers then find none. Returns how many were moved.
    """
    graph, kept, moved = model.graph, [], 0
    for node in graph.node:
        value = next((a for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if (
            node.op_type == "Constant"
            and node.domain in ("", "ai.onnx")
            and value is not None
            and len(node.attribute) == 1
        ):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value.t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
            moved += 1
        else:
            kept.append(node)
    if moved:
        del graph.node[:]
        graph.node.extend(kept)
    return moved
