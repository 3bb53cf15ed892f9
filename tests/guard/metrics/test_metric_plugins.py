"""Metrics are plug-ins: one a package adds through the ``unideploy.metrics`` entry points is
listed by ``--help`` with what it measures and the option that bounds it, asked for by name
(``--metric NAME`` or ``OUTPUT=NAME``), judged under the same budget, and printed in its own words,
with no core file edited. Real FP16 of the digits CNN on real digits."""

from __future__ import annotations

import json
import re

import pytest
from console import deploy, plugin_distribution, pythonpath_with

from unideploy.package import Package

PLUGIN = '''
import numpy as np

from unideploy.guard.metrics import Metric


class WorstRowCosine(Metric):
    """The worst row's cosine rather than the mean (a stand-in for a team's own metric)."""

    name = "worst-cosine"
    measures = "1 - the lowest cosine of any row with fp32's"
    budget = "min_cosine"

    def score(self, output):
        a = output.reference.reshape(len(output.reference), -1).astype(np.float64)
        b = output.candidate.reshape(len(output.candidate), -1).astype(np.float64)
        worst = float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())
        return 1.0 - worst, {"worst_cosine": worst}

    def detail(self, record):
        return f"worst row's cosine {record['worst_cosine']:.6f}"
'''


@pytest.fixture
def metric_plugin(tmp_path, monkeypatch):
    entry = "worst-cosine = worst_cosine_metric:WorstRowCosine"
    plugins = plugin_distribution(tmp_path / "plugins", "worst_cosine_metric", PLUGIN, "unideploy.metrics", entry)
    monkeypatch.setenv("PYTHONPATH", pythonpath_with(plugins))


def test_a_metric_from_an_entry_point_is_listed_asked_for_by_name_and_printed(metric_plugin, digits_package, digits):
    shown = deploy("optimize", "--help").stdout
    assert "worst-cosine: 1 - the lowest cosine of any row with fp32's (--min-cosine)" in " ".join(shown.split())

    asked = ("optimize", digits_package, "--quantize", "fp16", "--calibration", digits["data"])
    result = deploy(*asked, "--metric", "output=worst-cosine", "--min-cosine", "0.999", "--json")
    assert result.returncode == 0, result.stderr
    judged = json.loads(result.stdout)["accuracy"]["outputs"]["output"]
    assert judged["metric"] == "worst-cosine" and judged["why"] == "as requested"
    assert judged["worst_cosine"] >= 0.999 and judged["budget_points"] == pytest.approx(0.1)
    assert judged["drop_points"] == pytest.approx((1 - judged["worst_cosine"]) * 100, abs=1e-4)
    with Package.open(digits_package) as package:
        assert package.manifest.optimizations[-1]["accuracy"]["outputs"]["output"]["metric"] == "worst-cosine"

    shown = deploy(*asked, "--metric", "worst-cosine", "-o", digits_package.parent / "again.udp").stdout
    words = " ".join(shown.replace("│", " ").split())  # the table's cells, wrapped lines joined
    assert re.search(r"worst-cosine [\d.]+ 1 within worst row's cosine (1\.0{6}|0\.999\d{3})", words), shown
