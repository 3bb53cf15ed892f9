"""Magnitude pruning weighs each weight by the input it multiplies (Wanda's criterion)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import unideploy


def test_a_small_weight_on_a_large_input_outlives_a_large_weight_on_a_small_one(tmp_path):
    """Features 0-1 carry values near 100 through weights of 0.1; features 2-3 values near 0.01
    through weights of 1. Raw magnitudes would zero the weights that make the output."""
    weight = np.array([[0.1, -0.1], [0.1, 0.1], [1.0, 1.0], [-1.0, 1.0]], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")],
        "wanda",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    x = np.hstack([rng.normal(100, 5, (64, 2)), rng.normal(0, 0.01, (64, 2))]).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x)
    unideploy.export(tmp_path / "m.onnx", tmp_path / "m.udp", example_inputs={"x": x[:4]}).close()

    with unideploy.optimize(tmp_path / "m.udp", prune=0.5, refit=False, calibration=tmp_path / "data.npz") as pkg:
        pruned = numpy_helper.to_array(onnx.load(str(pkg.path_of("onnx-sparse50"))).graph.initializer[0])
        assert (pruned[:2] == weight[:2]).all() and (pruned[2:] == 0).all()
        assert pkg.manifest.optimizations[-1]["passes"][0]["params"]["scope"] == "row"
        assert pkg.manifest.optimizations[-1]["accuracy"]["within_budget"]


def test_efficientnet_lite0_keeps_its_predictions_with_30_percent_pruned_before_any_refit(zoo_models, tmp_path):
    """The real network, BatchNorm folded into every convolution: zeroing the 30 % raw-smallest
    weights kept 6 % of its top-1 predictions on these photos; weighed by their inputs, most."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    source = zoo_models.efficientnet_lite0(tmp_path)
    np.savez(tmp_path / "photos.npz", x=zoo_models.imagenet_photos(32))
    unideploy.export(source, tmp_path / "eff.udp", input_shapes=["x:1x3x224x224"]).close()
    with unideploy.optimize(
        tmp_path / "eff.udp", prune=0.3, refit=False, calibration=tmp_path / "photos.npz", max_accuracy_drop=100.0
    ) as pkg:
        record = pkg.manifest.optimizations[-1]
        assert record["passes"][0]["params"]["achieved_sparsity"] >= 0.3
        assert record["accuracy"]["outputs"]["output"]["top1_agreement"] >= 0.5, record["accuracy"]


def test_a_model_quantized_already_is_refused_with_what_to_prune_instead(tmp_path):
    """ONNX Runtime's dynamic quantization leaves DynamicQuantizeLinear + MatMulInteger and no float
    weight (ddddocr's recognizer ships that way). Its package's artifact is onnx-int8, which the
    optimizers refuse as a base; named with --artifact, pruning says why it cannot."""
    from console import assert_one_line_error, deploy
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")],
        "quantized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "float.onnx"))
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    unideploy.export(tmp_path / "int8.onnx", tmp_path / "pkg").close()
    np.savez(tmp_path / "data.npz", x=np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32))
    result = deploy("optimize", tmp_path / "pkg", "--prune", "0.3", "--calibration", tmp_path / "data.npz")
    assert_one_line_error(result, 2, "'onnx-int8' computes in int8 already, as its source model does")
    assert "export the fp32 model it was made from" in result.stderr
    result = deploy(
        "optimize",
        tmp_path / "pkg",
        "--artifact",
        "onnx-int8",
        "--prune",
        "0.3",
        "--calibration",
        tmp_path / "data.npz",
    )
    assert_one_line_error(result, 2, r"already quantized \(DynamicQuantizeLinear, MatMulInteger\)")
    assert "prune the float model, then quantize it" in result.stdout + result.stderr


