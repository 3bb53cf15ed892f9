"""Editing an exported ONNX model's interface: value names and declared dimensions.

Converters name and shape a graph's inputs and outputs their own way (tf2onnx: ``serving_default_x:0``
and ``unk__12``; torch.export: every dim symbolic); the package signature is the contract, so
the model is made to say the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from unideploy.signature import Dim, Signature

# protobuf cannot serialise a single message over 2 GiB: larger models keep their weights outside.
MAX_INLINE_BYTES = 2**31 - 1
# The one external data file of a package's ONNX artifact, beside it in artifacts/.
EXTERNAL_DATA_NAME = "model.onnx.data"


def opset_of(model: onnx.ModelProto, default: int = 0) -> int:
    """The default-domain opset a model imports (``default`` when it names none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default)


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
    if pinned and not _has_external_data(model):
        del model.graph.value_info[:]
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    onnx.save(model, str(path))


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def save_model(model: onnx.ModelProto, path: Path, external: bool = False) -> None:
    """Save with every weight inline, or (``external``, or over 2 GiB) in one data file beside it."""
    if external or model.ByteSize() > MAX_INLINE_BYTES:
        data = path.with_name(EXTERNAL_DATA_NAME if path.name == "model.onnx" else f"{path.name}.data")
        data.unlink(missing_ok=True)  # onnx appends to an existing data file
        onnx.save(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=0,
        )
    else:
        onnx.save(model, str(path))


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


def names_read(nodes: Sequence[onnx.NodeProto]) -> set[str]:
    """Every tensor name ``nodes`` read, inside their subgraphs too (If/Loop/Scan bodies may read
    the enclosing graph's tensors without listing them as inputs)."""
    names: set[str] = set()
    for node in nodes:
        names.update(node.input)
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                names |= names_read(body.node)
    return names


def cpu_session(
    model: Path | bytes, *, optimization: str = "all", spin: bool = True, save_optimized: Path | None = None
) -> Any:
    """An ONNX Runtime CPU session for unideploy's own use (not serving: that is the runtime
    plug-in's), quiet but for errors. ``optimization``: "all", "basic" or "none" (graph rewrites);
    ``spin=False`` stops worker threads busy-waiting after a run, for sessions that take turns."""
    import onnxruntime as ort

    levels = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }
    options = ort.SessionOptions()
    options.graph_optimization_level = levels[optimization]
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if save_optimized is not None:
        options.optimized_model_filepath = str(save_optimized)
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def basic_optimized(path: Path, out: Path) -> Path:
    """``path`` after ONNX Runtime's basic graph optimizations, written to ``out``: constant
    subgraphs folded, BatchNormalization, bias Adds and scale Muls folded into the Conv before them.
    Exporters leave these as separate nodes (Paddle2ONNX's biases, TorchScript's padding and
    attention masks), which hides from channel pruning which tensors are per-channel constants and
    from onnx2tf which shapes are static. Only standard ONNX ops remain."""
    cpu_session(path, optimization="basic", save_optimized=out)
    return out


def copy_model(src: Path, dst: Path) -> None:
    """Copy an ONNX model for a tool that reads (or rewrites) one file: weights inline where they
    fit, else beside ``dst`` in one data file."""
    save_model(onnx.load(str(src)), dst)


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
