"""Channel pruning of networks whose channels are coupled across layers: a residual stream with
depthwise blocks and a concatenation trained on real digits, graphs the analysis must leave whole,
and EfficientNet-Lite0's ImageNet weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import unideploy
from unideploy.errors import InputError
from unideploy.onnx.session import basic_optimized
from unideploy.optimizers.channel_groups import find_groups, remove_channels
from unideploy.optimizers.graph import name_nodes

torch = pytest.importorskip("torch", reason="the torch extra is not installed")


@pytest.fixture(scope="module")
def residual_digits(tmp_path_factory) -> dict[str, Path]:
    from models import ResidualDigitsNet, train_digits_cnn

    root = tmp_path_factory.mktemp("residual")
    model, images, labels = train_digits_cnn(network=ResidualDigitsNet)
    torch.jit.save(torch.jit.script(model), str(root / "net.pt"))
    np.savez(root / "data.npz", x=images, labels=labels)
    unideploy.export(root / "net.pt", root / "net.udp", example_inputs={"x": images[:8]}).close()
    return {"package": root / "net.udp", "data": root / "data.npz"}


def _initializer_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    return {i.name: tuple(i.dims) for i in model.graph.initializer}


def test_residual_depthwise_and_concat_channels_are_cut_together(residual_digits, tmp_path):
    with unideploy.optimize(
        residual_digits["package"],
        tmp_path / "slim.udp",
        prune=0.25,
        prune_method="channels",
        calibration=residual_digits["data"],
        max_accuracy_drop=2.0,
    ) as pkg:
        record = pkg.manifest.optimizations[-1]
        params = record["passes"][0]["params"]
        assert record["accuracy"]["within_budget"]
        assert params["pruned_convolutions"] == params["convolutions"] == 9 and params["left_whole"] == []
        # the stream: the stem and both projections; each block's expansion (through its
        # depthwise conv); each branch of the concatenation
        assert sorted((g["layers"], g["channels"], g["kept"]) for g in params["groups"]) == [
            (1, 32, 24),
            (1, 32, 24),
            (1, 96, 72),
            (1, 96, 72),
            (3, 32, 24),
        ]
        slim = onnx.load(str(pkg.path_of("onnx-slim25")))
        depthwise = [
            n for n in slim.graph.node if n.op_type == "Conv" and {a.name: a.i for a in n.attribute}.get("group", 1) > 1
        ]
        shapes = _initializer_shapes(slim)
        assert all(shapes[n.input[1]] == (72, 1, 3, 3) for n in depthwise) and len(depthwise) == 2
        assert shapes[next(n.input[1] for n in slim.graph.node if n.op_type == "Gemm")] == (10, 48 * 16)
        with np.load(residual_digits["data"]) as d:
            labels, x = d["labels"], d["x"]
        accuracy = float((unideploy.run(pkg, {"x": x}, artifact="onnx-slim25")["output"].argmax(1) == labels).mean())
        assert accuracy >= record["accuracy"]["outputs"]["output"]["accuracy_fp32"] - 0.02


def test_over_budget_the_groups_pruning_hurts_most_stay_whole(residual_digits, tmp_path):
    """Three quarters of every group's channels is more than the network can lose; left whole, the
    residual stream (or whatever loses most) brings it within budget."""
    with unideploy.optimize(
        residual_digits["package"],
        tmp_path / "slim.udp",
        prune=0.75,
        prune_method="channels",
        calibration=residual_digits["data"],
        max_accuracy_drop=1.0,
    ) as pkg:
        record = pkg.manifest.optimizations[-1]
        params = record["passes"][0]["params"]
        assert record["accuracy"]["within_budget"]
        assert params["search"]["drop_points_all_pruned"] > 1.0 and params["search"]["within_budget"]
        assert 1 <= len(params["whole_groups"]) <= 2 and params["search"]["units"] == "channel groups"
        assert len(params["groups"]) == 5 - len(params["whole_groups"])
        assert params["pruned_convolutions"] < params["convolutions"]


def _graph(nodes: list, outputs: list[str], weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return name_nodes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_groups_read_by_what_needs_every_channel_stay_whole():
    rng = np.random.default_rng(0)
    w = lambda *shape: rng.normal(size=shape)  # noqa: E731
    model = _graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], name="kept_whole_output"),  # also a model output
            helper.make_node("Conv", ["a", "w2"], ["b"], name="reshaped"),
            helper.make_node("Reshape", ["b", "shape"], ["c"], name="to_rows"),  # splits the channels
            helper.make_node("Conv", ["a", "w3"], ["d"], name="grouped_reader"),
            helper.make_node("Conv", ["d", "w4"], ["e"], name="read_by_grouped", group=2),
            helper.make_node("Conv", ["a", "w5"], ["f"], name="prunable"),
            helper.make_node("Relu", ["f"], ["g"]),
            helper.make_node("Conv", ["g", "w6"], ["h"], name="reader"),
        ],
        ["a", "c", "e", "h"],
        {
            "w1": w(8, 4, 1, 1),
            "w2": w(8, 8, 1, 1),
            "shape": np.array([1, 2, 4, 64]),
            "w3": w(8, 8, 1, 1),
            "w4": w(8, 4, 1, 1),
            "w5": w(8, 8, 1, 1),
            "w6": w(2, 8, 1, 1),
        },
    )
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.array([1, 2, 4, 64], np.int64), "shape"))
    found = find_groups(model)
    why = {g.producers[0].node.name: g.why_whole for g in found.groups.values()}
    assert why["kept_whole_output"] == "its channels are the model output 'a'"
    assert why["reshaped"] == "read by Reshape 'to_rows'"
    assert why["grouped_reader"] == "read by Conv 'read_by_grouped'"
    assert why["prunable"] is None and why["reader"] == "its channels are the model output 'h'"

    keep = {g.id: np.arange(0, 8, 2) for g in found.prunable()}
    remove_channels(model, found, keep, means={})
    shapes = _initializer_shapes(model)
    assert shapes["w5"] == (4, 8, 1, 1) and shapes["w6"] == (2, 4, 1, 1) and shapes["w1"] == (8, 4, 1, 1)


def test_a_model_without_cuttable_channels_is_refused_before_the_work(torch_models, tmp_path):
    path, shapes = torch_models["attention_traced"]
    unideploy.export(path, tmp_path / "attn.udp", input_shapes=shapes).close()
    with pytest.raises(
        InputError, match="no convolution channels can be removed from this model: it has no convolution"
    ) as raised:
        unideploy.optimize(tmp_path / "attn.udp", prune=0.5, prune_method="channels", synthetic=True)
    assert "--prune-method magnitude" in raised.value.hint


def test_efficientnet_lite0_residual_streams_are_found_and_cut_consistently(zoo_models, tmp_path):
    """The real network: 16 inverted residual blocks with depthwise convolutions, padding written
    as Constant subgraphs, ReLU6 bounds as Constant nodes and a Reshape to [batch, -1] before the
    classifier."""
    source = zoo_models.efficientnet_lite0(tmp_path)
    unideploy.export(source, tmp_path / "eff.udp", input_shapes=["x:1x3x224x224"]).close()
    # as the pass sees it: after ONNX Runtime's basic optimizations (the padding's constant subgraphs folded)
    basic_optimized(tmp_path / "eff.udp" / "artifacts" / "model.onnx", tmp_path / "basic.onnx")
    original = name_nodes(onnx.load(str(tmp_path / "basic.onnx")))
    found = find_groups(original)
    assert len(found.prunable()) == len(found.groups) == 24 and found.convolutions == 49
    streams = sorted(len(g.producers) for g in found.groups.values() if len(g.producers) > 1)
    assert streams == [2, 2, 3, 3, 4]  # the blocks sharing a width share their residual stream
    assert len(found.regrouped) == 16  # one depthwise conv per block

    import onnxruntime as ort

    photos = zoo_models.imagenet_photos(4)
    keep = {g.id: np.arange(0, g.channels, 2) for g in found.prunable()}
    slim = onnx.ModelProto()
    slim.CopyFrom(original)
    remove_channels(slim, found, keep, means={})
    del slim.graph.value_info[:]
    before = sum(numpy_helper.to_array(i).size for i in original.graph.initializer)
    after = sum(numpy_helper.to_array(i).size for i in slim.graph.initializer)
    assert after < 0.4 * before
    out = ort.InferenceSession(slim.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": photos})
    assert out[0].shape == (4, 1000) and np.isfinite(out[0]).all()


def test_a_reader_too_wide_to_refit_keeps_its_weights_and_says_so(tmp_path):
    """A convolution reading a cut group with more inputs than ``REFIT_MAX_INPUTS`` even after the
    cut (48 of 64 channels x a 15x15 kernel: 10,800) is not re-fitted, and the record names it."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="narrow"),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="wide"),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 17, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 1, 1])],
        [
            numpy_helper.from_array(rng.normal(0, 0.3, (64, 3, 3, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(np.zeros(64, np.float32), "b1"),
            numpy_helper.from_array(rng.normal(0, 0.01, (8, 64, 15, 15)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.zeros(8, np.float32), "b2"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((32, 3, 17, 17)).astype(np.float32))
    unideploy.export(tmp_path / "m.onnx", tmp_path / "m.udp").close()
    with unideploy.optimize(
        tmp_path / "m.udp",
        prune=0.25,
        prune_method="channels",
        calibration=tmp_path / "data.npz",
        max_accuracy_drop=100,
        output=tmp_path / "out.udp",
    ) as pkg:
        params = pkg.manifest.optimizations[-1]["passes"][0]["params"]
        assert params["refit"] and params["not_refitted"]["layers"] == ["wide"], params


def test_a_dilated_1d_convolutions_channels_are_cut_and_its_reader_refitted(tmp_path):
    """A temporal convolution stack (1-D, dilated, then strided with ``auto_pad``): channel pruning
    cuts the first layer's filters and the second's inputs with them, re-fits the reader over its
    windows, and the slimmer model computes what fp32 does within the budget."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["audio", "w1", "b1"], ["h"], name="dilated", dilations=[2], pads=[2, 2]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("Conv", ["a", "w2"], ["y"], name="strided", strides=[2], auto_pad="SAME_LOWER"),
        ],
        "tcn",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 4, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 48])],
        [
            # half the filters nearly silent: the channels a cut should take first
            numpy_helper.from_array(
                (rng.normal(0, 0.3, (32, 4, 3)) * np.repeat([1.0, 0.01], 16)[:, None, None]).astype(np.float32), "w1"
            ),
            numpy_helper.from_array(rng.normal(0, 0.1, 32).astype(np.float32), "b1"),
            numpy_helper.from_array(rng.normal(0, 0.15, (8, 32, 5)).astype(np.float32), "w2"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "tcn.onnx"))
    audio = rng.standard_normal((128, 4, 96)).astype(np.float32)
    np.savez(tmp_path / "audio.npz", audio=audio)
    unideploy.export(tmp_path / "tcn.onnx", tmp_path / "tcn.udp", example_inputs={"audio": audio[:4]}).close()
    with unideploy.optimize(
        tmp_path / "tcn.udp", prune=0.25, prune_method="channels", calibration=tmp_path / "audio.npz"
    ) as pkg:
        record = pkg.manifest.optimizations[-1]
        assert record["accuracy"]["within_budget"], record["accuracy"]
        assert [(g["channels"], g["kept"]) for g in record["passes"][0]["params"]["groups"]] == [(32, 24)]
        shapes = _initializer_shapes(onnx.load(str(pkg.path_of("onnx-slim25"))))
        assert shapes["w1"] == (24, 4, 3) and shapes["w2"] == (8, 24, 5)
        assert unideploy.run(pkg, {"audio": audio[:3]}, artifact="onnx-slim25")["y"].shape == (3, 8, 48)
