"""Targets describe themselves (unideploy/targets.py): a target that a package adds through the
``unideploy.targets`` entry points is offered by the CLI with its own options, listed by ``deploy
doctor`` and run by the pipeline, with no core file edited; options that belong to another target
are refused; a plug-in of any kind that does not load is named by doctor and left out elsewhere."""

from __future__ import annotations

import json

import pytest
from console import assert_one_line_error, deploy, plugin_distribution, pythonpath_with, without_modules

from unideploy.package import Package

PLUGIN = '''
import json
import os
import shutil

from pydantic import Field

from unideploy.options import PluginOptions
from unideploy.package import Package
from unideploy.targets import Target


class NpuOptions(PluginOptions):
    npu_cores: int = Field(1, ge=1, description="NPU cores the vendor's compiler plans for", json_schema_extra={"metavar": "N"})


def stage(package, output, options, *, overwrite=False, progress=None):
    """Checks the exported package and passes it on whole: a target whose artifacts the export
    already holds (a stand-in for a third party's stage); says which options it was given."""
    with Package.open(package) as pkg:
        assert pkg.manifest.artifact("onnx-fp32")
    with open(os.environ["TINY_NPU_OPTIONS"], "w") as fh:
        json.dump(options, fh)
    shutil.copytree(package, output)
    return output


TARGET = Target(
    "tiny-npu",
    "a vendor's NPU, served from the ONNX artifact",
    ("onnxruntime",),
    stage="tiny_target:stage",
    options="tiny_target:NpuOptions",
)
'''


@pytest.fixture
def target_plugin(tmp_path, monkeypatch):
    plugins = plugin_distribution(
        tmp_path / "plugins", "tiny_target", PLUGIN, "unideploy.targets", "tiny-npu = tiny_target:TARGET"
    )
    monkeypatch.setenv("PYTHONPATH", pythonpath_with(plugins))
    monkeypatch.setenv("TINY_NPU_OPTIONS", str(tmp_path / "given.json"))
    return plugins


def test_a_target_from_an_entry_point_is_offered_with_its_options_listed_and_run(target_plugin, torch_models, tmp_path):
    path, shapes = torch_models["cnn_scripted"]
    args = ["export", path, "-o", tmp_path / "pkg", "--target", "tiny-npu", "--npu-cores", "4"]
    for shape in shapes:
        args += ["--input-shape", shape]
    shown = " ".join(deploy("export", "--help").stdout.split())
    assert (
        "tiny-npu target (--target tiny-npu): --npu-cores N NPU cores the vendor's compiler plans for (default: 1)"
        in shown
    )
    assert (result := deploy(*args)).returncode == 0, result.stderr
    assert json.loads((tmp_path / "given.json").read_text()) == {
        "npu_cores": 4,
        "calibration": None,
        # what its guard judges with
        "accuracy": {"max_accuracy_drop": 1.0, "metric": ["auto"], "min_cosine": None, "decision_thresholds": []},
    }
    with Package.open(tmp_path / "pkg") as package:
        assert package.manifest.validation["onnx-fp32"]["passed"]
    findings = json.loads(deploy("doctor", "--json").stdout)["findings"]
    npu = next(f for f in findings if f["kind"] == "target" and f["name"] == "tiny-npu")
    assert npu["ok"] and npu["detail"].endswith("; options: --npu-cores"), npu

    result = deploy(*[a if a != "4" else "0" for a in args[:-2]], "--npu-cores", "0", "--force")
    assert_one_line_error(result, 2, r"--npu-cores of --target tiny-npu: Input should be greater than or equal to 1")
    result = deploy(*[a if a != "tiny-npu" else "cpu" for a in args], "--force")
    assert_one_line_error(result, 2, r"--npu-cores apply to --target tiny-npu only")


def test_plugins_that_do_not_load_are_named_by_doctor_and_left_out_elsewhere(torch_models, tmp_path, monkeypatch):
    """One policy for every kind: an entry point whose module is gone neither stops deploy doctor
    (it names each, with the error) nor the commands that do not ask for it by name."""
    groups = ("exporters", "optimizers", "metrics", "runtimes", "targets")
    dist = tmp_path / "plugins" / "gone-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gone\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "".join(f"[unideploy.{g}]\ngone-{g} = no_such_module:Thing\n" for g in groups)
    )
    monkeypatch.setenv("PYTHONPATH", pythonpath_with(dist.parent))
    result = deploy("doctor", "--json")
    assert result.returncode == 0, result.stderr
    findings = {f["name"]: f for f in json.loads(result.stdout)["findings"]}
    for group in groups:
        gone = findings[f"gone-{group}"]
        assert not gone["ok"] and "cannot be loaded" in gone["detail"] and "no_such_module" in gone["detail"], gone
    path, shapes = torch_models["cnn_scripted"]
    args = ["export", path, "-o", tmp_path / "pkg", "--quantize", "fp16", "--synthetic-calibration"]
    result = deploy(*args, *[a for s in shapes for a in ("--input-shape", s)])
    assert result.returncode == 0, result.stderr


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
