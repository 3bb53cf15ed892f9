"""Validation's row feeding for artifacts of a fixed size: the rows of each input along its batch
axis, recurrent state ``[layers, batch, hidden]`` included, through a real ONNX Runtime session
that takes one row only (as a TFLite artifact converted at batch 1 does)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from unideploy.onnx.session import cpu_session
from unideploy.package import Package
from unideploy.signature import Signature, TensorSpec
from unideploy.validation import DEFAULT_ATOL, fitted, share_of_each_output, tolerance_text, validate, validate_like


def _one_row_step(path) -> None:
    """y = x + sum(state), stateN = state * 2: x [1, 4], state [2, 1, 4], fixed at one row."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["state"], ["total"], keepdims=0, axes=None),
            helper.make_node("Add", ["x", "total"], ["y"]),
            helper.make_node("Add", ["state", "state"], ["stateN"]),
        ],
        "step",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, 1, 4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, 1, 4]),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_one_row_artifact_is_fed_each_row_along_its_inputs_batch_axes(tmp_path):
    _one_row_step(tmp_path / "step.onnx")
    session = cpu_session(tmp_path / "step.onnx")

    def run(inputs):
        return dict(zip(("y", "stateN"), session.run(None, inputs)))

    package = Signature(  # the package's signature names the batch: axis 1 of the state
        (TensorSpec("x", "float32", ("batch", 4)), TensorSpec("state", "float32", (2, "batch", 4))),
        (TensorSpec("y", "float32", ("batch", 4)), TensorSpec("stateN", "float32", (2, "batch", 4))),
    )
    artifact = Signature(  # the artifact's own: fixed at one row, which cannot say where rows lie
        (TensorSpec("x", "float32", (1, 4)), TensorSpec("state", "float32", (2, 1, 4))),
        (TensorSpec("y", "float32", (1, 4)), TensorSpec("stateN", "float32", (2, 1, 4))),
    )
    rng = np.random.default_rng(0)
    x, state = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32)
    expected = {"y": x + state.sum(axis=(0, 2))[:, None], "stateN": 2 * state}
    other_width = {"x": np.zeros((1, 5), np.float32), "state": np.zeros((2, 1, 4), np.float32)}
    samples = [({"x": x, "state": state}, expected), (other_width, {})]
    rows, fit = fitted(run, artifact, samples, (package.batch_axes, package.output_batch_axes))
    assert len(fit) == 1  # the sample of another width is one this artifact cannot take
    record = validate(rows, fit, 1e-5, 1e-5, reference="onnx")
    assert record["passed"], record


def test_an_output_s_own_atol_holds_it_and_only_it():
    """The logits a source's own engines disagree on get their own atol; every other output keeps
    the one asked for, and the record says both."""
    expected = {"logits": np.array([[1000.0, -800.0]]), "score": np.array([[0.5]])}
    actual = {"logits": np.array([[1000.3, -800.0]]), "score": np.array([[0.6]])}
    wide = validate(lambda _: actual, [({}, expected)], 1e-4, 1e-6, "tflite", {"logits": 0.5})
    assert wide["outputs"]["logits"]["mismatched"] == 0 and wide["outputs"]["score"]["mismatched"] == 1
    assert wide["output_atol"] == {"logits": 0.5} and not wide["passed"]
    assert tolerance_text(wide) == "atol 0.0001 (logits: 0.5), rtol 1e-06"
    assert "output_atol" not in validate(lambda _: actual, [({}, expected)], 1.0, 0.0, "tflite")


def test_a_share_of_each_output_is_its_own_scale_and_labels_get_none():
    references = [
        ({}, {"score": np.array([[0.9]]), "logits": np.array([[-1700.0, 3.0]]), "label": np.array([2])}),
        ({}, {"score": np.array([[0.2]]), "logits": np.array([[10.0, 0.0]]), "label": np.array([1])}),
        ({}, {"score": np.array([[0.0]]), "logits": np.zeros((1, 2)), "label": np.array([0])}),
    ]
    held = share_of_each_output(references, 0.01)
    assert held == {"score": pytest.approx(0.009), "logits": pytest.approx(17.0)}  # labels: equal or not
    assert share_of_each_output([({}, {"zero": np.zeros(3)})], 0.01) == {"zero": 1e-4}  # never below the default


def test_another_format_of_an_artifact_is_held_as_it_was_and_says_why(digits_package):
    """An ORT-format file or a MindIR made from the ONNX artifact keeps that artifact's tolerances,
    an output's own atol included, and the record says why that output has it."""
    with Package.open(digits_package) as package:
        manifest, base = package.manifest, package.manifest.base_onnx()
        session = cpu_session(str(package.path_of(base)))
        output = session.get_outputs()[0].name
        manifest.validation[base.id]["output_atol"] = {output: 0.5}
        manifest.validation[base.id]["tolerance_basis"] = "the source's two engines differ by 0.25"
        references = package.reference_pairs()

        def run(inputs):
            return dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs), strict=True))

        held = validate_like(manifest, base.id, run, references, "onnx")
        assert held["passed"] and held["output_atol"] == {output: 0.5}
        assert held["tolerance_basis"] == "the source's two engines differ by 0.25"
        plain = validate_like(manifest, None, run, references, "onnx")  # nothing to be held to: the defaults
        assert plain["atol"] == DEFAULT_ATOL and "output_atol" not in plain and "tolerance_basis" not in plain
