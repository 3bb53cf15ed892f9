"""Rebuild an ONNX graph as a MindSpore network, and write it as MindIR with MindSpore itself.

MindSpore compiles a Cell's ``construct`` from its Python source (GRAPH_MODE), so the network is
generated as source: one line per ONNX node, from the operator table (``ops.py``), with the
weights as frozen Parameters. Values known before the network runs (initializers, Constant nodes,
shapes that shape inference fixes, arithmetic on them) are folded with ONNX's reference evaluator,
so shape plumbing only reaches MindSpore where a dim is dynamic. An ``If`` whose condition folds
so (a branch on a dim the signature fixes: Silero VAD squeezes its time axis when it is 1) is the
branch it takes, inlined; one that branches on the inputs' values is refused. Unknown operators
are listed, all at once, before any work, those inside an ``If``'s branches included.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from unideploy.ascend.ops import OPS, SUPPORT, Ctx, Static
from unideploy.errors import ExportError, first_line
from unideploy.onnx.graph import bodies
from unideploy.onnx.interface import opset_of
from unideploy.onnx.session import cpu_session
from unideploy.quiet import quiet
from unideploy.runtimes.mindspore_runtime import mindspore_defaults, placeholders
from unideploy.signature import Signature

MODULE_NAME = "unideploy_ascend_network"
NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def unsupported_operators(model: onnx.ModelProto) -> list[str]:
    found: set[str] = set()

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                found.add(f"{node.domain}.{node.op_type}")
            elif node.op_type == "If":  # inlined where its condition folds (NetworkSource._inline)
                for branch in bodies(node):
                    visit(branch)
            elif node.op_type not in OPS and node.op_type != "Constant":
                found.add(node.op_type)

    visit(model.graph)
    return sorted(found)


def require_supported(model: onnx.ModelProto) -> None:
    missing = unsupported_operators(model)
    if missing:
        raise ExportError(
            f"the model uses ONNX operators unideploy cannot rebuild in MindSpore: {', '.join(missing)}",
            "see docs/ascend-operators.md for the supported ones; --target cpu or edge serve the ONNX artifact",
        )


def _fold(node: onnx.NodeProto, inputs: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [name if value is not None else "" for name, value in zip(node.input, inputs)]
    graph = onnx.helper.make_graph(
        [node],
        "fold",
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in names if n],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.output if n],
    )
    evaluator = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)]))
    feeds = {n: v for n, v in zip(names, inputs) if n}
    return [np.asarray(v) for v in evaluator.run(None, feeds)]


class UndecidedBranch(ExportError):
    """An If only a run can decide, met after the Ifs in ``decided`` (first output -> branch taken)."""

    def __init__(self, node: str, decided: dict[str, str]) -> None:
        super().__init__(
            f"the model branches on something only a run knows (If node '{node}'): a MindSpore network "
            "rebuilt from ONNX takes the one branch chosen when it is built",
            "where the condition reads a dim the signature leaves dynamic, fix it with --input-shape NAME:DIMS; "
            "--target cpu or edge serve the ONNX artifact as it is",
        )
        self.decided = decided


MAX_INLINING_PASSES = 16  # TorchScript's Silero VAD nests a dozen Ifs on shapes


def network_source(
    model: onnx.ModelProto, signature: Signature, example: Mapping[str, np.ndarray] | None = None
) -> NetworkSource:
    """The network's source, where Ifs on shapes need it in several passes: shape inference runs
    once per pass, and cannot see through an If whose branches give values of different ranks
    (Silero VAD from TorchScript squeezes its time axis when it is 1), so the dims a later If reads
    stay unknown. Each pass that stops at an If it cannot decide, after deciding others, starts
    again from the graph with those taken (``branches_taken``)."""
    for _ in range(MAX_INLINING_PASSES):
        try:
            return NetworkSource(model, signature, example)
        except UndecidedBranch as undecided:
            if not undecided.decided:
                raise
            model = branches_taken(model, undecided.decided)
    return NetworkSource(model, signature, example)


def branches_taken(model: onnx.ModelProto, decided: Mapping[str, str]) -> onnx.ModelProto:
    """``model`` with each If in ``decided`` replaced by the nodes of the branch it takes and an
    Identity per output; an If nested in a taken branch is replaced as it surfaces."""
    taken = onnx.ModelProto()
    taken.CopyFrom(model)
    pending, nodes = list(model.graph.node), []
    while pending:
        node = pending.pop(0)
        if node.op_type != "If" or node.output[0] not in decided:
            nodes.append(node)
            continue
        side = decided[node.output[0]]
        branch = _branch(node, side)
        taken.graph.initializer.extend(branch.initializer)
        outputs = [
            onnx.helper.make_node("Identity", [result.name], [output], name=f"{node.output[0]}/{side}/{i}")
            for i, (output, result) in enumerate(zip(node.output, branch.output))
            if output
        ]
        pending[:0] = [*branch.node, *outputs]
    del taken.graph.node[:]
    taken.graph.node.extend(nodes)
    return taken


def _branch(node: onnx.NodeProto, side: str) -> onnx.GraphProto:
    """An If node's ``then_branch`` or ``else_branch``."""
    return next(a.g for a in node.attribute if a.name == side)


