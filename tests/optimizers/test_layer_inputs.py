"""Layer inputs computed segment by segment: the same values as from the model's inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import unideploy
from unideploy.optimizers import layer_inputs
from unideploy.optimizers.graph import computing, get_array, linear_layers, load_for_pruning, set_array
from unideploy.optimizers.layer_inputs import LayerInputs


def _residual_net() -> onnx.ModelProto:
    """x -> Gemm a -> Relu -> Gemm b -> Add(residual from the Relu) -> Gemm c; its Shape read
    late, a Constant, and an If whose branch reads the Relu's output from the enclosing graph."""
    rng = np.random.default_rng(0)
    weights = {n: rng.normal(0, 0.5, (8, 8)).astype(np.float32) for n in ("wa", "wb", "wc")}
    branch = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Gemm", ["x", "wa"], ["ha"], name="a"),
        helper.make_node("Relu", ["ha"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "wb"], ["hb"], name="b"),
        helper.make_node("Constant", [], ["flag"], name="flag", value=numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["flag"], ["f"], name="if", then_branch=branch, else_branch=other),
        helper.make_node("Add", ["hb", "f"], ["s"], name="add"),
        helper.make_node("Gemm", ["s", "wc"], ["hc"], name="c"),
        helper.make_node("Shape", ["r"], ["shape"], name="shape"),
        helper.make_node("Reshape", ["hc", "shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(w, n) for n, w in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((n, 8)).astype(np.float32)} for n in (5, 3)]


def _from_inputs(model: onnx.ModelProto, tensor: str, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    session = computing(model, [tensor])
    return [session.run([tensor], batch)[0] for batch in batches]


@pytest.mark.parametrize("cap", [layer_inputs.FRONTIER_MAX_BYTES, 1])
def test_each_tensor_is_what_the_model_computes_with_the_layers_changed_before_it(monkeypatch, cap):
    """Asked in graph order, with each layer changed after its input is read (as the re-fit does):
    every answer equals a fresh computation from the model's inputs with the weights of then,
    whether the frontier is held (the residual, the Shape's and the If's outer input across cuts)
    or dropped at once for being over the cap (everything from the inputs)."""
    monkeypatch.setattr(layer_inputs, "FRONTIER_MAX_BYTES", cap)
    model, batches = _residual_net(), _batches()
    inputs = LayerInputs(model, batches)
    for tensor, weight in (("x", "wa"), ("r", "wb"), ("r", None), ("s", "wc"), ("y", None)):
        got = list(inputs(tensor))
        want = _from_inputs(model, tensor, batches)
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        if weight:
            set_array(model, weight, get_array(model, weight) * 0.5 + 0.25)  # the layer re-fitted in place
    held = sum(v.nbytes for values in inputs.held.values() for v in values)
    assert held <= cap or set(inputs.held) == {"x"}


def test_a_held_segment_runs_only_the_nodes_after_the_last_cut(monkeypatch):
    """What makes it fast: the second layer's input runs the Relu's consumers onward, not the first
    Gemm again (the first Gemm is poisoned after its output was taken: a re-run would show it)."""
    model, batches = _residual_net(), _batches()
    inputs = LayerInputs(model, batches)
    first = list(inputs("r"))
    set_array(model, "wa", np.full((8, 8), np.nan, np.float32))
    second = list(inputs("s"))
    assert all(np.isfinite(s).all() for s in second)
    assert np.array_equal(first[0], next(iter(inputs("r"))))


def test_a_sequence_on_the_way_is_streamed_and_not_held():
    """A tensor sequence across a cut (made on the way to one layer's input, read on the way to the
    next's) cannot be fed to a segment as a tensor: nothing is held, and the next layer's input is
    computed from the model's inputs."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1"], ["h"], name="first"),
            helper.make_node("SequenceConstruct", ["h", "h"], ["seq"], name="seq"),
            helper.make_node(
                "Constant", [], ["zero"], name="zero", value=numpy_helper.from_array(np.array(0, np.int64))
            ),
            helper.make_node("SequenceAt", ["seq", "zero"], ["h0"], name="at"),
            helper.make_node("Gemm", ["h0", "w2"], ["g"], name="second"),
            helper.make_node("ConcatFromSequence", ["seq"], ["c"], name="concat", axis=1),
            helper.make_node("Gemm", ["c", "w3"], ["y"], name="third"),
        ],
        "sequence",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("g", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n)
            for n, s in (("w1", (4, 4)), ("w2", (4, 4)), ("w3", (8, 2)))
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    batches = [{"x": rng.standard_normal((3, 4)).astype(np.float32)}]
    inputs = LayerInputs(model, batches)
    for tensor in ("x", "h", "h0", "c"):
        np.testing.assert_array_equal(next(iter(inputs(tensor))), _from_inputs(model, tensor, batches)[0])
        if tensor == "h0":  # the segment to it made the sequence the concatenation reads later
            assert set(inputs.held) == {"x"}


def test_efficientnet_lite0_layer_by_layer_with_each_layer_pruned_after_its_input(zoo_models, tmp_path):
    """The real network as exported (folded BatchNorm, ReLU6 as Clip, residual Adds, a Flatten
    reading a Shape): every layer's input on real photos, each layer's weights pruned by 30 % right
    after (as the re-fit changes them), equals the same model's from its inputs, and the frontier
    was held, not streamed."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    source = zoo_models.efficientnet_lite0(tmp_path)
    with unideploy.export(source, tmp_path / "eff.udp", input_shapes=["x:1x3x224x224"]) as pkg:
        model = load_for_pruning(pkg.path_of("onnx-fp32"))[0]
    photos = zoo_models.imagenet_photos(6)
    batches = [{"x": photos[:4]}, {"x": photos[4:]}]
    inputs, held = LayerInputs(model, batches), 0
    layers = linear_layers(model)
    assert len(layers) == 34
    for layer in layers:
        got = list(inputs(layer.node.input[0]))
        for g, w in zip(got, _from_inputs(model, layer.node.input[0], batches)):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * float(np.abs(w).max()))
        held = max(held, len(inputs.held))
        weight = layer.matrix(model)
        layer.store(model, weight * (np.abs(weight) > np.quantile(np.abs(weight), 0.3)), None)
    assert held >= 2  # a residual's start beside the layer's input
