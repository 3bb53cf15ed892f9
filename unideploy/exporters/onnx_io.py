"""Editing an exported ONNX model's interface: value names and declared dimensions.

Converters name and shape a graph's inputs and outputs their own way (tf2onnx: ``serving_default_x:0``
and ``unk__12``; torch.export: every dim symbolic); the package signature is the contract, so
the model is made to say the same.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import onnx

from unideploy.signature import Dim


def rename_values(model: onnx.ModelProto, mapping: Mapping[str, str]) -> None:
    """Rename tensors everywhere they appear (graph inputs/outputs, node inputs/outputs)."""
    graph = model.graph
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        value.name = mapping.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]


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
