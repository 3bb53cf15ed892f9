"""Read a .mindir file into plain Python: inputs, parameters, constants and primitive calls.

The file is parsed with the protobuf schema MindSpore ships (``mindspore.train.mind_ir_pb2``);
nothing is executed. Operator attributes live in two places: ``PRIMITIVE`` calls carry them on the
primitive (Conv2D's pad_list, MaxPool's strides), ``PRIMITIVE_FUNCTION`` calls pass them as
constant inputs (MatMul's transpose flags, BatchNorm's epsilon). The translator sees both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line

# mind_ir TensorProto.DataType -> numpy
TENSOR_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    17: "float64",
}


class Monad:
    """MindSpore's side-effect token (UMonad/IOMonad): ordering only, no data."""


MONAD = Monad()
UNKNOWN_RANK = (-2,)  # MindSpore's recorded shape of a tensor whose rank its shape inference lost


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 where dynamic; UNKNOWN_RANK where MindSpore's inference lost the rank
    ref: str = ""  # the full name calls use to refer to it


@dataclass
class Call:
    """One primitive application: ``output = op(*inputs)``."""

    op: str
    name: str
    inputs: list[str]
    output: str
    attrs: dict[str, Any]  # the primitive's own attributes (PRIMITIVE calls)
    out: list[TensorInfo]  # the output's recorded dtype and shape (several for tuple outputs)


@dataclass
class MindIRGraph:
    producer: str
    inputs: list[TensorInfo]
    outputs: list[str]  # value names
    output_infos: list[TensorInfo]
    parameters: dict[str, np.ndarray]
    constants: dict[str, Any]
    calls: list[Call] = field(default_factory=list)
    subgraph_calls: list[str] = field(default_factory=list)  # ops that call nested graphs (control flow)
    nested_graphs: list[str] = field(default_factory=list)  # graphs chosen while running (Switch, Partial)
    primitives: list[str] = field(default_factory=list)  # op types of every primitive the file defines


def short_name(name: str) -> str:
    """'44_1___main___CNN_construct_18:conv1.weight' -> 'conv1.weight'."""
    return name.rsplit(":", 1)[-1] if ":" in name else name


def tensor_value(proto: Any) -> np.ndarray:
    dtype = TENSOR_DTYPES.get(proto.data_type)
    if dtype is None:
        raise ExportError(f"MindIR tensor '{proto.name}' has a data type ({proto.data_type}) unideploy cannot read")
    if proto.HasField("external_data"):
        raise ExportError(
            f"MindIR tensor '{proto.name}' keeps its data in an external file",
            "export the model with its weights inside the .mindir (models under 1 GB)",
        )
    shape = tuple(int(d) for d in proto.dims)
    if proto.raw_data:
        array = np.frombuffer(proto.raw_data, dtype=dtype)
    elif proto.float_data:
        array = np.asarray(proto.float_data, dtype=dtype)
    elif proto.int64_data:
        array = np.asarray(proto.int64_data, dtype=dtype)
    elif proto.int32_data:
        array = np.asarray(proto.int32_data, dtype=dtype)
    else:
        array = np.zeros(0, dtype=dtype)
    if array.size != int(np.prod(shape)):
        raise ExportError(
            f"MindIR tensor '{proto.name}' holds {array.size} values for shape {list(shape)}",
            "the file is truncated or corrupt; export it again",
        )
    return array.reshape(shape).copy()


def tensor_info(name: str, proto: Any) -> TensorInfo:
    return TensorInfo(
        short_name(name),
        TENSOR_DTYPES.get(proto.data_type, f"type{proto.data_type}"),
        tuple(int(d) for d in proto.dims),
        name,
    )


