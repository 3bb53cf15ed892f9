"""Every row of the operator table (docs/ascend-operators.md) through MindSpore: a small ONNX graph
per operator and variant, rebuilt and exported as MindIR with a dynamic batch, run through GraphCell
at two batch sizes in one loaded graph, and compared with ONNX Runtime on the same inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from unideploy.signature import Signature, TensorSpec

pytestmark = pytest.mark.mindspore
pytest.importorskip("mindspore", reason="the mindspore extra is not installed in this venv")

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
IMAGE = ("x", F, [3, 8, 8])  # name, type, shape after the dynamic batch
TOKENS = ("x", F, [5, 16])


def const(name: str, value: object, dtype: object = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def weights(name: str, *shape: int) -> onnx.TensorProto:
    return const(name, RNG.standard_normal(shape) * 0.5)


def node(op: str, inputs: list[str], outputs: list[str] | None = None, **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs or ["y"], **attrs)


def _branch(name: str, op: str) -> onnx.GraphProto:
    """An If's branch: ``op`` of the enclosing graph's ``x``."""
    return helper.make_graph(
        [node(op, ["x"], [f"{name}_y"])], name, [], [helper.make_tensor_value_info(f"{name}_y", F, None)]
    )


# id -> (nodes, initializers, inputs (name, type, shape without batch), outputs, opset)
CASES: dict[str, tuple] = {
    "conv-pads-bias": ([node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1])], [weights("w", 4, 3, 3, 3), weights("b", 4)]),
    "conv-depthwise-asymmetric-dilated": (
        [node("Conv", ["x", "w"], group=3, pads=[0, 1, 2, 1], dilations=[2, 1], strides=[1, 2])],
        [weights("w", 3, 1, 3, 3)],
    ),
    "conv-same-upper": ([node("Conv", ["x", "w"], auto_pad="SAME_UPPER", strides=[2, 2])], [weights("w", 2, 3, 3, 3)]),
    "same-upper-on-dynamic-sizes": (  # MTCNN's PNet: fully convolutional, TensorFlow's "same"
        [
            node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
            node("MaxPool", ["c"], ["m"], auto_pad="SAME_UPPER", kernel_shape=[2, 2], strides=[2, 2]),
            node("AveragePool", ["m"], ["a"], auto_pad="SAME_UPPER", kernel_shape=[3, 3], strides=[2, 2]),
            node("Conv", ["a", "w1"], auto_pad="SAME_LOWER"),  # stride 1: pads fixed whatever the size
        ],
        [weights("w", 2, 3, 3, 3), weights("w1", 2, 2, 3, 3)],
        [("x", F, [3, "h", "w"])],
    ),
    "conv-transpose": (
        [node("ConvTranspose", ["x", "w", "b"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])],
        [weights("w", 3, 2, 3, 3), weights("b", 2)],
    ),
    "maxpool-pads-ceil": (
        [node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)],
        [],
    ),
    "maxpool-asymmetric": ([node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1])], []),
    "averagepool": (
        [node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=1)],
        [],
    ),
    "global-pools": (
        [node("GlobalAveragePool", ["x"], ["a"]), node("GlobalMaxPool", ["x"], ["m"]), node("Add", ["a", "m"])],
        [],
    ),
    "depth-to-space-dcr": ([node("DepthToSpace", ["x"], blocksize=2)], [], [("x", F, [8, 3, 5])]),
    "depth-to-space-crd": ([node("DepthToSpace", ["x"], blocksize=2, mode="CRD")], [], [("x", F, [8, 3, 5])]),
    "space-to-depth": ([node("SpaceToDepth", ["x"], blocksize=2)], [], [("x", F, [3, 4, 6])]),
    "batchnorm": (
        [node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3)],
        [weights("s", 3), weights("b", 3), weights("m", 3), const("v", [0.5, 1.0, 2.0])],
    ),
    "layernorm": (
        [node("LayerNormalization", ["x", "s", "b"], axis=-1)],
        [weights("s", 16), weights("b", 16)],
        [TOKENS],
    ),
    "gemm": (
        [node("Flatten", ["x"], ["f"]), node("Gemm", ["f", "w", "c"], transB=1, alpha=0.5, beta=2.0)],
        [weights("w", 4, 192), weights("c", 4)],
    ),
    "matmul": ([node("MatMul", ["x", "w"])], [weights("w", 16, 7)], [TOKENS]),
    "unary": (
        [
            node("Abs", ["x"], ["a"]),
            node("Sqrt", ["a"], ["s"]),
            node("Log", ["s"], ["l"]),  # of |x| ** 0.5 > 0 almost surely
            node("Exp", ["x"], ["e"]),
            node("Reciprocal", ["e"], ["r"]),
            node("Erf", ["x"], ["erf"]),
            node("Tanh", ["x"], ["t"]),
            node("Sigmoid", ["x"], ["sg"]),
            node("Relu", ["x"], ["re"]),
            node("Neg", ["x"], ["n"]),
            node("Floor", ["x"], ["fl"]),
            node("Ceil", ["x"], ["ce"]),
            node("Sin", ["x"], ["si"]),
            node("Cos", ["x"], ["co"]),
            node("Softplus", ["x"], ["sp"]),
            node("HardSwish", ["x"], ["hs"]),
            node("Identity", ["hs"], ["id"]),
            node("Dropout", ["id"], ["dr"]),
            node("Add", ["l", "r"], ["k1"]),
            node("Add", ["k1", "erf"], ["k2"]),
            node("Add", ["k2", "t"], ["k3"]),
            node("Add", ["k3", "sg"], ["k4"]),
            node("Add", ["k4", "re"], ["k5"]),
            node("Add", ["k5", "n"], ["k6"]),
            node("Add", ["k6", "fl"], ["k7"]),
            node("Add", ["k7", "ce"], ["k8"]),
            node("Add", ["k8", "si"], ["k9"]),
            node("Add", ["k9", "co"], ["k10"]),
            node("Add", ["k10", "sp"], ["k11"]),
            node("Add", ["k11", "dr"]),
        ],
        [],
    ),
    "binary-broadcast": (
        [
            node("Sub", ["x", "c"], ["s"]),
            node("Mul", ["s", "c"], ["m"]),
            node("Div", ["m", "d"], ["q"]),
            node("Pow", ["d", "c"], ["p"]),
            node("Max", ["q", "p", "x"], ["mx"]),
            node("Min", ["mx", "c"]),
        ],
        [weights("c", 1, 8), const("d", [[2.0]])],
    ),
    "comparisons-where": (
        [
            node("Greater", ["x", "z"], ["g"]),
            node("Less", ["x", "z"], ["l"]),
            node("LessOrEqual", ["x", "h"], ["le"]),
            node("GreaterOrEqual", ["x", "h"], ["ge"]),
            node("Equal", ["g", "l"], ["eq"]),
            node("Not", ["eq"], ["ne"]),
            node("And", ["ne", "le"], ["a"]),
            node("Or", ["a", "ge"], ["o"]),
            node("Where", ["o", "x", "z"]),
        ],
        [const("z", 0.0), const("h", 0.3)],
    ),
    "activations": (
        [
            node("Clip", ["x", "lo", "hi"], ["c"]),
            node("LeakyRelu", ["c"], ["l"], alpha=0.2),
            node("PRelu", ["l", "slope"], ["p"]),
            node("HardSigmoid", ["p"], ["h"], alpha=0.3, beta=0.4),
            node("Gelu", ["h"], approximate="tanh"),
        ],
        [const("lo", -1.0), const("hi", 6.0), const("slope", [[[0.1]], [[0.2]], [[0.3]]])],
        [IMAGE],
        20,
    ),
    "softmax-logsoftmax": (
        [node("Softmax", ["x"], ["s"], axis=1), node("LogSoftmax", ["x"], ["l"], axis=-1), node("Add", ["s", "l"])],
        [],
        [TOKENS],
    ),
    "softmax-opset11-last-axis": ([node("Softmax", ["x"], axis=2)], [], [TOKENS], 11),
    "reductions": (
        [
            node("ReduceMean", ["x", "ax"], ["a"], keepdims=1),
            node("ReduceSum", ["x", "ax"], ["b"], keepdims=1),
            node("ReduceMax", ["x", "ax"], ["c"], keepdims=1),
            node("ReduceMin", ["x", "ax"], ["d"], keepdims=1),
            node("ReduceL2", ["x", "ax"], ["e"], keepdims=1),
            node("ReduceL1", ["x", "ax"], ["f"], keepdims=1),
            node("ReduceSumSquare", ["x", "ax"], ["g"], keepdims=1),
            node("Add", ["a", "b"], ["s1"]),
            node("Add", ["s1", "c"], ["s2"]),
            node("Add", ["s2", "d"], ["s3"]),
            node("Add", ["s3", "e"], ["s4"]),
            node("Add", ["s4", "f"], ["s5"]),
            node("Add", ["s5", "g"]),
        ],
        [const("ax", [-1, 2], np.int64)],
        [IMAGE],
        18,
    ),
    "argmax": ([node("ArgMax", ["x"], axis=2, keepdims=0)], [], [TOKENS]),
    "reshape-from-shape": (
        [
            node("Shape", ["x"], ["s"]),
            node("Gather", ["s", "zero"], ["b"], axis=0),
            node("Unsqueeze", ["b", "zero1"], ["b1"]),
            node("Concat", ["b1", "rest"], ["t"], axis=0),
            node("Reshape", ["x", "t"]),
        ],
        [const("zero", 0, np.int64), const("zero1", [0], np.int64), const("rest", [5, 16], np.int64)],
        [("x", F, [80])],
    ),
    "reshape-zero-copies": ([node("Reshape", ["x", "t"])], [const("t", [0, 4, -1], np.int64)], [TOKENS]),
    "flatten-transpose-squeeze": (
        [
            node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
            node("Unsqueeze", ["t", "ax"], ["u"]),
            node("Squeeze", ["u", "ax"], ["s"]),
            node("Flatten", ["s"], axis=2),
        ],
        [const("ax", [1], np.int64)],
    ),
    "split-concat": (
        [node("Split", ["x", "sizes"], ["a", "b", "c"], axis=2), node("Concat", ["c", "a", "b"], axis=2)],
        [const("sizes", [4, 4, 8], np.int64)],
        [TOKENS],
    ),
    "slice-static-steps": (
        [node("Slice", ["x", "st", "en", "ax", "sp"])],
        [
            const("st", [1, -1], np.int64),
            const("en", [8, -9], np.int64),
            const("ax", [3, 2], np.int64),
            const("sp", [2, -1], np.int64),
        ],
    ),
    "slice-computed-end": (
        [
            node("Shape", ["x"], ["s"]),
            node("Slice", ["s", "one", "two"], ["n"]),  # the sequence length, as a 1-element tensor
            node("Slice", ["table", "zero", "n", "zero"], ["pos"]),  # a position table cut to it
            node("Add", ["x", "pos"]),
        ],
        [
            const("one", [1], np.int64),
            const("two", [2], np.int64),
            const("zero", [0], np.int64),
            weights("table", 32, 16),
        ],
        [TOKENS],
    ),
    "expand-constantofshape-range": (
        [
            node("Shape", ["x"], ["s"]),
            node("ConstantOfShape", ["s"], ["ones"], value=helper.make_tensor("v", F, [1], [1.5])),
            node("Gather", ["s", "one"], ["n"]),
            node("Range", ["zero", "n", "step"], ["r"]),
            node("Cast", ["r"], ["rf"], to=F),
            node("Unsqueeze", ["rf", "last"], ["col"]),
            node("Expand", ["col", "s"], ["e"]),
            node("Mul", ["e", "ones"], ["m"]),
            node("Add", ["m", "x"]),
        ],
        [
            const("one", 1, np.int64),
            const("zero", 0, np.int64),
            const("step", 1, np.int64),
            const("last", [1], np.int64),
        ],
        [TOKENS],
    ),
    "tile": ([node("Tile", ["x", "r"])], [const("r", [1, 2, 1], np.int64)], [TOKENS]),
    "pad-modes": (
        [
            node("Pad", ["x", "p", "v"], ["a"], mode="constant"),
            node("Pad", ["x", "p"], ["b"], mode="reflect"),
            node("Pad", ["x", "p"], ["c"], mode="edge"),
            node("Add", ["a", "b"], ["ab"]),
            node("Add", ["ab", "c"]),
        ],
        [const("p", [0, 0, 1, 2, 0, 0, 2, 1], np.int64), const("v", 0.5)],
    ),
    "resize-nearest-2x": ([node("Resize", ["x", "", "sc"], mode="nearest")], [const("sc", [1, 1, 2, 2])]),
    "resize-nearest-3x-asymmetric-floor": (
        [
            node(
                "Resize",
                ["x", "", "sc"],
                mode="nearest",
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
            )
        ],
        [const("sc", [1, 1, 3, 3])],
    ),
    "resize-nearest-sizes": (
        [
            node(
                "Resize",
                ["x", "", "", "sz"],
                mode="nearest",
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
                axes=[2, 3],
            )
        ],
        [const("sz", [12, 10], np.int64)],
        [IMAGE],
        18,
    ),
    "resize-linear-half-pixel": (
        [node("Resize", ["x", "", "", "sz"], mode="linear", coordinate_transformation_mode="half_pixel", axes=[2, 3])],
        [const("sz", [12, 10], np.int64)],
        [IMAGE],
        18,
    ),
    "embedding-gather": (
        [node("Gather", ["table", "ids"], axis=0)],
        [weights("table", 50, 8)],
        [("ids", TensorProto.INT64, [6])],
    ),
    "gather-scalar-index": ([node("Gather", ["x", "i"], axis=1)], [const("i", -1, np.int64)], [TOKENS]),
    "lstm-forward-with-states": (
        [node("LSTM", ["x", "w", "r", "b", "", "h", "c"], ["y"], hidden_size=6)],
        [
            weights("w", 1, 24, 16),
            weights("r", 1, 24, 6),
            weights("b", 1, 48),
            weights("h", 1, 1, 6),
            weights("c", 1, 1, 6),
        ],
        [("x", F, [1, 16])],  # [seq, batch, input]: the dynamic first dim is the sequence here
    ),
    "lstm-bidirectional-last-state": (
        [node("LSTM", ["x", "w", "r", "b"], ["", "y"], hidden_size=5, direction="bidirectional")],
        [weights("w", 2, 20, 16), weights("r", 2, 20, 5), weights("b", 2, 40)],
        [("x", F, [3, 16])],
    ),
    "lstm-reverse": (
        [node("LSTM", ["x", "w", "r"], ["y"], hidden_size=4, direction="reverse")],
        [weights("w", 1, 16, 16), weights("r", 1, 16, 4)],
        [("x", F, [2, 16])],
    ),
    "cast-int": ([node("Cast", ["x"], ["i"], to=TensorProto.INT64), node("Cast", ["i"], to=F)], [], [TOKENS]),
    "conv1d-pads-strided-bias": (  # Silero VAD's encoder: audio [N, C, L]
        [node("Conv", ["x", "w", "b"], pads=[2, 1], strides=[2])],
        [weights("w", 3, 4, 5), weights("b", 3)],
        [("x", F, [4, 16])],
    ),
    "conv1d-grouped-dilated": (
        [node("Conv", ["x", "w"], group=2, dilations=[2])],
        [weights("w", 4, 2, 3)],
        [("x", F, [4, 16])],
    ),
    "size-of-a-dynamic-batch": (
        [node("Size", ["x"], ["n"]), node("Cast", ["n"], ["f"], to=F), node("Mul", ["x", "f"])],
        [],
        [("x", F, [4, 16])],
    ),
    "if-on-a-fixed-dim": (  # Silero VAD squeezes its time axis when it is 1: the branch is known
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "last"], ["length"]),
            node("Equal", ["length", "sixteen"], ["short"]),
            node("If", ["short"], then_branch=_branch("then", "Relu"), else_branch=_branch("else", "Neg")),
        ],
        [const("last", 2, np.int64), const("sixteen", 16, np.int64)],
        [("x", F, [4, 16])],
    ),
    "if-reading-dims-an-earlier-if-fixes": (  # TorchScript's Silero VAD: squeeze-if-1, then a branch on the result
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "last"], ["length"]),
            node("Equal", ["length", "one"], ["single"]),
            node(
                "If",
                ["single"],
                ["kept"],
                then_branch=helper.make_graph(  # one rank less, as a squeeze would give
                    [node("ReduceMean", ["x"], ["squeezed"], axes=[2], keepdims=0)],
                    "squeeze",
                    [],
                    [helper.make_tensor_value_info("squeezed", F, None)],
                ),
                else_branch=helper.make_graph(
                    [node("Identity", ["x"], ["same"])], "keep", [], [helper.make_tensor_value_info("same", F, None)]
                ),
            ),
            node("Relu", ["kept"], ["act"]),  # shape inference typed it before the If was decided
            node("Shape", ["act"], ["kept_shape"]),
            node("Gather", ["kept_shape", "last"], ["kept_length"]),
            node("Equal", ["kept_length", "sixteen"], ["short"]),
            node("If", ["short"], then_branch=_branch("then", "Relu"), else_branch=_branch("else", "Neg")),
        ],
        [const("last", 2, np.int64), const("one", 1, np.int64), const("sixteen", 16, np.int64)],
        [("x", F, [4, 16])],
    ),
}


def _model(case: tuple) -> tuple[onnx.ModelProto, Signature]:
    nodes, inits, *rest = case
    inputs = rest[0] if rest else [IMAGE]
    opset = rest[1] if len(rest) > 1 else 17
    graph_inputs = [helper.make_tensor_value_info(n, t, ["batch", *s]) for n, t, s in inputs]
    out = helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)
    model = helper.make_model(
        helper.make_graph(nodes, "case", graph_inputs, [out], inits), opset_imports=[helper.make_opsetid("", opset)]
    )
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    kind = model.graph.output[0].type.tensor_type
    out_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(kind.elem_type)).name
    signature = Signature(
        tuple(TensorSpec(n, np.dtype(helper.tensor_dtype_to_np_dtype(t)).name, ("batch", *s)) for n, t, s in inputs),
        (TensorSpec("y", out_dtype, tuple(f"d{i}" for i in range(len(kind.shape.dim)))),),
    )
    return model, signature


def _inputs(signature: Signature, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    sizes = {"h": 9 + batch, "w": 14 - batch}  # dynamic spatial dims: odd and even, per call
    shapes = {s.name: (batch, *(sizes.get(d, d) for d in s.shape[1:])) for s in signature.inputs}
    return {
        s.name: rng.integers(0, 50, shapes[s.name])
        if s.dtype == "int64"
        else rng.standard_normal(shapes[s.name]).astype(np.float32)
        for s in signature.inputs
    }


@pytest.mark.parametrize("case", sorted(CASES))
def test_operator_matches_onnx_runtime_at_two_batch_sizes(case: str, tmp_path: Path) -> None:
    from unideploy.ascend.network import export_mindir
    from unideploy.runtimes.mindspore_runtime import MindSporeRuntime

    model, signature = _model(CASES[case])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    mindir = export_mindir(model, signature, tmp_path / "case.mindir", tmp_path, _inputs(signature, 1))
    runtime = MindSporeRuntime(mindir, signature)
    for batch in (4, 1):  # one loaded graph, two sizes, the larger first
        inputs = _inputs(signature, batch)
        (expected,) = session.run(None, inputs)
        got = runtime.run(inputs)["y"]
        assert got.shape == expected.shape, case
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3, err_msg=case)


def test_an_if_on_values_known_only_at_run_time_is_refused_naming_it(tmp_path: Path) -> None:
    """The same If on a dim the signature leaves dynamic: no branch can be chosen for every input,
    and MindSpore's graph takes no branch of another rank, so the export names the node and the fix."""
    from unideploy.ascend.network import export_mindir
    from unideploy.errors import ExportError

    nodes, inits, _ = CASES["if-on-a-fixed-dim"]
    model, signature = _model((nodes, inits, [("x", F, [4, "w"])]))
    with pytest.raises(ExportError, match="branches on something only a run knows \\(If node") as refused:
        export_mindir(model, signature, tmp_path / "case.mindir", tmp_path, _inputs(signature, 1))
    assert "--input-shape" in (refused.value.hint or "")
