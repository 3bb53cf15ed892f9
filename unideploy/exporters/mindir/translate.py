"""Walk a MindIR graph and build the equivalent ONNX model.

Graph plumbing has no ONNX counterpart and is resolved here: ``Load`` reads a parameter,
``MakeTuple``/``TupleGetItem`` build and index tuples, ``UpdateState``/``Depend`` only order side
effects (their value is their first input). Every other call goes through the operator table;
unknown operators are all listed before any translation starts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from unideploy.errors import ExportError, UntranslatableError
from unideploy.exporters.mindir.builder import OnnxBuilder, Tensor
from unideploy.exporters.mindir.ops import OPS, OPSET, Ctx
from unideploy.exporters.mindir.reader import MONAD, UNKNOWN_RANK, Call, MindIRGraph, short_name
from unideploy.signature import Signature

PLUMBING = {
    "Load": "reads a parameter (weights become ONNX initializers)",
    "TupleGetItem": "indexes a tuple (multi-output operators, tuple outputs)",
    "MakeTuple": "builds a tuple (Concat inputs, several model outputs)",
    "make_list": "builds a list (Stack inputs), as MakeTuple does",
    "UpdateState": "orders side effects; no data",
    "Depend": "orders side effects; its value is its first input",
}


def unsupported_operators(graph: MindIRGraph) -> list[str]:
    found = {c.op for c in graph.calls if c.op not in OPS and c.op not in PLUMBING}
    return sorted(found | {f"{name} (a nested graph call)" for name in graph.subgraph_calls})


def _plumbing(call: Call, args: list[Any]) -> Any:
    if call.op in ("Load", "UpdateState", "Depend"):
        return args[0]
    if call.op in ("MakeTuple", "make_list"):
        return tuple(args)
    container, index = args
    if not isinstance(container, tuple) or not isinstance(index, int):
        raise ExportError(f"MindIR TupleGetItem '{short_name(call.output)}' indexes something that is not a tuple")
    if container[index] is None:
        raise ExportError(
            f"MindIR TupleGetItem '{short_name(call.output)}' reads output {index} of an operator whose other "
            "outputs unideploy does not translate (a pooling's argmax, a BatchNorm's statistics)",
            "re-run with --keep-native-only to package the MindIR artifact alone",
        )
    return container[index]


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in _flatten(item)]
    return [] if value is MONAD or value is None else [value]


def translate(graph: MindIRGraph, signature: Signature) -> onnx.ModelProto:
    """The ONNX model computing ``graph``, with the signature's input and output names."""
    if graph.nested_graphs:
        raise UntranslatableError(
            f"the MindIR model holds control flow MindSpore left unresolved: nested graphs "
            f"({', '.join(graph.nested_graphs)}) chosen while it runs; unideploy translates straight-line graphs",
            "export the Cell with static input shapes (mindspore.export(net, Tensor(np.zeros(shape)))): MindSpore "
            "then resolves the branches (its own CPU runtime could not run such a file here either)",
        )
    missing = unsupported_operators(graph)
    if missing:
        raise UntranslatableError(
            f"the MindIR model uses operators unideploy cannot translate to ONNX: {', '.join(missing)}",
            f"supported: {', '.join(sorted(OPS))}. Re-run with --keep-native-only to package the MindIR "
            "artifact alone (it runs on MindSpore / MindSpore Lite)",
        )
    b = OnnxBuilder()
    values: dict[str, Any] = dict(graph.constants)
    for info, spec in zip(graph.inputs, signature.inputs):
        values[info.ref] = Tensor(spec.name)
        b.fresh(spec.name)
        b.ranks[spec.name] = len(spec.shape)
        b.dtypes[spec.name] = spec.dtype
    for name, array in graph.parameters.items():
        values[name] = b.initializer(array, short_name(name))

    for call in graph.calls:
        try:
            args = [values[name] for name in call.inputs]
        except KeyError as exc:
            raise ExportError(
                f"MindIR call '{short_name(call.output)}' reads '{exc.args[0]}', which nothing defines",
                "the file is corrupt; export it again",
            ) from exc
        if call.op in PLUMBING:
            values[call.output] = _plumbing(call, args)
        else:
            values[call.output] = OPS[call.op].translate(Ctx(b, call, args))
            results = values[call.output] if isinstance(values[call.output], tuple) else (values[call.output],)
            b.dtypes.update({v: info.dtype for v, info in zip(results, call.out) if isinstance(v, Tensor)})

    results = [leaf for name in graph.outputs for leaf in _flatten(values[name])]
    if len(results) != len(signature.outputs):
        raise ExportError(
            f"the MindIR graph returns {len(results)} tensors, its signature lists {len(signature.outputs)}"
        )
    sources = [b.tensor(value, spec.dtype, f"{spec.name}_const") for value, spec in zip(results, signature.outputs)]
    for source, spec in zip(sources, signature.outputs):
        b.nodes.append(helper.make_node("Identity", [source], [spec.name], name=f"{spec.name}_out"))

    def value_info(spec: Any, rank: int | None = None) -> onnx.ValueInfoProto:
        """``rank``: for an output whose rank MindSpore lost, the rank its translation computes, every
        dim unnamed (the exporter reads it back; the reference runs settle the dims)."""
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
        return helper.make_tensor_value_info(spec.name, elem, [None] * rank if rank is not None else list(spec.shape))

    outputs = [
        value_info(spec, b.rank(source) if info.shape == UNKNOWN_RANK else None)
        for info, spec, source in zip(graph.output_infos, signature.outputs, sources)
    ]
    b.prune([spec.name for spec in signature.outputs])
    onnx_graph = helper.make_graph(
        b.nodes,
        "mindir",
        [value_info(s) for s in signature.inputs],
        outputs,
        b.initializers,
    )
    model = helper.make_model(
        onnx_graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="unideploy",
        doc_string=f"translated from MindIR ({graph.producer})",
    )
    model.ir_version = 8  # opset 17 needs IR 8; keeps the model loadable by older runtimes
    return model
