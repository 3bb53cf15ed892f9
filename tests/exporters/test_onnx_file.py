"""Importing existing .onnx files: signature, checker, and clean failures on bad models."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from console import assert_one_line_error, deploy
from onnx import TensorProto, helper, numpy_helper

import unideploy
from unideploy.errors import ExportError, InputError

IR_VERSION = 9  # what torch.onnx writes; onnx's own default can be newer than onnxruntime reads


def _mlp(path, dim_param: str | int = "N") -> None:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim_param, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim_param, 3])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), str(path))


def test_import_reads_the_signature_and_validates(tmp_path):
    _mlp(tmp_path / "mlp.onnx", "batch size")  # a dim name that is not an identifier
    with unideploy.export(tmp_path / "mlp.onnx", tmp_path / "pkg.zip") as package:
        sig = package.manifest.signature
        assert sig.inputs[0].shape == ("batch_size", 4) and sig.outputs[0].shape == ("batch_size", 3)
        assert package.manifest.source["framework"] == "onnx" and package.manifest.source["path"] is None
        assert package.manifest.artifacts[0].opset == 17
        assert package.manifest.validation["onnx-fp32"]["passed"]
        x = np.ones((5, 4), np.float32)
        assert unideploy.run(package, {"x": x})["y"].shape == (5, 3)


def test_a_dim_named_with_a_digit_int_refuses_stays_dynamic(tmp_path):
    _mlp(tmp_path / "mlp.onnx", "\u00b2")  # "²" is a digit to str.isdigit, not to int()
    with unideploy.export(tmp_path / "mlp.onnx", tmp_path / "pkg") as package:
        dim = package.manifest.signature.inputs[0].shape[0]
        assert isinstance(dim, str)
        assert unideploy.run(package, {"x": np.ones((2, 4), np.float32)})["y"].shape == (2, 3)


def test_exported_torch_onnx_reimports(cnn_package, tmp_path):
    with unideploy.export(cnn_package / "artifacts" / "model.onnx", tmp_path / "again") as package:
        assert package.manifest.signature.inputs[0].shape == ("batch", 1, 8, 8)


def test_garbage_file_is_refused(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(InputError, match="'.*bad.onnx' is not a readable ONNX model"):
        unideploy.export(bad, tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_checker_failure_is_reported(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "broken.onnx"))
    with pytest.raises(ExportError, match="fails the ONNX checker"):
        unideploy.export(tmp_path / "broken.onnx", tmp_path / "pkg")


def test_operator_onnxruntime_lacks_is_named(tmp_path):
    node = helper.make_node("FancyOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)], ir_version=IR_VERSION
    )
    onnx.save(model, str(tmp_path / "custom.onnx"))
    with pytest.raises(ExportError, match="FancyOp"):
        unideploy.export(tmp_path / "custom.onnx", tmp_path / "pkg")


def test_a_size_declared_open_that_the_graph_fixes_is_named_with_how_to_pin_it(tmp_path):
    """An ONNX file whose input width is open in its signature but fixed by a weight (as an
    exporter's dynamic axes can make one): the example runs and its crop to a second width fails.
    The export says which size it cannot vary and how to pin it, as one line, writes nothing, and
    pinned as it says, exports."""
    from onnx_models import fixed_width_model

    model = fixed_width_model(tmp_path / "fixed.onnx")
    np.savez(tmp_path / "example.npz", x=np.ones((2, 4), np.float32))
    refused = deploy("export", model, "-o", tmp_path / "pkg", "--example-input", tmp_path / "example.npz")
    assert_one_line_error(
        refused,
        1,
        r"the model declares sizes open that it cannot vary: 'x' axis 1 \('width'\) runs at 4 but not at 3 "
        r"\(ONNX Runtime failed on inputs of shape x \[\d, 3\]: .*MatMul.*\) "
        r"\(where those are the only sizes it takes, fix them: --input-shape x:2x4\)",
    )
    assert not (tmp_path / "pkg").exists()
    pinned = deploy(
        "export", model, "-o", tmp_path / "pkg", "--example-input", tmp_path / "example.npz", "--input-shape", "x:2x4"
    )
    assert pinned.returncode == 0, pinned.stderr
    with unideploy.open_package(tmp_path / "pkg") as package:
        assert package.manifest.signature.inputs[0].shape == ("batch", 4)


def test_input_shape_for_an_unknown_input_is_refused(tmp_path):
    _mlp(tmp_path / "mlp.onnx")
    with pytest.raises(InputError, match="does not take"):
        unideploy.export(tmp_path / "mlp.onnx", tmp_path / "pkg", input_shapes=["z:1x4"])


def test_model_newer_than_onnxruntime_is_explained(tmp_path):
    path = tmp_path / "new.onnx"
    _mlp(path)
    model = onnx.load(str(path))
    model.ir_version = onnx.IR_VERSION  # the newest the checker knows; onnxruntime often lags behind
    onnx.save(model, str(path))
    try:
        unideploy.export(path, tmp_path / "pkg").close()
    except ExportError as exc:
        assert re.search(r"Unsupported model IR version: \d+, max supported IR version: \d+$", exc.message)
        assert "onnxruntime_src" not in exc.message


def test_the_artifact_has_the_ir_version_its_operator_sets_need(tmp_path):
    """onnx 1.23 writes IR 14 into every model it saves, and ONNX Runtime Web 1.30 refused such a
    file ("Unsupported model IR version: 14, max supported IR version: 13") though an opset-17 graph
    needs IR 8: the artifact is written with the IR version its operator sets need, never newer than
    the model's own; a model with functions of its own keeps its version."""
    path = tmp_path / "new.onnx"
    _mlp(path)
    model = onnx.load(str(path))
    model.ir_version = 13  # newer than opset 17 needs, and read by the onnxruntime here
    onnx.save(model, str(path))
    with unideploy.export(path, tmp_path / "pkg") as package:
        written = onnx.load(str(package.path_of(package.manifest.artifacts[0])))
        assert written.ir_version == 8 and package.manifest.validation["onnx-fp32"]["passed"]
    from unideploy.onnx.files import oldest_ir_version

    model.functions.append(
        helper.make_function(
            "local", "f", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], [helper.make_opsetid("", 17)]
        )
    )
    assert oldest_ir_version(model) == 13
    model.ir_version = 6  # older than needed stays: it is the model's own claim, and the checker's to judge
    del model.functions[:]
    assert oldest_ir_version(model) == 6


