"""The re-fit's building blocks: the constrained least-squares solve and the cut sessions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from unideploy.optimizers.graph import (
    _solve,
    _strongest_within_noise,
    computing,
    conv_pads,
    get_array,
    linear_layers,
    name_nodes,
    refit_all,
)


@pytest.mark.parametrize(
    "op, kernel, attrs",
    [
        ("Conv", (3,), {"pads": [1, 1]}),  # an audio front end's 1-D convolution
        ("Conv", (256,), {"strides": [128]}),  # an STFT as a convolution (Silero VAD's first layer)
        ("Conv", (3,), {"dilations": [4], "pads": [4, 4]}),  # a WaveNet / TCN layer
        ("Conv", (3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 1]}),
        ("Conv", (3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}),  # DeepLab's atrous convolution
        ("Conv", (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
        ("Conv", (2, 4), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
        ("Conv", (3, 1), {"auto_pad": "VALID"}),
        ("Conv", (2, 3, 3), {"pads": [0, 1, 1, 1, 1, 1]}),  # a video model's 3-D convolution
        ("ConvTranspose", (2, 2), {"strides": [2, 2]}),  # a U-Net's upsampling
        ("ConvTranspose", (4, 3), {"strides": [2, 3], "pads": [1, 0, 1, 2], "output_padding": [1, 2]}),
        ("ConvTranspose", (3,), {"dilations": [2], "pads": [5, 1]}),  # pads beyond the kernel's reach crop
        ("ConvTranspose", (16,), {"strides": [8], "pads": [4, 4]}),  # a vocoder's (HiFi-GAN's) upsampling
        ("ConvTranspose", (3, 3), {"auto_pad": "VALID"}),
    ],
)
def test_a_convolutions_input_windows_times_its_weights_are_what_it_computes(op, kernel, attrs):
    """The re-fit reads a convolution as windows of its input times its weight matrix: for any
    dimension, stride, dilation and padding (explicit or ``auto_pad``), and for a transposed
    convolution as the convolution it equals, that product is what ONNX Runtime computes, so the
    least squares fit what the layer does; storing the matrix back gives the weight it came from."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    sizes = {1: (600,), 2: (11, 9), 3: (5, 7, 6)}[len(kernel)]
    x = rng.standard_normal((2, 3, *sizes)).astype(np.float32)
    w = rng.standard_normal((4, 3, *kernel) if op == "Conv" else (3, 4, *kernel)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w"], ["y"], name="conv", **attrs)],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[
        0
    ]
    (layer,) = linear_layers(model)
    product = layer.columns(x, model).rows() @ layer.matrix(model).T.astype(np.float64)
    positions = expected.shape[2:]
    assert product.shape == (2 * int(np.prod(positions)), 4)
    np.testing.assert_allclose(np.moveaxis(product.reshape(2, *positions, 4), -1, 1), expected, rtol=1e-4, atol=1e-4)
    layer.store(model, layer.matrix(model), None)
    np.testing.assert_array_equal(get_array(model, "w"), w)


def test_same_padding_puts_the_odd_pad_where_the_mode_says():
    attrs = {"auto_pad": "SAME_LOWER"}
    assert conv_pads(attrs, (10,), [4], [3]) == [2, 1]  # 4 output positions need 13 inputs: 3 padded
    assert conv_pads({"auto_pad": b"SAME_UPPER"}, (10,), [4], [3]) == [1, 2]
    assert conv_pads({"pads": [1, 2]}, (10,), [4], [3]) == [1, 2]


def _one_row_at_a_time(gram, target, prior, keep, damping, rows):
    """The definition: each row's kept weights solve (G_SS + pI) w_S = b_S on their own."""
    pull = damping * float(np.mean(np.diag(gram)))
    out = np.zeros((len(rows), keep.shape[1]))
    for i, r in enumerate(rows):
        kept = keep[r]
        if kept.any():
            system = gram[np.ix_(kept, kept)] + np.eye(int(kept.sum())) * pull
            out[i, kept] = np.linalg.solve(system, target[kept, r] + pull * prior[r, kept])
    return out


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("damping", [1e-3, 1.0])
def test_solve_matches_one_row_at_a_time_at_any_sparsity(sparsity, damping):
    """Below 50 % the rows are solved through the inverse and the pruned inputs' multipliers,
    above it on their kept inputs; both must be the per-row solution, with rows of different
    counts (one row left whole, one emptied) and pruned weights exactly zero."""
    rng = np.random.default_rng(0)
    k, r = 48, 30
    features = rng.normal(size=(400, k)) @ rng.normal(size=(k, k))  # correlated inputs, like im2col
    gram, target, prior = features.T @ features, rng.normal(size=(k, r)) * 50, rng.normal(size=(r, k))
    keep = rng.random((r, k)) >= sparsity
    keep[3], keep[5] = True, False
    rows = np.arange(r)
    got = _solve(gram, target, prior, keep, damping, rows)
    want = _one_row_at_a_time(gram, target, prior, keep, damping, rows)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * np.abs(want).max())
    assert not got[~keep].any()


