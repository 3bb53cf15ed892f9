"""``deploy export --target gpu`` on a machine without a GPU or TensorRT, as CI has it.

Everything that does not need a GPU is real here: the recipes and their checks, the int8 route
(explicit QDQ or calibrator), the tolerances written for the serving GPU, the selection that
passes over GPU artifacts to the ONNX one, and the messages when a GPU artifact is asked for.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import shutil

import numpy as np
import pytest
from console import assert_one_line_error, deploy

from unideploy.errors import MissingDependencyError, PackageError
from unideploy.gpu.precision import tensorrt_qdq_problem
from unideploy.package import Package
from unideploy.runtimes import RUNTIMES, RuntimeOptions
from unideploy.runtimes.tensorrt.spec import EngineSpec

pytestmark = pytest.mark.skipif(
    RUNTIMES.get("tensorrt").availability().ok, reason="these tests cover machines without TensorRT; this one has it"
)


@pytest.fixture(scope="module")
def gpu_package(torch_models, tmp_path_factory):
    path, shapes = torch_models["cnn_scripted"]
    out = tmp_path_factory.mktemp("gpu") / "cnn.udp"
    args = [
        "export",
        path,
        "-o",
        out,
        "--target",
        "gpu",
        "--trt-precision",
        "fp16",
        "--trt-precision",
        "fp32",
        "--trt-profile",
        "x:1x1x8x8,4x1x8x8,16x1x8x8",
        "--trt-workspace",
        "256",
    ]
    for shape in shapes:
        args += ["--input-shape", shape]
    result = deploy(*args)
    assert result.returncode == 0, result.stderr
    return out


def test_the_package_lists_its_tensorrt_recipes_first_with_deferred_checks(gpu_package):
    with Package.open(gpu_package) as package:
        m = package.manifest
        assert [a.id for a in m.artifacts] == ["tensorrt-fp16", "tensorrt-fp32", "onnx-fp32"]
        fp16 = m.artifact("tensorrt-fp16")
        assert (fp16.format, fp16.runtimes, fp16.targets, fp16.derived_from) == (
            "tensorrt",
            ["tensorrt", "onnxruntime"],
            ["gpu"],
            "onnx-fp32",
        )
        spec = EngineSpec.load(package.path_of(fp16))
        assert spec.onnx_path == package.path_of("onnx-fp32")
        assert spec.onnx_sha256 == m.artifact("onnx-fp32").sha256
        assert spec.profile_text() == {"x": "1x1x8x8 / 4x1x8x8 / 16x1x8x8"}
        assert (spec.workspace_mib, spec.max_batch_size, spec.int8) == (256, 16, None)
        record = m.validation["tensorrt-fp16"]
        assert "TensorRT cannot run where the package was made" in record["deferred"]
        largest = max(float(np.abs(s.outputs["output"]).max()) for s in package.reference_samples())
        assert record["output_atol"] == {"output": pytest.approx(0.01 * largest)} and record["rtol"] == 0.01
        assert m.validation["tensorrt-fp32"]["atol"] >= 1e-4 and m.validation["tensorrt-fp32"]["rtol"] == 1e-3


def test_without_a_gpu_the_onnx_artifact_serves_and_gpu_artifacts_say_why_not(gpu_package, tmp_path):
    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32))
    result = deploy("run", gpu_package, "--input", tmp_path / "in.npz", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["artifact"] == "onnx-fp32"

    asked = deploy("run", gpu_package, "--input", tmp_path / "in.npz", "--artifact", "tensorrt-fp16")
    assert_one_line_error(asked, 2, r"needs the TensorRT runtime or ONNX Runtime's TensorRT provider.*deploy doctor")
    on_cpu = deploy(
        "run", gpu_package, "--input", tmp_path / "in.npz", "--artifact", "tensorrt-fp16", "--device", "cpu"
    )
    assert_one_line_error(on_cpu, 2, r"runs on GPUs, and the CPU was asked for.*--artifact onnx-fp32")
    gpu_only = deploy("run", gpu_package, "--input", tmp_path / "in.npz", "--target", "gpu")
    assert_one_line_error(gpu_only, 2, r"no artifact in this package can run here")


def test_verify_skips_the_gpu_artifacts_with_the_reason_and_passes_the_rest(gpu_package):
    result = deploy("verify", gpu_package, "--json")
    assert result.returncode == 0, result.stderr
    checks = {c["artifact"]: c for c in json.loads(result.stdout)["artifacts"]}
    assert checks["onnx-fp32"]["status"] == "passed"
    for precision in ("fp16", "fp32"):
        assert checks[f"tensorrt-{precision}"]["status"] == "skipped"
        assert "GPU" in checks[f"tensorrt-{precision}"]["reason"]


def test_a_tampered_recipe_is_refused_by_the_package_and_by_the_runtime(gpu_package, tmp_path):
    copy = tmp_path / "copy.udp"
    shutil.copytree(gpu_package, copy)
    recipe = copy / "artifacts" / "tensorrt-fp16.engine.json"
    data = json.loads(recipe.read_text())
    data["onnx"] = "../../elsewhere.onnx"
    recipe.write_text(json.dumps(data))
    assert_one_line_error(deploy("inspect", copy), 2, r"tensorrt-fp16.engine.json.*(truncated or modified|checksum)")
    with pytest.raises(PackageError, match="outside its folder"):
        EngineSpec.load(recipe)
    data["onnx"] = "model.onnx"
    data["onnx_sha256"] = "0" * 64
    recipe.write_text(json.dumps(data))
    with pytest.raises(PackageError, match="does not match its checksum"):
        EngineSpec.load(recipe)
    recipe.write_text("{")
    with pytest.raises(PackageError, match="cannot be read"):
        EngineSpec.load(recipe)


def test_the_tensorrt_runtime_says_what_is_missing_here(gpu_package):
    tensorrt = RUNTIMES.get("tensorrt")
    found = tensorrt.availability()
    assert (not found.ok and "pypi.nvidia.com" in (found.fix or "") + found.detail) or "GPU" in found.detail
    with Package.open(gpu_package) as package:
        artifact = package.manifest.artifact("tensorrt-fp16")
        with pytest.raises(MissingDependencyError, match="TensorRT cannot run here"):
            tensorrt(package.path_of(artifact), package.manifest.signature, RuntimeOptions(device="gpu"))
        with pytest.raises(MissingDependencyError, match="GPUs only"):
            tensorrt(package.path_of(artifact), package.manifest.signature, RuntimeOptions(device="cpu"))


@pytest.mark.parametrize(
    "extra, pattern",
    [
        (["--trt-profile", "x:1x1x8x8,64x1x8x8,8x1x8x8"], r"min <= opt <= max"),
        (["--trt-profile", "y:1x1"], r"unknown input"),
        (["--trt-precision", "int8"], r"TensorRT int8 needs a symmetric QDQ int8 artifact.*--int8-variant symmetric"),
        (["--trt-workspace", "0"], r"--trt-workspace of --target gpu: Input should be greater than or equal to 1"),
    ],
)
def test_bad_gpu_options_fail_before_anything_is_written(torch_models, tmp_path, extra, pattern):
    path, shapes = torch_models["cnn_scripted"]
    out = tmp_path / "never.udp"
    result = deploy(
        "export",
        path,
        "-o",
        out,
        "--target",
        "gpu",
        *functools.reduce(operator.iadd, (["--input-shape", s] for s in shapes), []),
        *extra,
    )
    assert result.returncode == 2, result.stderr
    assert re.search(pattern, result.stderr), result.stderr
    assert not out.exists()


def test_gpu_options_without_the_gpu_target_are_refused(torch_models, tmp_path):
    path, _ = torch_models["cnn_scripted"]
    result = deploy("export", path, "-o", tmp_path / "x.udp", "--trt-precision", "fp16")
    assert_one_line_error(result, 2, "apply to --target gpu only")


def test_int8_prefers_the_symmetric_qdq_artifact(digits, tmp_path):
    """Explicit quantization: scales from the accuracy-checked symmetric QDQ artifact."""
    with Package.open(_export_int8(digits, tmp_path, "symmetric")) as package:
        m = package.manifest
        trt = m.artifact("tensorrt-int8")
        assert trt.derived_from == "onnx-int8" and m.optimizations[-1]["accuracy"]["within_budget"]
        spec = EngineSpec.load(package.path_of(trt))
        assert (spec.int8, spec.onnx, spec.calibration) == ("explicit", "model.int8.onnx", None)
        assert "twice the tolerance of 'onnx-int8'" in m.validation["tensorrt-int8"]["tolerance_basis"]


def test_int8_without_a_usable_qdq_artifact_ships_calibration_data(digits, tmp_path):
    """The CPU-tuned static variant (uint8 activations) cannot feed TensorRT: the engine is then
    calibrated on the serving GPU, from data shipped in the package and covered by the key."""
    with Package.open(_export_int8(digits, tmp_path, "static")) as package:
        trt = package.manifest.artifact("tensorrt-int8")
        assert trt.derived_from == "onnx-fp32"
        why = tensorrt_qdq_problem(package.path_of("onnx-int8"))
        assert "uint8" in why and "asymmetric" in why
        assert [f["path"] for f in trt.files] == ["artifacts/tensorrt-calibration.npz"]
        spec = EngineSpec.load(package.path_of(trt))
        assert spec.int8 == "calibrated" and spec.calibration_sha256 == trt.files[0]["sha256"]
        from unideploy.runtimes.tensorrt.build import calibration_batches

        batches = calibration_batches(spec)
        assert {b["x"].shape[0] for b in batches} == {8}  # the profile's opt batch
        assert sum(b["x"].shape[0] for b in batches) <= 512
        # ONNX Runtime cannot calibrate: the recipe is refused there with the reason, not run as fp32
        with pytest.raises(MissingDependencyError, match="calibrated by TensorRT itself"):
            RUNTIMES.get("onnxruntime")(package.path_of(trt), package.manifest.signature, RuntimeOptions())


def _export_int8(digits, tmp_path, variant):
    """The digits model exported for a TensorRT int8 engine, with an ONNX int8 artifact of ``variant``."""
    examples, out = tmp_path / "examples.npz", tmp_path / f"{variant}.udp"
    with np.load(digits["data"]) as data:
        np.savez(examples, x=data["x"][:8])
    result = deploy(
        "export",
        digits["model"],
        "-o",
        out,
        "--example-input",
        examples,
        "--target",
        "gpu",
        "--trt-precision",
        "int8",
        "--quantize",
        "int8",
        "--int8-variant",
        variant,
        "--keep-slower",  # static's ONNX INT8 also runs on CPUs, where the digits CNN's is about as fast as fp32
        "--calibration",
        digits["data"],
    )
    assert result.returncode == 0, result.stderr
    return out


def test_the_server_serves_a_gpu_package_from_its_onnx_artifact_here(gpu_package, tmp_path):
    """Same package on a GPU server runs on TensorRT; here, with no GPU, on ONNX Runtime's CPU."""
    from serving import start_server, stop_server

    repo = tmp_path / "repo"
    shutil.copytree(gpu_package, repo / "cnn" / "1")
    server = start_server(repo, tmp_path)
    try:
        x = np.random.default_rng(1).random((2, 1, 8, 8), dtype=np.float32)
        with server.client() as client:
            reply = client.post(
                "/v2/models/cnn/infer",
                json={
                    "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
                },
            )
        assert reply.status_code == 200, reply.text
        (output,) = reply.json()["outputs"]
        expected = RUNTIMES.get("onnxruntime")(
            gpu_package / "artifacts" / "model.onnx", _signature(gpu_package), RuntimeOptions(device="cpu")
        ).run({"x": x})["output"]
        np.testing.assert_allclose(np.array(output["data"]).reshape(output["shape"]), expected, rtol=1e-5, atol=1e-6)
        # what ran is what metadata, config and metrics name: the ONNX artifact on the CPU, and why
        with server.client() as client:
            ran = client.get("/v2/models/cnn").json()["parameters"]
            config = client.get("/v2/models/cnn/config").json()["parameters"]
            metrics = client.get("/metrics").text
        assert (ran["artifact"], ran["device"], ran["providers"], ran["precision"]) == (
            "onnx-fp32",
            "cpu",
            "CPUExecutionProvider",
            "fp32",
        )
        assert ran["passed_over"].startswith("tensorrt-fp16: ") and config["artifact"] == {"string_value": "onnx-fp32"}
        assert "batch_buckets" not in ran  # buckets are for engines that pay per shape (the CUDA provider)
        assert re.search(
            r'unideploy_model_engine\{[^}]*artifact="onnx-fp32"[^}]*device="cpu"[^}]*precision="fp32"', metrics
        )
        assert "passed over" in server.log.read_text()
    finally:
        stop_server(server)