def _external_mlp(folder, location: str = "weights.bin"):
    folder.mkdir(parents=True, exist_ok=True)
    _mlp(folder / "inline.onnx")
    model = onnx.load(str(folder / "inline.onnx"))
    onnx.save(model, str(folder / "mlp.onnx"), save_as_external_data=True, location=location, size_threshold=0)
    return folder / "mlp.onnx"


@pytest.mark.parametrize("output", ["pkg", "pkg.zip"])
def test_external_data_model_is_packaged_with_its_weights(tmp_path, output):
    src = _external_mlp(tmp_path / "model")
    with unideploy.export(src, tmp_path / output) as package:
        artifact = package.manifest.artifact("onnx-fp32")
        assert [f["path"] for f in artifact.files] == ["artifacts/model.onnx.data"]
        assert (package.root / "artifacts" / "model.onnx.data").stat().st_size >= 4 * 3 * 4
        from unideploy.verify import verify_package

        assert [c.status for c in verify_package(package)] == ["passed"]
        x = np.ones((2, 4), np.float32)
        expected = np.maximum(
            x @ numpy_helper.to_array(onnx.load(str(tmp_path / "model" / "inline.onnx")).graph.initializer[0]), 0
        )
        np.testing.assert_allclose(unideploy.run(package, {"x": x})["y"], expected, rtol=1e-6)


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    src = _external_mlp(tmp_path / "model")
    model = onnx.load(str(src), load_external_data=False)
    (tmp_path / "stolen.bin").write_bytes((tmp_path / "model" / "weights.bin").read_bytes())
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../stolen.bin"
    onnx.save(model, str(src))
    result = deploy("export", src, "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, r"reads tensor 'w' from '\.\./stolen\.bin', outside the model's folder")
    assert not (tmp_path / "pkg").exists()


def test_missing_or_truncated_external_data_is_refused(tmp_path):
    src = _external_mlp(tmp_path / "model")
    data = tmp_path / "model" / "weights.bin"
    data.write_bytes(data.read_bytes()[:10])
    assert_one_line_error(deploy("export", src, "-o", tmp_path / "pkg"), 2, "is truncated|reads up to byte")
    data.unlink()
    assert_one_line_error(deploy("export", src, "-o", tmp_path / "pkg"), 2, "from 'weights.bin', which does not exist")


def scaled_by_rate(path) -> None:
    """y = x * rate, with ``rate`` an int64 scalar input (rank 0), as audio models take a sample rate."""
    nodes = [
        helper.make_node("Cast", ["rate"], ["rate_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "rate_f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("rate", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_a_scalar_input_stays_a_scalar_from_example_inputs_to_the_server(tmp_path):
    """A rank-0 input given as a 0-d array in --example-input is kept rank 0 through export, the
    stored samples, run, verify and a served request (numpy's ascontiguousarray made it shape [1], then refused)."""
    scaled_by_rate(tmp_path / "scaled.onnx")
    # without one, a random integer cannot stand for a sample rate: refused, asking for a real value
    refused = deploy("export", str(tmp_path / "scaled.onnx"), "-o", str(tmp_path / "random"), "--input-shape", "x:2x4")
    assert_one_line_error(refused, 2, r"input\(s\) 'rate' take one integer value \(rank 0\).*--example-input")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.savez(tmp_path / "example.npz", x=x, rate=np.array(16000, np.int64))
    result = deploy(
        "export",
        str(tmp_path / "scaled.onnx"),
        "-o",
        str(tmp_path / "pkg"),
        "--example-input",
        str(tmp_path / "example.npz"),
    )
    assert result.returncode == 0, result.stderr
    with unideploy.open_package(tmp_path / "pkg") as pkg:
        assert [s.shape for s in pkg.manifest.signature.inputs] == [("N", 4), ()]
        assert all(sample.inputs["rate"].shape == () for sample in pkg.reference_samples())
    out = unideploy.run(tmp_path / "pkg", {"x": x, "rate": np.array(8000, np.int64)})["y"]
    np.testing.assert_allclose(out, x * 8000, rtol=1e-6)
    assert deploy("verify", str(tmp_path / "pkg")).returncode == 0
    # served: a scalar in a REST request (shape []) and in tritonclient's gRPC one
    import shutil

    from serving import start_server, stop_server

    shutil.copytree(tmp_path / "pkg", tmp_path / "repo" / "scaled" / "1")
    server = start_server(tmp_path / "repo", tmp_path, "--frontends", "0")
    try:
        body = {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [3, 4], "data": x.ravel().tolist()},
                {"name": "rate", "datatype": "INT64", "shape": [], "data": [2]},
            ]
        }
        answer = server.client().post("/v2/models/scaled/infer", json=body)
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(np.reshape(answer.json()["outputs"][0]["data"], (3, 4)), x * 2, rtol=1e-6)
    finally:
        stop_server(server)


def _scaled_by_setting(path):
    """y = x * gain, with gain an int64 scalar input (a setting, as a sample rate is)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["gain"], ["g"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "g"], ["y"])],
        "scaled",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("gain", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_constant_binds_an_onnx_settings_input_and_refuses_what_one_value_cannot_fill(tmp_path):
    import json

    model = _scaled_by_setting(tmp_path / "scaled.onnx")
    made = deploy("export", model, "-o", tmp_path / "pkg", "--input-shape", "x:2x4", "--constant", "gain=3")
    assert made.returncode == 0, made.stderr
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["source"]["constants"] == {"gain": 3}
    assert [t["name"] for t in manifest["signature"]["inputs"]] == ["x"]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(unideploy.run(tmp_path / "pkg", {"x": x})["y"], 3 * x)
    for constant, pattern in (
        ("nope=1", r"--constant nope: the model has no such input.*its inputs: x, gain"),
        ("x=1", r"--constant x: input 'x' is float32 \[batch, 4\], which one value cannot fill"),
        ("gain=loud", r"--constant gain='loud' is no int64 value"),
    ):
        refused = deploy("export", model, "-o", tmp_path / "bad", "--input-shape", "x:2x4", "--constant", constant)
        assert_one_line_error(refused, 2, pattern)
    assert not (tmp_path / "bad").exists()


def test_constant_folds_the_branch_its_setting_decides_so_later_stages_reach_its_layers(tmp_path):
    """y = If(rate == 16000, then: x @ w16, else: x @ w8), as Silero VAD branches on its sample
    rate: bound with --constant, the artifact holds the taken branch's MatMul at the top level (the
    quantizer and pruners edit only that level) and the other branch's weights are gone; it gives
    the model's own answers for that rate."""
    import json

    rng = np.random.default_rng(0)
    weights = {rate: rng.standard_normal((4, 3)).astype(np.float32) for rate in (16000, 8000)}

    def branch(rate: int) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("MatMul", ["x", f"w{rate}"], [f"y{rate}"])],
            f"at_{rate}",
            [],
            [helper.make_tensor_value_info(f"y{rate}", TensorProto.FLOAT, ["batch", 3])],
            [numpy_helper.from_array(weights[rate], f"w{rate}")],
        )

    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["wide"], value=numpy_helper.from_array(np.array(16000, np.int64))),
            helper.make_node("Equal", ["rate", "wide"], ["is_wide"]),
            helper.make_node("If", ["is_wide"], ["y"], then_branch=branch(16000), else_branch=branch(8000)),
        ],
        "by_rate",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("rate", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    model = tmp_path / "by_rate.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), str(model))
    made = deploy("export", model, "-o", tmp_path / "pkg", "--input-shape", "x:2x4", "--constant", "rate=8000")
    assert made.returncode == 0, made.stderr
    artifact = onnx.load(str(tmp_path / "pkg" / "artifacts" / "model.onnx"))
    assert [n.op_type for n in artifact.graph.node] == ["MatMul"]
    [kept] = [numpy_helper.to_array(t) for t in artifact.graph.initializer]
    np.testing.assert_array_equal(kept, weights[8000])
    assert json.loads((tmp_path / "pkg" / "manifest.json").read_text())["validation"]["onnx-fp32"]["passed"]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(unideploy.run(tmp_path / "pkg", {"x": x})["y"], x @ weights[8000], rtol=1e-6)


def test_rows_that_interact_keep_the_default_tolerance_and_a_fixed_batch_runs_whole(tmp_path):
    """An ONNX source is also run on each row alone: where that moves an output by rounding, its
    conversions are held to twice that (Magika, tests/test_zoo.py). Rows centred on their batch's
    mean differ by far more alone (each becomes 0): that is another computation, not rounding,
    and the output keeps the default tolerance. A model of fixed batch is run whole only."""
    axis = numpy_helper.from_array(np.array([0], np.int64), "axis")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x", "axis"], ["mean"], keepdims=1),
            helper.make_node("Sub", ["x", "mean"], ["y"]),
        ],
        "centred",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [axis],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    onnx.save(model, str(tmp_path / "centred.onnx"))
    with unideploy.export(tmp_path / "centred.onnx", tmp_path / "centred") as package:
        record = package.manifest.validation["onnx-fp32"]
        assert record["passed"] and record["batch_sizes"] == [1, 4] and "output_atol" not in record, record
    _mlp(tmp_path / "fixed.onnx", 3)  # 3 rows, fixed
    with unideploy.export(tmp_path / "fixed.onnx", tmp_path / "fixed") as package:
        record = package.manifest.validation["onnx-fp32"]
        assert record["passed"] and record["batch_sizes"] == [3] and "output_atol" not in record, record
