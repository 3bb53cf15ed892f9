"""Optimizer passes describe themselves: a pass that a package adds through the
``unideploy.optimizers`` entry points is requested by name (``--pass NAME``), runs under the same
accuracy guard, and names its artifact, with no core file edited."""

from __future__ import annotations

import json
import os

import pytest
from console import assert_one_line_error, deploy, plugin_distribution

from unideploy.package import Package

PLUGIN = '''
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from unideploy.optimizers import OptimizerPass, PassResult


class RoundedWeights(OptimizerPass):
    """Float weights rounded to three decimals (a stand-in for a third party's compression)."""

    name = "round-weights"
    stage = "quantize"

    def apply(self, model_path, ctx):
        model = onnx.load(str(model_path))
        for init in model.graph.initializer:
            values = numpy_helper.to_array(init)
            if values.dtype == np.float32:
                init.CopyFrom(numpy_helper.from_array(np.round(values, 3), init.name))
        out = Path(ctx.workdir) / "rounded.onnx"
        onnx.save(model, str(out))
        return PassResult(out, {"decimals": 3})

    def tag(self):
        return "round3"
'''


@pytest.fixture
def pass_plugin(tmp_path, monkeypatch):
    """A real (tiny) distribution on the path of the processes the test starts."""
    entry = "round-weights = rounding_plugin:RoundedWeights"
    plugins = plugin_distribution(tmp_path / "plugins", "rounding_plugin", PLUGIN, "unideploy.optimizers", entry)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugins), os.environ.get("PYTHONPATH")])))
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


def test_passes_named_without_what_they_need_are_refused(digits_package, digits):
    result = deploy("optimize", digits_package, "--pass", "prune-magnitude", "--calibration", digits["data"])
    assert_one_line_error(result, 2, r"the prune-magnitude pass needs --prune SPARSITY")
    result = deploy("optimize", digits_package, "--pass", "no-such-pass")
    assert result.returncode == 2 and "invalid choice: 'no-such-pass'" in result.stderr