def test_solve_shared_masks_and_a_subset_of_rows():
    rng = np.random.default_rng(1)
    k, r = 32, 24
    features = rng.normal(size=(300, k))
    gram, target, prior = features.T @ features, rng.normal(size=(k, r)), rng.normal(size=(r, k))
    structured = np.tile(rng.random(k) > 0.5, (r, 1))  # channel pruning: one mask for every row
    np.testing.assert_allclose(
        _solve(gram, target, prior, structured, 1e-2, np.arange(r)),
        _one_row_at_a_time(gram, target, prior, structured, 1e-2, np.arange(r)),
        atol=1e-10,
    )
    keep, rows = rng.random((r, k)) >= 0.3, np.arange(0, r, 5)
    np.testing.assert_allclose(
        _solve(gram, target, prior, keep, 1e-3, rows),
        _one_row_at_a_time(gram, target, prior, keep, 1e-3, rows),
        atol=1e-10,
    )


def _model_with_branch() -> onnx.ModelProto:
    """x -> Relu -> a; a -> Neg -> b; an If whose branches read the outer ``a``; and a Reshape of
    ``b`` that cannot run (6 values into 7), which no cut session may include."""
    flag = numpy_helper.from_array(np.array(True), "flag")
    wrong = numpy_helper.from_array(np.array([7], np.int64), "wrong")
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("If", ["flag"], ["c"], name="if", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Add", ["c", "b"], ["d"], name="add"),
        helper.make_node("Reshape", ["b", "wrong"], ["broken"], name="broken"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("d", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("broken", TensorProto.FLOAT, None),
        ],
        [flag, wrong],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_session_computes_only_what_the_tensors_need():
    model = _model_with_branch()
    x = {"x": np.array([[-1.0, 2.0, 3.0], [4.0, -5.0, 6.0]], np.float32)}
    relu = np.maximum(x["x"], 0)
    (b,) = computing(model, ["b"]).run(["b"], x)
    np.testing.assert_array_equal(b, -relu)
    c, a = computing(model, ["c", "a"]).run(["c", "a"], x)  # the If reads `a` from the enclosing graph
    np.testing.assert_array_equal(c, relu)
    np.testing.assert_array_equal(a, relu)
    (d,) = computing(model, ["d"]).run(["d"], x)
    np.testing.assert_array_equal(d, 0 * relu)
    with pytest.raises(Exception, match="(?i)reshape"):
        computing(model, ["broken"]).run(["broken"], x)


def _mlp() -> onnx.ModelProto:
    """x [batch, 12] -> Gemm -> Relu -> Gemm -> Relu -> MatMul: three layers to prune and re-fit."""
    rng = np.random.default_rng(1)
    weights = {"w1": (12, 16), "b1": (16,), "w2": (16, 16), "b2": (16,), "w3": (16, 4)}
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="first"),
            helper.make_node("Relu", ["h1"], ["r1"]),
            helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], name="second"),
            helper.make_node("Relu", ["h2"], ["r2"]),
            helper.make_node("MatMul", ["r2", "w3"], ["y"], name="third"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(rng.normal(0, 0.4, s).astype(np.float32), n) for n, s in weights.items()],
    )
    return name_nodes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_search_candidate_takes_the_refits_before_its_first_dense_layer_from_the_memo():
    """Leaving only the last layer dense changes nothing the first two are re-fitted from: they
    come from the pass's memo (no re-fit said), with the same weights a fresh re-fit gives; leaving
    the first dense re-fits the second again, since its inputs changed."""
    original = _mlp()
    rng = np.random.default_rng(2)
    batches = [{"x": rng.standard_normal((64, 12)).astype(np.float32)} for _ in range(2)]
    masks = {
        layer.node.name: np.abs(layer.matrix(original)) > np.quantile(np.abs(layer.matrix(original)), 0.4)
        for layer in linear_layers(original)
    }

    def pruned(dense: set[str]) -> onnx.ModelProto:
        model = onnx.ModelProto()
        model.CopyFrom(original)
        for layer in linear_layers(model):
            if layer.node.name not in dense:
                bias = get_array(model, layer.bias) if layer.bias else None
                layer.store(model, layer.matrix(model) * masks[layer.node.name], bias)
        return model

    def refitted(dense: set[str], memo: dict | None) -> tuple[dict[str, np.ndarray], list[str]]:
        model, said = pruned(dense), []
        kept = {n: m for n, m in masks.items() if n not in dense}
        assert refit_all(original, model, kept, batches, said.append, memo) == []
        return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}, said

    memo: dict = {}
    refitted(set(), memo)
    weights, said = refitted({"third"}, memo)
    assert said == [] and all(np.array_equal(weights[n], w) for n, w in refitted({"third"}, None)[0].items())
    weights, said = refitted({"first"}, memo)
    assert said == ["re-fitting layer 1/2 (second)", "re-fitting layer 2/2 (third)"]
    assert all(np.array_equal(weights[n], w) for n, w in refitted({"first"}, None)[0].items())