def _shape_slice(node: onnx.NodeProto, shape: tuple[int | None, ...]) -> tuple[int | None, ...]:
    """The dims a Shape node gives of ``shape``: opset 15's ``start`` and ``end`` select some."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return shape[attrs.get("start", 0) : attrs.get("end", len(shape))]


def _identifier(n: int, prefix: str) -> str:
    return f"{prefix}{n}"


class NetworkSource:
    """The Python source of a MindSpore Cell computing ``model``, and its weights."""

    def __init__(
        self, model: onnx.ModelProto, signature: Signature, example: Mapping[str, np.ndarray] | None = None
    ) -> None:
        require_supported(model)
        bare = onnx.ModelProto()
        bare.CopyFrom(model)
        del bare.graph.value_info[:]  # exporters leave shapes of the size they traced at: infer afresh
        try:
            model = onnx.shape_inference.infer_shapes(bare)
        except Exception as exc:  # ONNX raises its own error types; any failure means the same here
            raise ExportError(f"ONNX shape inference failed on the model: {first_line(exc)}") from exc
        self.opset = opset_of(model, 13)
        self.shapes: dict[str, tuple[int | None, ...]] = {}
        self.elem_types: dict[str, int] = {}
        self._learn_shapes(model.graph)
        # what a Shape node gives where some of its dims are dynamic: Gather folds the fixed ones
        self._partial_shapes: dict[str, tuple[int | None, ...]] = {}
        self._counter = 0
        self.decided: dict[str, str] = {}  # If node (its first output) -> the branch it takes
        if example is not None:
            self._observe_ranks(model, example)
        self.weights: dict[str, np.ndarray] = {}
        self._params: dict[tuple[str, str], str] = {}
        self._param_names: set[str] = set()
        self.init_lines: list[str] = []
        self.body: list[str] = []
        self.signature = signature
        self._generate(model)

    def _learn_shapes(self, graph: onnx.GraphProto) -> None:
        """Each value's shape and type as shape inference wrote them, subgraphs' (an If's
        branches) included."""
        for info in [*graph.input, *graph.value_info, *graph.output]:
            kind = info.type.tensor_type
            self.elem_types[info.name] = kind.elem_type
            if kind.HasField("shape"):
                self.shapes[info.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim)
        for node in graph.node:
            for body in bodies(node):
                self._learn_shapes(body)

    def _observe_ranks(self, model: onnx.ModelProto, example: Mapping[str, np.ndarray]) -> None:
        """Where shape inference gives up (computed Reshape targets in exporters' output), run
        the model once on an example to learn each value's rank and type; every dim stays
        dynamic, as nothing proves it fixed."""

        def vague(name: str) -> bool:
            shape = self.shapes.get(name)
            if shape is None or not self.elem_types.get(name):
                return True
            # a 1-D int64 of unknown length is a shape being computed: its length is a rank, fixed
            return shape == (None,) and self.elem_types[name] == onnx.TensorProto.INT64

        unknown = [name for node in model.graph.node for name in node.output if name and vague(name)]
        if not unknown:
            return
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in unknown)
        session = cpu_session(probe.SerializeToString(), optimization="none")
        for name, value in zip(unknown, session.run(unknown, dict(example))):
            value = np.asarray(value)
            shape_tensor = value.ndim == 1 and value.dtype == np.int64
            self.shapes[name] = value.shape if shape_tensor else self.shapes.get(name, (None,) * value.ndim)
            self.elem_types[name] = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)

    def parameter(self, array: np.ndarray, hint: str) -> str:
        """A frozen Parameter holding ``array`` (one per ONNX value and content). A scalar stays a
        scalar (``np.ascontiguousarray`` makes it [1], and a Mul by it then adds an axis to a
        shape being computed: ddddocr's LSTM output Reshape stopped compiling)."""
        array = np.asarray(array)
        array = array if array.flags.c_contiguous else np.array(array, order="C")
        key = (hint, f"{array.dtype}{array.shape}{hash(array.tobytes())}")
        if key not in self._params:
            attr = _identifier(len(self._params), "c")
            name, i = hint or attr, 0
            while name in self._param_names:
                i += 1
                name = f"{hint}_{i}"
            self._param_names.add(name)
            self.weights[attr] = array
            self.init_lines.append(
                f"        self.{attr} = Parameter(Tensor(weights[{attr!r}]), name={name!r}, requires_grad=False)"
            )
            self._params[key] = f"self.{attr}"
        return self._params[key]

    def _generate(self, model: onnx.ModelProto) -> None:
        values: dict[str, str | Static] = {
            init.name: Static(numpy_helper.to_array(init)) for init in model.graph.initializer
        }
        by_name = {spec.name: i for i, spec in enumerate(self.signature.inputs)}
        self.arguments: list[str] = []
        for info in model.graph.input:
            if info.name in values:
                continue  # an initializer listed as an input (older exporters): a constant here
            if info.name not in by_name:
                raise ExportError(f"the ONNX input '{info.name}' is not in the package signature")
            argument = _identifier(by_name[info.name], "x")
            values[info.name] = argument
            self.arguments.append(argument)
        for node in model.graph.node:
            self._translate(node, values)
        results: list[str] = []
        for out in model.graph.output:
            value = values[out.name]
            results.append(self.parameter(value.array, out.name) if isinstance(value, Static) else value)
        order = {spec.name: i for i, spec in enumerate(self.signature.outputs)}
        missing = [o.name for o in model.graph.output if o.name not in order]
        if missing:
            raise ExportError(f"the ONNX outputs {missing} are not in the package signature")
        ordered = [r for _, r in sorted(zip((order[o.name] for o in model.graph.output), results))]
        self.body.append(f"        return {ordered[0] if len(ordered) == 1 else '(' + ', '.join(ordered) + ',)'}")

    def _translate(self, node: onnx.NodeProto, values: dict[str, str | Static]) -> None:
        """One ONNX node: folded into ``values`` where its result is known now, an If replaced by
        its branch, else a line of ``construct``."""
        inputs: list[str | Static | None] = []
        for name in node.input:
            if name and name not in values:
                raise ExportError(f"ONNX node '{node.name}' reads '{name}', which nothing defines")
            inputs.append(values[name] if name else None)
        if node.op_type == "If":
            self._inline(node, inputs[0], values)
            return
        folded = self._try_fold(node, inputs)
        if folded is not None:
            values.update({name: Static(v) for name, v in zip(node.output, folded) if name})
            return
        expr = OPS[node.op_type].emit(Ctx(self, node, inputs))
        exprs = expr if isinstance(expr, list) else None
        targets = []
        for name in node.output:
            targets.append(_identifier(self._counter, "v") if name else "_")
            if name:
                values[name] = targets[-1]
            self._counter += 1
        if exprs is not None:
            self.body += [f"        {t} = {e}" for t, e in zip(targets, exprs)]
        else:
            self.body.append(f"        {', '.join(targets)} = {expr}")

    def _inline(self, node: onnx.NodeProto, condition: str | Static | None, values: dict[str, str | Static]) -> None:
        """An If whose condition is known now becomes the nodes of the branch it takes (which read
        the enclosing graph's values by name, as ONNX scopes them); MindSpore's graph compiler
        gets no branch to trace."""
        if not isinstance(condition, Static):
            raise UndecidedBranch(node.name or node.output[0], dict(self.decided))
        taken = "then_branch" if bool(np.asarray(condition.array).reshape(-1)[0]) else "else_branch"
        self.decided[node.output[0]] = taken  # an output names a node: names are optional in ONNX
        branch = _branch(node, taken)
        for init in branch.initializer:
            values[init.name] = Static(numpy_helper.to_array(init))
        for inner in branch.node:
            self._translate(inner, values)
        for output, result in zip(node.output, branch.output):
            if output:
                values[output] = values[result.name]
                if result.name in self.shapes:  # shape inference cannot type an If whose branches differ
                    self.shapes[output] = self.shapes[result.name]

    def _try_fold(self, node: onnx.NodeProto, inputs: list[str | Static | None]) -> list[np.ndarray] | None:
        if node.op_type in ("Shape", "Size") and isinstance(inputs[0], str):
            # of a computed tensor, both read only what shape inference knows of it (of a constant,
            # they fold below like any node)
            shape = self.shapes.get(node.input[0])
            if shape is None:
                return None
            known = None not in shape
            if node.op_type == "Size":
                return [np.asarray(math.prod(int(d or 0) for d in shape), np.int64)] if known else None
            if not known:
                self._partial_shapes[node.output[0]] = _shape_slice(node, shape)
                self.shapes[node.output[0]] = (len(self._partial_shapes[node.output[0]]),)  # its length is a rank
                return None
            return [np.asarray(_shape_slice(node, shape), np.int64)]
        if node.op_type == "Gather" and node.input[0] in self._partial_shapes and isinstance(inputs[1], Static):
            return self._fixed_dims(self._partial_shapes[node.input[0]], inputs[1].array)
        if node.op_type in NOT_FOLDED or any(isinstance(v, str) for v in inputs):
            return None
        return _fold(node, [v.array if isinstance(v, Static) else None for v in inputs], self.opset)

    @staticmethod
    def _fixed_dims(shape: tuple[int | None, ...], indices: np.ndarray) -> list[np.ndarray] | None:
        """Gather's result on a shape of which some dims are dynamic, where every dim it takes is fixed."""
        taken = [shape[int(i)] for i in np.asarray(indices).reshape(-1)]
        if any(d is None for d in taken):
            return None
        return [np.asarray(taken, np.int64).reshape(np.shape(indices))]

    def source(self) -> str:
        lines = [
            f'"""Generated by unideploy from an ONNX graph (opset {self.opset}); regenerated on every export."""',
            "import mindspore as ms",
            "from mindspore import Parameter, Tensor, nn, ops",
            *SUPPORT.splitlines(),
            "",
            "",
            "class Network(nn.Cell):",
            "    def __init__(self, weights):",
            "        super().__init__()",
            *self.init_lines,
            "",
            f"    def construct(self, {', '.join(self.arguments)}):",
            *self.body,
        ]
        return "\n".join(lines) + "\n"


def build_network(
    model: onnx.ModelProto, signature: Signature, workdir: Path, example: Mapping[str, np.ndarray] | None = None
) -> Any:
    """The MindSpore Cell computing ``model``. Its source is written to ``workdir`` (MindSpore
    compiles ``construct`` from the file); the caller keeps ``workdir`` until it has exported."""
    generated = network_source(model, signature, example)
    path = workdir / f"{MODULE_NAME}.py"
    path.write_text(generated.source())
    spec = importlib.util.spec_from_file_location(f"{MODULE_NAME}_{id(generated)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Network(generated.weights)


def export_mindir(
    model: onnx.ModelProto,
    signature: Signature,
    path: Path,
    workdir: Path,
    example: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``path`` (.mindir) with ``mindspore.export``; every dynamic dim of the signature stays
    dynamic. Returns the path written."""
    mindspore_defaults()
    with quiet():
        import mindspore as ms

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        network = build_network(model, signature, workdir, example)
        try:
            ms.export(network, *placeholders(ms, signature), file_name=str(path.with_suffix("")), file_format="MINDIR")
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ExportError(
                f"MindSpore could not compile the rebuilt network: {first_line(exc)}",
                "report the model; --target cpu or edge serve the ONNX artifact meanwhile",
            ) from exc
    return path.with_suffix(".mindir")
