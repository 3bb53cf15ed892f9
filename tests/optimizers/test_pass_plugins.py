"""Optimizer passes describe themselves: a pass that a package adds through the
``unideploy.optimizers`` entry points is requested by name (``--pass NAME``) with its own options
(``--decimals N``), runs under the same accuracy guard, and names its artifact, with no core file
edited."""

from __future__ import annotations

import json

import pytest
from console import assert_one_line_error, deploy, plugin_distribution, pythonpath_with

from unideploy.package import Package

PLUGIN = '''
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pydantic import Field

from unideploy.optimizers import OptimizerPass, PassResult
from unideploy.options import PluginOptions


class RoundingOptions(PluginOptions):
    decimals: int = Field(3, ge=1, le=6, description="decimals the weights keep", json_schema_extra={"metavar": "N"})


class RoundedWeights(OptimizerPass):
    """Float weights rounded to some decimals (a stand-in for a third party's compression)."""

    name = "round-weights"
    stage = "quantize"
    options = RoundingOptions

    def __init__(self, decimals=3):
        self.decimals = decimals

    @classmethod
    def from_request(cls, request):
        return cls(cls.settings(request).decimals) if cls.name in request.passes else None

    def apply(self, model_path, ctx):
        model = onnx.load(str(model_path))
        for init in model.graph.initializer:
            values = numpy_helper.to_array(init)
            if values.dtype == np.float32:
                init.CopyFrom(numpy_helper.from_array(np.round(values, self.decimals), init.name))
        out = Path(ctx.workdir) / "rounded.onnx"
        onnx.save(model, str(out))
        return PassResult(out, {"decimals": self.decimals})

    def tag(self):
        return f"round{self.decimals}"
'''


@pytest.fixture
def pass_plugin(tmp_path, monkeypatch):
    """A real (tiny) distribution on the path of the processes the test starts."""
    entry = "round-weights = rounding_plugin:RoundedWeights"
    plugins = plugin_distribution(tmp_path / "plugins", "rounding_plugin", PLUGIN, "unideploy.optimizers", entry)
    monkeypatch.setenv("PYTHONPATH", pythonpath_with(plugins))
    return plugins


def test_a_pass_from_an_entry_point_is_requested_by_name(pass_plugin, digits_package, digits):
    result = deploy("optimize", digits_package, "--pass", "round-weights", "--calibration", digits["data"], "--json")
    assert result.returncode == 0, result.stderr
    with Package.open(digits_package) as package:
        artifact = package.manifest.artifact("onnx-round3")  # the pass named it
        record = package.manifest.optimizations[-1]
    assert artifact.derived_from == "onnx-fp32"
    assert record["artifact"] == "onnx-round3" and record["accuracy"]["within_budget"]
    assert json.loads(result.stdout)["artifact"] == "onnx-round3"


def test_a_pass_from_an_entry_point_takes_its_own_option(pass_plugin, digits_package, digits):
    shown = " ".join(deploy("optimize", "--help").stdout.split())
    assert "--decimals N decimals the weights keep (round-weights) (default: 3)" in shown
    asked = ("optimize", digits_package, "--pass", "round-weights", "--calibration", digits["data"])
    result = deploy(*asked, "--decimals", "2", "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["artifact"] == "onnx-round2" and record["passes"][0]["params"] == {"decimals": 2}
    assert_one_line_error(
        deploy(*asked, "--decimals", "9"), 2, r"--decimals of the round-weights pass: .*less than or equal to 6"
    )
    result = deploy(
        "optimize", digits_package, "--quantize", "fp16", "--decimals", "2", "--calibration", digits["data"]
    )
    assert_one_line_error(result, 2, r"--decimals applies to the round-weights pass, which this request does not run")


def test_passes_named_without_what_they_need_are_refused(digits_package, digits):
    result = deploy("optimize", digits_package, "--pass", "prune-magnitude", "--calibration", digits["data"])
    assert_one_line_error(result, 2, r"the prune-magnitude pass needs --prune SPARSITY")
    result = deploy("optimize", digits_package, "--pass", "no-such-pass")
    assert result.returncode == 2 and "invalid choice: 'no-such-pass'" in result.stderr