def attribute_value(attr: Any) -> Any:
    """Decode one AttributeProto (scalars, strings, tensors, tuples and lists of them)."""
    from mindspore.train import mind_ir_pb2 as pb

    kind = pb.AttributeProto.AttributeType.Name(attr.type)
    if kind in ("TUPLE", "LIST"):
        return tuple(attribute_value(v) for v in attr.values)
    if kind in ("UMONAD", "IOMONAD"):
        return MONAD
    if kind == "NONE":
        return None
    if kind == "BOOL":
        return bool(attr.i if attr.HasField("i") else attr.ints[0])
    if kind in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"):
        return int(attr.i if attr.HasField("i") else attr.ints[0])
    if kind in ("FLOAT", "FLOAT16", "BFLOAT16"):
        return float(attr.f if attr.HasField("f") else attr.floats[0])
    if kind == "DOUBLE":
        return float(attr.d if attr.HasField("d") else attr.doubles[0])
    if kind == "STRING":
        raw = attr.s if attr.HasField("s") else attr.strings[0]
        return raw.decode() if isinstance(raw, bytes) else raw
    if kind == "TENSORS":
        values = [tensor_value(t) for t in attr.tensors]
        return values[0] if len(values) == 1 else tuple(values)
    if kind == "TENSOR":
        return tensor_value(attr.t)
    raise ExportError(f"MindIR attribute '{attr.name}' has a kind unideploy cannot read ({kind})")


def _output_infos(value: Any) -> list[TensorInfo]:
    if len(value.tensor):
        return [tensor_info(value.name, value.tensor[0])]
    return [tensor_info(f"{value.name}_{i}", t) for i, t in enumerate(_shape_tensors(value.attr_info))]


def _shape_tensors(attr: Any) -> list[Any]:
    """The recorded output types of a call, flattening tuple outputs (BatchNorm, LayerNorm)."""
    return list(attr.tensors) + [t for value in attr.values for t in _shape_tensors(value)]


def _graph_label(name: str) -> str:
    """A nested graph's readable part: '61_57_✗5↓interpolate_38' -> 'interpolate'."""
    words = [w for w in name.replace("↓", "_").split("_") if w.isidentifier() and not w.startswith(("✓", "✗"))]
    return words[-1] if words else name


def read_mindir(path: Path) -> MindIRGraph:
    from mindspore.train import mind_ir_pb2 as pb

    model = pb.ModelProto()
    try:
        model.ParseFromString(Path(path).read_bytes())
    except Exception as exc:
        raise InputError(
            f"'{path}' is not a readable MindIR file: {first_line(exc)}",
            "export it again with mindspore.export(..., file_format='MINDIR')",
        ) from exc
    if not model.HasField("graph") or not model.graph.output:
        raise InputError(
            f"'{path}' is not a MindIR model (it has no graph)",
            "export it again with mindspore.export(..., file_format='MINDIR')",
        )
    graph = model.graph
    primitives = {p.name: p for p in model.primitives}
    result = MindIRGraph(
        producer=f"{model.producer_name} {model.model_version}".strip(),
        inputs=[tensor_info(i.name, i.tensor[0]) for i in graph.input],
        outputs=[o.name for o in graph.output],
        output_infos=[info for o in graph.output for info in _output_infos(o)],
        parameters={p.name: tensor_value(p) for p in graph.parameter},
        constants={},
        primitives=[p.op_type for p in model.primitives],
    )
    for node in graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant":
            result.constants[node.output[0]] = attribute_value(attrs["value"])
            continue
        if not node.op_type.startswith("REF::"):
            result.subgraph_calls.append(node.op_type)
            continue
        prim = primitives.get(node.op_type[len("REF::") :])
        if prim is None and model.functions:
            # a call of a graph chosen while running (Switch over Partial): nn.Upsample and
            # ops.interpolate branch on whether a dim is known, and keep both branches
            result.nested_graphs = sorted({_graph_label(f.name) for f in model.functions})
            continue
        if prim is None:
            raise InputError(
                f"'{path}' calls primitive '{node.op_type}', which the file does not define",
                "the file is corrupt; export it again",
            )
        shape = attrs.get("shape")
        out = [tensor_info(node.output[0], t) for t in _shape_tensors(shape)] if shape is not None else []
        result.calls.append(
            Call(
                op=prim.op_type,
                name=node.name,
                inputs=list(node.input),
                output=node.output[0],
                attrs={
                    a.name: attribute_value(a) for a in prim.attribute if a.name not in ("input_names", "output_names")
                },
                out=out,
            )
        )
    return result