def test_a_layer_too_wide_to_refit_keeps_its_pruned_weights_and_says_so(tmp_path):
    """A layer with more inputs than ``REFIT_MAX_INPUTS`` (CREPE's 1,024-channel 64-tap convolution
    has 65,537: 32 GB per least-squares system) is pruned but not re-fitted, and the command and
    the record name it; the narrow layer after it is still re-fitted. Before, such a model stopped
    the command with an internal MemoryError."""
    from console import deploy

    from unideploy.optimizers.graph import REFIT_MAX_INPUTS

    wide, rng = REFIT_MAX_INPUTS + 7, np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="wide"), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", wide])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [
            numpy_helper.from_array(rng.normal(0, wide**-0.5, (wide, 16)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(0, 0.25, (16, 4)).astype(np.float32), "w2"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((64, wide)).astype(np.float32))
    unideploy.export(tmp_path / "m.onnx", tmp_path / "m.udp").close()
    result = deploy(
        "optimize", tmp_path / "m.udp", "--prune", "0.3", "--calibration", tmp_path / "data.npz",
        "--max-accuracy-drop", "100", "-o", tmp_path / "out.udp",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "not re-fitted: wide: more than 8,193 inputs each" in " ".join(result.stdout.split())
    with unideploy.open_package(tmp_path / "out.udp") as pkg:
        params = pkg.manifest.optimizations[-1]["passes"][0]["params"]
        assert params["refit"] and params["not_refitted"]["layers"] == ["wide"]


def test_a_dilated_1d_convolution_stack_is_pruned_and_refitted(tmp_path):
    """An audio model's temporal convolutions (a TCN: 1-D, dilated, padded to keep the length) are
    layers pruning edits like any other (it refused them before): every layer pruned, and the
    re-fit, which reads each output position's dilated window, brings the output nearer to fp32's
    than pruning alone does."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["audio", "w1"], ["h"], name="dilated", dilations=[4], pads=[4, 4]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("Conv", ["a", "w2", "b2"], ["y"], name="strided", strides=[2], auto_pad="SAME_UPPER"),
        ],
        "tcn",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 4, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 48])],
        [
            numpy_helper.from_array(rng.normal(0, 0.3, (16, 4, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(0, 0.15, (8, 16, 5)).astype(np.float32), "w2"),
            numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b2"),
        ],
    )
    errors = _errors_pruned_with_and_without_refit(graph, "audio", (2, 96), tmp_path)
    assert errors[True] < 0.6 * errors[False], errors  # 0.22 against 0.41


def test_a_decoders_transposed_convolution_is_pruned_and_refitted(tmp_path):
    """A segmentation decoder's upsampling (ConvTranspose, stride 2, over correlated features) is a
    layer pruning edits: pruned, and re-fitted as the convolution it equals, it comes nearer to
    fp32's output than pruning alone leaves it."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node(
                "ConvTranspose",
                ["features", "w1", "b1"],
                ["h"],
                name="up",
                strides=[2, 2],
                pads=[1, 1, 1, 1],
                output_padding=[1, 1],
            ),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("ConvTranspose", ["a", "w2"], ["y"], name="head", strides=[2, 2]),
        ],
        "decoder",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 24, 24])],
        [
            numpy_helper.from_array(rng.normal(0, 0.3, (8, 16, 3, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "b1"),
            numpy_helper.from_array(rng.normal(0, 0.3, (16, 2, 2, 2)).astype(np.float32), "w2"),
        ],
    )
    errors = _errors_pruned_with_and_without_refit(graph, "features", (4, 6, 6), tmp_path)
    assert errors[True] < 0.8 * errors[False], errors  # 0.32 against 0.43


def _errors_pruned_with_and_without_refit(graph: onnx.GraphProto, name: str, shape: tuple, tmp_path) -> dict:
    """Half of each of the graph's two layers pruned, without and with the re-fit, on rows whose
    channels come in correlated pairs (what a re-fit can recover pruned weights from): the
    relative error of output 'y' of each, by whether it was re-fitted."""
    rng = np.random.default_rng(1)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    base = rng.standard_normal((128, *shape))
    rows = np.concatenate([base, base + 0.1 * rng.standard_normal(base.shape)], axis=1).astype(np.float32)
    np.savez(tmp_path / "rows.npz", **{name: rows})
    unideploy.export(tmp_path / "m.onnx", tmp_path / "m.udp", example_inputs={name: rows[:4]}).close()
    errors = {}
    for refit in (False, True):
        with unideploy.optimize(
            tmp_path / "m.udp", prune=0.5, refit=refit, calibration=tmp_path / "rows.npz", max_accuracy_drop=100.0
        ) as pkg:
            record = pkg.manifest.optimizations[-1]
            params = record["passes"][0]["params"]
            assert params["layers"] == 2 and params["refit"] == refit and params["achieved_sparsity"] >= 0.5
            errors[refit] = record["accuracy"]["outputs"]["y"]["relative_error"]
    return errors
