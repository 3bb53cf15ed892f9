"""Text tensors (ONNX STRING) through export, verify and run: scikit-learn models converted by
skl2onnx on the real iris data, answering or taking species names."""

from __future__ import annotations

import json

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy
from unideploy.errors import InputError


def test_a_classifier_answering_class_names_exports_verifies_and_runs(text_packages, text_models):
    with unideploy.open_package(text_packages["labels"]) as package:
        outputs = {t.name: t for t in package.manifest.signature.outputs}
        assert outputs["label"].dtype == "string" and outputs["probabilities"].dtype == "float32"
        assert package.manifest.validation["onnx-fp32"]["outputs"]["label"]["mismatched"] == 0
    truth = np.load(text_models["truth"])
    found = unideploy.run(text_packages["labels"], {"X": truth["features"]})["label"]
    assert found.dtype.kind == "U" and (found == truth["species"]).mean() > 0.95  # the classifier's own accuracy
    verify = deploy("verify", text_packages["labels"], "--json")
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["artifacts"][0]["status"] == "passed"
    run = deploy("run", text_packages["labels"], "--input", text_models["features"], "--json")
    label = json.loads(run.stdout)["outputs"]["label"]
    assert label["dtype"] == "string" and label["data"][:2] == ["setosa", "setosa"]


def test_a_text_input_takes_str_and_utf8_bytes_and_refuses_numbers(text_packages):
    package = text_packages["species"]
    names = np.array([["setosa"], ["virginica"]])
    lengths = unideploy.run(package, {"species": names})["variable"][:, 0]
    assert lengths[0] < 2.0 < 5.0 < lengths[1]  # setosa's petals are short, virginica's long
    np.testing.assert_array_equal(unideploy.run(package, {"species": np.char.encode(names)})["variable"][:, 0], lengths)
    np.testing.assert_array_equal(unideploy.run(package, {"species": names.astype(object)})["variable"][:, 0], lengths)
    with pytest.raises(InputError, match="input 'species' has dtype float32, expected string"):
        unideploy.run(package, {"species": np.ones((2, 1), np.float32)})


def test_text_inputs_need_real_examples_and_zipmap_names_its_way_out(text_models, tmp_path):
    assert_one_line_error(
        deploy("export", text_models["species"], "-o", tmp_path / "a"),
        2,
        r"input\(s\) 'species' hold text: random strings cannot stand for it.*--example-input",
    )
    assert_one_line_error(
        deploy("export", text_models["zipmap"], "-o", tmp_path / "b", "--example-input", text_models["features"]),
        2,
        r"ONNX value 'output_probability' is a sequence of maps, not a tensor.*'zipmap': False",
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