def _pruned(original: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Half of every layer's weights zeroed, and the masks."""
    masks = {
        layer.node.name: np.abs(layer.matrix(original)) > np.quantile(np.abs(layer.matrix(original)), 0.5)
        for layer in linear_layers(original)
    }
    model = onnx.ModelProto()
    model.CopyFrom(original)
    for layer in linear_layers(model):
        bias = get_array(model, layer.bias) if layer.bias else None
        layer.store(model, layer.matrix(model) * masks[layer.node.name], bias)
    return model, masks


def test_the_refit_does_not_depend_on_how_the_rows_are_batched():
    """A batch-1 model streams one row a batch to its pooled and final layers. The rows held out to
    choose the damping are counted over the whole stream: counted per batch, every such row was
    held out and nothing was fitted (MediaPipe's squeeze-and-excitation layers kept their pruned
    weights, and the damping was chosen among equal errors at random)."""
    original, rows = _mlp(), np.random.default_rng(3).standard_normal((60, 12)).astype(np.float32)
    batchings = {"one batch": [{"x": rows}], "one row a batch": [{"x": row[None]} for row in rows]}
    refitted = {}
    for batching, batches in batchings.items():
        model, masks = _pruned(original)
        assert refit_all(original, model, masks, batches, lambda _msg: None) == []
        refitted[batching] = {layer.node.name: layer.matrix(model) for layer in linear_layers(model)}
    pruned, _ = _pruned(original)
    for layer in linear_layers(pruned):
        name = layer.node.name
        np.testing.assert_allclose(refitted["one row a batch"][name], refitted["one batch"][name], rtol=1e-5, atol=1e-6)
        if name != "first":  # whose inputs pruning changed: re-fitted, not kept as pruned
            assert not np.allclose(refitted["one row a batch"][name], layer.matrix(pruned))


def test_a_layer_with_many_positions_is_refitted_on_a_sample_of_them_whatever_the_batching(monkeypatch):
    """A convolution gives a row per output position, so a full-resolution layer has millions of
    rows for a few inputs; the re-fit reads a sample of them (here capped at 1,024 rows for 37
    inputs, one in 7 of the 7,200), the same rows however the images are batched, and fits the
    layer nearly as well as all of them do."""
    import onnxruntime as ort

    from unideploy.optimizers import graph

    rng = np.random.default_rng(4)
    model = name_nodes(
        helper.make_model(
            helper.make_graph(
                [
                    helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="first", pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["h"], ["r"]),
                    helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="second", pads=[1, 1, 1, 1]),
                ],
                "convs",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 30, 30])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 30, 30])],
                [
                    numpy_helper.from_array(rng.normal(0, 0.4, (4, 2, 3, 3)).astype(np.float32), "w1"),
                    numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b1"),
                    numpy_helper.from_array(rng.normal(0, 0.3, (3, 4, 3, 3)).astype(np.float32), "w2"),
                    numpy_helper.from_array(rng.normal(0, 0.1, 3).astype(np.float32), "b2"),
                ],
            ),
            opset_imports=[helper.make_opsetid("", 17)],
        )
    )
    images = rng.standard_normal((8, 2, 30, 30)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": images})[0]

    def refitted(batches: list) -> tuple[onnx.ModelProto, float]:
        pruned, masks = _pruned(model)
        assert refit_all(model, pruned, masks, batches, lambda _msg: None) == []
        got = ort.InferenceSession(pruned.SerializeToString()).run(None, {"x": images})[0]
        return pruned, float(np.linalg.norm(got - expected) / np.linalg.norm(expected))

    _, all_rows = refitted([{"x": images}])
    monkeypatch.setattr(graph, "REFIT_MIN_POSITIONS", 1024)
    monkeypatch.setattr(graph, "REFIT_ROWS_PER_INPUT", 8)
    assert graph._sampling(7200 // 8, [{"x": images[:1]}] * 8, 37) == 7
    together, sampled = refitted([{"x": images}])
    apart, _ = refitted([{"x": image[None]} for image in images])
    for layer in linear_layers(together):
        np.testing.assert_allclose(layer.matrix(together), layer.matrix(apart), rtol=1e-5, atol=1e-6)
    assert sampled != all_rows and sampled < 1.02 * all_rows, (sampled, all_rows)  # 0.2729 against 0.2716


def test_held_out_errors_closer_than_their_noise_choose_the_stronger_pull():
    """Ordered strongest first: a weaker damping must beat a stronger one by more than 0.1 %."""
    signal = 100.0
    assert _strongest_within_noise({None: 10.0, 1.0: 5.0, 0.1: 4.999, 0.01: 4.9995}, signal) == 1.0
    assert _strongest_within_noise({None: 10.0, 1.0: 5.0, 0.1: 4.9, 0.01: 4.8999}, signal) == 0.1
    assert _strongest_within_noise({None: 2.0, 1.0: 2.0, 0.1: 2.0}, signal) is None  # equal: the pruned weights
    assert _strongest_within_noise({None: 1e-8, 1.0: 0.0}, signal) is None  # within rounding of the signal