def _signature(package_path):
    with Package.open(package_path) as package:
        return package.manifest.signature


def test_a_recipe_whose_provider_does_not_load_is_passed_over_not_run_as_fp32(gpu_package, monkeypatch):
    """ONNX Runtime with a TensorRT provider that cannot load runs the session on what is left; the
    recipe is refused with the reason and the ONNX artifact runs, named as such."""
    import onnxruntime

    from unideploy.runtimes.selection import open_runtime, what_ran

    monkeypatch.setattr(
        onnxruntime,
        "get_available_providers",
        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    with Package.open(gpu_package) as package:
        artifact, engine = open_runtime(package)
        ran = what_ran(artifact, engine)
        with pytest.raises(MissingDependencyError, match=r"cannot run here: ONNX Runtime's TensorrtExecutionProvider"):
            open_runtime(package, "tensorrt-fp16")
    assert ran["artifact"] == "onnx-fp32" and ran["precision"] == "fp32"
    assert ran["passed_over"][0].startswith("tensorrt-fp16: the TensorRT recipe")
    assert "did not load" in ran["passed_over"][0] and "libnvinfer.so.10" in ran["passed_over"][0]
    assert "profiles" not in ran  # no TensorRT profile binds the artifact that ran


def test_a_tensorrt_profile_binds_tensorrt_only(gpu_package, tmp_path):
    """64 rows is past the recipe's profile (max 16): the ONNX artifact that runs here takes them."""
    result = deploy("bench", gpu_package, "--batch-size", "64", "--iterations", "2", "--warmup", "1", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["artifact"] == "onnx-fp32" and found["batch_size"] == 64
    assert [line.split(":")[0] for line in found["passed_over"]] == ["tensorrt-fp16", "tensorrt-fp32"]
    shown = deploy("bench", gpu_package, "--batch-size", "2", "--iterations", "2", "--warmup", "1")
    assert shown.returncode == 0, shown.stderr
    assert (
        "passed over tensorrt-fp16:" in shown.stdout
        and "onnx-fp32 on onnxruntime (CPUExecutionProvider), fp32" in shown.stdout
    )


def test_a_streaming_model_s_calibration_stream_ships_with_the_state_the_model_carries(tmp_path):
    """TensorRT's calibrator reads rows one by one: a streaming model's stream (its rows without the
    state) ships with each row's state as the fp32 model carries it (h = 0.5 h + x from 0.25), not
    refused for the missing input nor filled with a constant."""
    pytest.importorskip("onnx")
    from onnx_models import running_average_model

    rows = np.random.default_rng(0).standard_normal((20, 4)).astype(np.float32)
    np.savez(tmp_path / "stream.npz", x=rows)
    made = deploy(
        "export",
        running_average_model(tmp_path / "a.onnx"),
        *("-o", tmp_path / "pkg", "--state", "h=h_next:0.25", "--target", "gpu", "--trt-precision", "int8"),
        *("--calibration", tmp_path / "stream.npz"),
    )
    assert made.returncode == 0, made.stderr
    with np.load(tmp_path / "pkg" / "artifacts" / "tensorrt-calibration.npz") as shipped:
        h, expected = np.full(4, 0.25, np.float32), []
        for row in rows:
            expected.append(h)
            h = 0.5 * h + row
        np.testing.assert_allclose(shipped["h"], np.array(expected), rtol=1e-6)
        np.testing.assert_array_equal(shipped["x"], rows)
