"""MindIR files exported from MindSpore Cells, translated to ONNX and checked against GraphCell."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import unideploy
from unideploy.errors import ExportError, InputError

pytestmark = pytest.mark.mindspore


def graph_cell_outputs(path, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import mindspore as ms

    out = ms.nn.GraphCell(ms.load(str(path)))(*[ms.Tensor(a) for a in inputs])
    return [t.asnumpy() for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("name", ["cnn", "encoder", "mix", "elementwise", "face", "mobile", "neck", "decoding"])
def test_mindir_translates_to_onnx_matching_graph_cell(mindir_models, name, tmp_path):
    src = mindir_models[name]
    with unideploy.export(src, tmp_path / "pkg") as package:
        manifest = package.manifest
        assert manifest.source["framework"] == "mindspore" and manifest.source["exporter"] == "mindir"
        assert [a.id for a in manifest.artifacts] == ["onnx-fp32", "mindir"]
        for artifact_id in ("onnx-fp32", "mindir"):
            assert manifest.validation[artifact_id]["passed"]
            assert manifest.validation[artifact_id]["batch_sizes"] == [1, 4]
        assert all(spec.shape[0] == "batch" for spec in manifest.signature.inputs)  # -1 stays dynamic
        assert package.path_of("mindir").read_bytes() == src.read_bytes()  # the .mindir is kept as it is
        # a batch size neither validation used, on ONNX Runtime, against MindSpore itself
        rng = np.random.default_rng(3)
        inputs = {}
        for spec in manifest.signature.inputs:
            shape = (7, *spec.shape[1:])
            inputs[spec.name] = (
                rng.integers(0, 10, shape) if spec.dtype.startswith("int") else rng.standard_normal(shape)
            ).astype(spec.dtype)
        got = unideploy.run(package, inputs, artifact="onnx-fp32")
    expected = graph_cell_outputs(src, list(inputs.values()))
    assert len(got) == len(expected)
    for out_name, value in zip(manifest.signature.output_names, expected):
        np.testing.assert_allclose(got[out_name], value, atol=1e-4, rtol=1e-3)


def test_onnx_is_standard_opset_17_with_exact_gelu(mindir_models, tmp_path):
    with unideploy.export(mindir_models["encoder"], tmp_path / "pkg") as package:
        model = onnx.load(str(package.path_of("onnx-fp32")))
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    assert model.opset_import[0].version == 17
    assert {"Erf", "LayerNormalization", "Softmax", "MatMul", "Split"} <= ops
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_ceil_mode_pooling_is_translated_as_2d_pooling(mindir_models, tmp_path):
    """MindSpore writes nn.MaxPool2d(ceil_mode=True) as a 3-D MaxPool3DWithArgmax of depth one
    between ExpandDims and Squeeze: translated as 2-D pooling, which TFLite has (its converter
    refused MTCNN's P-Net from MindIR for a MaxPool3D)."""
    with unideploy.export(mindir_models["face"], tmp_path / "pkg") as package:
        model = onnx.load(str(package.path_of("onnx-fp32")))
    (pool,) = [n for n in model.graph.node if n.op_type == "MaxPool"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in pool.attribute}
    assert attributes["kernel_shape"] == [3, 3] and attributes["ceil_mode"] == 1


def test_unsupported_operator_is_named_with_the_supported_list_and_writes_nothing(mindir_models, tmp_path):
    with pytest.raises(ExportError) as info:
        unideploy.export(mindir_models["unsupported"], tmp_path / "pkg")
    assert "CumSum" in info.value.message and "Conv2D" in info.value.hint and "--keep-native-only" in info.value.hint
    assert not (tmp_path / "pkg").exists()


def test_control_flow_left_in_the_graph_is_named_with_the_way_out(mindir_models, tmp_path):
    """nn.Upsample exported with a dynamic batch keeps both branches of "is a dim unknown?" as
    nested graphs (MindSpore's CPU runtime cannot run that file either): named as control flow,
    with static shapes as the way out (it was called a corrupt file). Exported with static shapes
    it is a plain resize ("neck" above)."""
    with pytest.raises(ExportError) as info:
        unideploy.export(mindir_models["upsample"], tmp_path / "pkg")
    assert "control flow MindSpore left unresolved: nested graphs (interpolate)" in info.value.message
    assert "static input shapes" in info.value.hint
    assert not (tmp_path / "pkg").exists()


def test_keep_native_only_packages_the_mindir_alone_and_it_runs(mindir_models, tmp_path):
    src = mindir_models["unsupported"]
    with unideploy.export(src, tmp_path / "pkg", keep_native_only=True) as package:
        assert [a.id for a in package.manifest.artifacts] == ["mindir"]
        assert package.manifest.validation["mindir"]["passed"]
        x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
        got = unideploy.run(package, {"x": x})
    np.testing.assert_allclose(got["output"], graph_cell_outputs(src, [x])[0], atol=1e-6)


def test_keep_native_only_is_refused_for_sources_without_a_native_runtime(tmp_path):
    model = tmp_path / "m.onnx"
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    onnx.save(
        onnx.helper.make_model(
            onnx.helper.make_graph(
                [onnx.helper.make_node("Relu", ["x"], ["y"])],
                "g",
                [x],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
            )
        ),
        str(model),
    )
    with pytest.raises(InputError, match="--keep-native-only needs a source that runs natively"):
        unideploy.export(model, tmp_path / "pkg", keep_native_only=True)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_mindir_fails_cleanly_from_the_cli(mindir_models, damage, tmp_path):
    bad = tmp_path / "bad.mindir"
    data = mindir_models["cnn"].read_bytes()
    bad.write_bytes(b"\x08\x96\x01not a model" * 50 if damage == "garbage" else data[: len(data) // 2])
    from console import deploy

    result = deploy("export", bad, "-o", tmp_path / "pkg")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "MindIR" in result.stderr and "export it again" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_cli_keep_native_only_then_run_and_verify(mindir_models, tmp_path):
    from console import deploy

    pkg = tmp_path / "native.zip"
    assert deploy("export", mindir_models["unsupported"], "-o", pkg).returncode != 0
    result = deploy("export", mindir_models["unsupported"], "-o", pkg, "--keep-native-only")
    assert result.returncode == 0, result.stderr
    np.savez(tmp_path / "in.npz", x=np.ones((2, 6), np.float32))
    run = deploy("run", pkg, "--input", tmp_path / "in.npz", "--json")
    assert run.returncode == 0, run.stderr
    assert np.asarray(json.loads(run.stdout)["outputs"]["output"]["data"]).shape == (2, 6)
    verify = json.loads(deploy("verify", pkg, "--json").stdout)
    assert [a["status"] for a in verify["artifacts"]] == ["passed"]


def test_a_mindir_that_dumps_tensors_to_files_is_refused_before_mindspore_runs_it(tmp_path, monkeypatch):
    """ops.TensorDump writes an .npy file (in the working directory) each time the graph runs:
    the scan names it, even with --keep-native-only, and nothing is run or written."""
    import mindspore as ms

    class Leaky(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.dump, self.dense = ms.ops.TensorDump(), ms.nn.Dense(4, 2)

        def construct(self, x):
            self.dump("leak.npy", x)
            return self.dense(x)

    ms.export(Leaky(), ms.Tensor(np.zeros((1, 4), np.float32)), file_name=str(tmp_path / "leaky"), file_format="MINDIR")
    monkeypatch.chdir(tmp_path)
    for native_only in (False, True):
        with pytest.raises(InputError, match=r"TensorDump \(writes \.npy files\).*--trust-source"):
            unideploy.export(tmp_path / "leaky.mindir", tmp_path / "pkg", keep_native_only=native_only)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaky.mindir"]


def test_a_cell_in_memory_is_exported_as_mindir_with_a_dynamic_batch(tmp_path):
    """unideploy.export(cell): saved as MindIR through mindspore.export (the batch dimension left
    dynamic, as a user exports one for serving), kept as the package's source, and its answers
    those of the Cell itself, at a batch size the example did not have."""
    import mindspore as ms

    class Head(ms.nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.dense, self.act = ms.nn.Dense(6, 3), ms.nn.PReLU()

        def construct(self, features):
            return self.act(self.dense(features))

    cell = Head()
    rows = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    with unideploy.export(cell, tmp_path / "pkg", example_inputs={"features": rows}) as package:
        assert package.manifest.source["path"].endswith("Head.mindir")
        assert package.manifest.validation["onnx-fp32"]["passed"]
        spec = package.manifest.signature.inputs[0]
        assert isinstance(spec.shape[0], str) and spec.shape[1:] == (6,)
        (output,) = package.manifest.signature.output_names
    seven = np.random.default_rng(1).standard_normal((7, 6)).astype(np.float32)
    found = unideploy.run(tmp_path / "pkg", {spec.name: seven})[output]
    np.testing.assert_allclose(found, cell(ms.Tensor(seven)).asnumpy(), atol=1e-5)
    with pytest.raises(InputError, match=r"exporting Head to MindIR needs a value for 'features'"):
        unideploy.export(Head(), tmp_path / "other")
    assert not (tmp_path / "other").exists()
