"""What a TensorRT recipe means to each GPU path, checked without a GPU: Polygraphy's builder
configuration (the real class, constructed, not built), ONNX Runtime's TensorRT provider options,
and the provider choice on machines with and without GPU providers."""

from __future__ import annotations

import pytest

from unideploy.errors import MissingDependencyError
from unideploy.runtimes.cuda_devices import find_gpus
from unideploy.runtimes.ort_providers import recipe_providers, tensorrt_options
from unideploy.runtimes.tensorrt.profiles import InputProfile
from unideploy.runtimes.tensorrt.spec import EngineSpec

PROFILES = (InputProfile("ids", (1, 8), (4, 64), (16, 128)), InputProfile("mask", (1, 8), (4, 64), (16, 128)))


def recipe(precision: str = "fp16", **changes) -> EngineSpec:
    fields = {
        "onnx": "model.onnx",
        "onnx_sha256": "a" * 64,
        "precision": precision,
        "profiles": PROFILES,
        "int8": "explicit" if precision == "int8" else None,
        "workspace_mib": 512,
    }
    fields.update(changes)
    return EngineSpec(**fields)


@pytest.mark.parametrize("precision, fp16, int8", [("fp32", False, False), ("fp16", True, False), ("int8", True, True)])
def test_polygraphy_builder_config_carries_the_recipe(precision, fp16, int8):
    from polygraphy.backend.trt import CreateConfig

    from unideploy.runtimes.tensorrt.build import builder_settings

    config = CreateConfig(**builder_settings(recipe(precision)))
    assert (bool(config.fp16), bool(config.int8)) == (fp16, int8)
    (profile,) = config.profiles
    assert [tuple(profile[name].min) for name in ("ids", "mask")] == [(1, 8), (1, 8)]
    assert tuple(profile["ids"].opt) == (4, 64) and tuple(profile["mask"].max) == (16, 128)


def test_onnxruntime_tensorrt_provider_options_follow_the_recipe(tmp_path):
    options = tensorrt_options(recipe("fp16"), tmp_path)
    assert options["trt_fp16_enable"] is True and options["trt_int8_enable"] is False
    assert options["trt_profile_min_shapes"] == "ids:1x8,mask:1x8"
    assert options["trt_profile_opt_shapes"] == "ids:4x64,mask:4x64"
    assert options["trt_profile_max_shapes"] == "ids:16x128,mask:16x128"
    assert options["trt_max_workspace_size"] == 512 << 20
    assert options["trt_engine_cache_enable"] and options["trt_engine_cache_path"] == str(tmp_path)
    assert tensorrt_options(recipe("int8"), tmp_path)["trt_int8_enable"] is True


def test_a_recipe_runs_on_tensorrt_only(tmp_path):
    every = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    providers = recipe_providers(recipe(), "auto", every, tmp_path)
    assert providers[0][0] == "TensorrtExecutionProvider" and providers[0][1]["trt_fp16_enable"]
    assert providers[1] == ("CUDAExecutionProvider", {"use_tf32": "0"})  # what TensorRT leaves, in fp32
    assert providers[2] == "CPUExecutionProvider"
    # the CUDA provider alone would run an fp32 model under the recipe's name: refused instead
    with pytest.raises(MissingDependencyError, match="neither is usable here"):
        recipe_providers(recipe(), "gpu", ["CUDAExecutionProvider", "CPUExecutionProvider"], tmp_path)
    with pytest.raises(MissingDependencyError, match="neither is usable here"):
        recipe_providers(recipe(), "auto", ["CPUExecutionProvider"], tmp_path)
    with pytest.raises(MissingDependencyError, match="the CPU was asked for"):
        recipe_providers(recipe(), "cpu", every, tmp_path)
    calibrated = recipe("int8", int8="calibrated", calibration="c.npz")
    with pytest.raises(MissingDependencyError, match="calibrated by TensorRT itself"):
        recipe_providers(calibrated, "auto", every, tmp_path)


def test_the_recipe_round_trips_and_knows_its_batch_limit(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"not really onnx, but checksummed")
    from unideploy.package.files import digest_path

    spec = recipe("fp16", onnx_sha256=digest_path(tmp_path / "model.onnx")[0], root=tmp_path)
    loaded = EngineSpec.load(spec.write(tmp_path / "tensorrt-fp16.engine.json"))
    assert loaded == spec and loaded.root == tmp_path
    assert loaded.max_batch_size == 16
    fixed = recipe(profiles=(InputProfile("x", (4, 3), (4, 3), (4, 3)),))
    assert fixed.max_batch_size is None


@pytest.mark.skipif(bool(find_gpus()[0]), reason="covers machines without an NVIDIA GPU")
def test_without_a_driver_no_gpu_is_listed_and_the_reason_says_so():
    gpus, why = find_gpus()
    assert gpus == [] and ("no NVIDIA driver" in why or "nvidia-ml-py" in why)


def test_recipe_paths_stay_inside_the_package(tmp_path):
    from unideploy.errors import PackageError

    spec_path = recipe().write(tmp_path / "r.engine.json")
    text = spec_path.read_text().replace('"model.onnx"', '"/etc/passwd"')
    spec_path.write_text(text)
    with pytest.raises(PackageError, match="outside its folder"):
        EngineSpec.load(spec_path)
