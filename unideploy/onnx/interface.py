"""Editing an exported ONNX model's interface: value names and declared dimensions.

Converters name and shape a graph's inputs and outputs their own way (tf2onnx: ``serving_default_x:0``
and ``unk__12``; torch.export: every dim symbolic); the package signature is the contract, so
the model is made to say the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from unideploy.onnx.files import has_external_data
from unideploy.onnx.graph import bodies
from unideploy.signature import Dim, Signature


def opset_of(model: onnx.ModelProto, default: int = 0) -> int:
    """The default-domain opset a model imports (``default`` when it names none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default)


def output_names(path: Path) -> list[str]:
    """The graph's outputs in its own order (a converter may number them by it: onnx2tf's
    SavedModel, ``output_0``, ...), read without its weights."""
    return [value.name for value in onnx.load(str(path), load_external_data=False).graph.output]


def rename_values(model: onnx.ModelProto, mapping: Mapping[str, str]) -> None:
    """Rename tensors everywhere they appear: the graph's inputs, outputs, value infos and weights,
    and every node's inputs and outputs, in control-flow bodies too (which read outer tensors by
    name)."""
    _rename_in(model.graph, mapping)


def _rename_in(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        value.name = mapping.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for body in bodies(node):
            _rename_in(body, mapping)


def set_io_dims(model: onnx.ModelProto, dims: Mapping[str, Sequence[Dim]]) -> None:
    """Declare each named input's/output's dimensions: ints fixed, strings named dynamic."""
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name not in dims:
            continue
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        for d in dims[value.name]:
            dim = shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = int(d)


def declare_signature(path: Path, signature: Signature) -> None:
    """Make the ONNX file at ``path`` declare the package signature's dims.

    Weights in external files stay where they are (only the graph is rewritten). Where a dim that
    was dynamic is now fixed, shapes are inferred again so the fixed sizes reach every tensor
    (TensorRT and onnx2tf read them).
    """
    model = onnx.load(str(path), load_external_data=False)
    declared = {t.name: t.shape for t in signature.inputs + signature.outputs}
    before = {
        v.name: [
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in v.type.tensor_type.shape.dim
        ]
        for v in model.graph.input
    }
    set_io_dims(model, declared)
    pinned = any(
        isinstance(d, int) and b is None
        for name, dims in before.items()
        if name in declared
        for d, b in zip(declared[name], dims)
    )
    if pinned and not has_external_data(model):
        del model.graph.value_info[:]
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    onnx.save(model, str(path))


def table_rows(path: Path) -> dict[str, int]:
    """Each graph input that a Gather reads as its indices straight into a table the model holds
    (a text model's token ids into its embedding), and that table's rows: its values are rows of
    the table, from -rows to rows - 1 as ONNX counts them. ONNX Runtime's CPU kernel refuses any
    other value; its CUDA kernel answers zeros for it without a word, so the signature checks them
    before any engine runs (``TensorSpec.table_rows``). Read without the weights."""
    model = onnx.load(str(path), load_external_data=False)
    tables = {t.name: list(t.dims) for t in model.graph.initializer}
    inputs = {value.name for value in model.graph.input} - set(tables)
    rows: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        data, indices = node.input[0], node.input[1]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        dims = tables.get(data)
        if indices in inputs and dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
            rows[indices] = min(rows.get(indices, dims[axis]), dims[axis])
    return rows
