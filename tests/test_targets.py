"""Targets describe themselves (unideploy/targets.py): a target that a package adds through the
``unideploy.targets`` entry points is offered by the CLI, listed by ``deploy doctor`` and run by
the pipeline, with no core file edited; options that belong to another target are refused."""

from __future__ import annotations

import json
import os

import pytest
from console import assert_one_line_error, deploy, plugin_distribution, without_modules

from unideploy.package import Package

PLUGIN = '''
import shutil

from unideploy.package import Package
from unideploy.targets import Target


def stage(package, output, options, *, overwrite=False, progress=None):
    """Checks the exported package and passes it on whole: a target whose artifacts the export
    already holds (a stand-in for a third party's stage)."""
    with Package.open(package) as pkg:
        assert pkg.manifest.artifact("onnx-fp32")
    shutil.copytree(package, output)
    return output


TARGET = Target("tiny-npu", "a vendor's NPU, served from the ONNX artifact", ("onnxruntime",), stage="tiny_target:stage")
'''


@pytest.fixture
def target_plugin(tmp_path, monkeypatch):
    plugins = plugin_distribution(
        tmp_path / "plugins", "tiny_target", PLUGIN, "unideploy.targets", "tiny-npu = tiny_target:TARGET"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")])))
    return plugins


def test_a_target_from_an_entry_point_is_offered_listed_and_run(target_plugin, torch_models, tmp_path):
    path, shapes = torch_models["cnn_scripted"]
    args = ["export", path, "-o", tmp_path / "pkg", "--target", "tiny-npu"]
    for shape in shapes:
        args += ["--input-shape", shape]
    assert (result := deploy(*args)).returncode == 0, result.stderr
    with Package.open(tmp_path / "pkg") as package:
        assert package.manifest.validation["onnx-fp32"]["passed"]
    findings = json.loads(deploy("doctor", "--json").stdout)["findings"]
    assert any(f["kind"] == "target" and f["name"] == "tiny-npu" and f["ok"] for f in findings)


def test_options_of_another_target_are_refused_before_any_work(torch_models, tmp_path):
    path, shapes = torch_models["cnn_scripted"]
    result = deploy("export", path, "-o", tmp_path / "pkg", "--input-shape", shapes[0], "--trt-precision", "fp16")
    assert_one_line_error(result, 2, r"--trt-precision, --trt-profile, --trt-workspace apply to --target gpu only")
    assert not (tmp_path / "pkg").exists()


def test_a_target_whose_stage_modules_are_missing_is_refused_before_any_work(torch_models, tmp_path, monkeypatch):
    """As on a core install (no edge extra): the edge target names what it lacks and the whole install
    command (the extra, then onnx2tf without its pins) before converting anything, and doctor agrees."""
    monkeypatch.setenv("PYTHONPATH", without_modules(tmp_path / "without-edge", "ai_edge_litert", "tensorflow"))
    path, shapes = torch_models["cnn_scripted"]
    result = deploy("export", path, "-o", tmp_path / "pkg", "--input-shape", shapes[0], "--target", "edge")
    assert_one_line_error(
        result,
        2,
        r"target 'edge' needs ai_edge_litert, tensorflow, which are not installed "
        r"\(pip install 'unideploy\[edge\]' && pip install --no-deps 'onnx2tf==[\d.]+'\)",
    )
    assert not (tmp_path / "pkg").exists()
    findings = json.loads(deploy("doctor", "--json").stdout)["findings"]
    edge = next(f for f in findings if f["kind"] == "target" and f["name"] == "edge")
    assert not edge["ok"] and "pip install --no-deps 'onnx2tf" in edge["fix"], edge
