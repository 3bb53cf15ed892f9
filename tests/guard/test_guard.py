"""One guard for every stage: it holds the fp32 model's outputs on the evaluation rows, runs a
candidate once however often it is judged, and admits it or raises the stage's own refusal with
the numbers. Real sessions of the digits CNN (trained on real digits) and its fp16 conversion."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnxruntime.transformers.float16 import convert_float_to_float16

from unideploy.errors import AccuracyBudgetError
from unideploy.guard.data import load_dataset, split
from unideploy.guard.guard import Guard
from unideploy.onnx.session import cpu_session
from unideploy.package import Package


def _runner(path):
    session = cpu_session(path)
    names = [o.name for o in session.get_outputs()]
    return lambda batch: dict(zip(names, session.run(None, batch)))


@pytest.fixture(scope="module")
def guarded(digits, tmp_path_factory):
    """A guard on the validation half of the digits data, its fp32 model and an fp16 candidate."""
    with Package.open(digits["package"]) as package:
        fp32 = package.path_of(package.manifest.base_onnx())
        signature = package.manifest.signature
    fp16 = tmp_path_factory.mktemp("fp16") / "fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
    validation = split(load_dataset(digits["data"], signature))[1]
    guard = Guard.of(_runner(fp32), validation.batches(), validation.labels, rows_are="validation rows")
    return guard, fp32, fp16


def test_a_candidate_is_run_once_however_often_it_is_judged(guarded):
    guard, _, fp16 = guarded
    opened = []

    def open_fp16():
        opened.append(fp16)
        return _runner(fp16)

    first = guard.judge(fp16, open_fp16)
    assert guard.judge(fp16, open_fp16) is first and opened == [fp16]
    # labelled data: the class scores are judged by accuracy against the labels, fp16 keeps it
    assert first["outputs"]["output"]["metric"] == "accuracy" and first["within_budget"], first
    assert first["rows"] == sum(len(b["x"]) for b in guard.batches)


def test_the_fp32_model_judged_against_itself_is_exact(guarded):
    guard, fp32, _ = guarded
    accuracy = guard.judge(fp32, lambda: _runner(fp32))
    assert accuracy["drop_points"] == 0.0 and guard.admit(accuracy, AccuracyBudgetError) is accuracy


def test_over_budget_is_the_stage_own_refusal_with_the_numbers(guarded):
    guard, _, fp16 = guarded
    noisy = np.random.default_rng(0)
    run = _runner(fp16)

    def scrambled(batch):  # a candidate that swaps the classes of most rows
        return {"output": np.roll(run(batch)["output"], 1, axis=-1) + noisy.normal(0, 1e-3, (len(batch["x"]), 10))}

    accuracy = guard.judge("scrambled", lambda: scrambled)
    assert not accuracy["within_budget"]
    with pytest.raises(AccuracyBudgetError) as refused:
        guard.admit(accuracy, lambda numbers: AccuracyBudgetError(f"the candidate is over the budget {numbers}"))
    rows = accuracy["rows"]
    assert refused.value.message.startswith(f"the candidate is over the budget on {rows} validation rows: output: ")
    assert "accuracy drop" in refused.value.message and "(budget 1)" in refused.value.message


def test_over_a_stream_each_model_carries_its_own_state_and_its_error_compounds(tmp_path):
    """A streaming model judged over a stream: the candidate is fed the state it returned itself,
    as a served sequence feeds it, so a small error in its state shows in the outputs it leads to
    (per row, with the reference's state given, the same candidate's output is exact). The state
    output is judged through them, not by itself."""
    from onnx_models import running_average_model

    import unideploy

    with unideploy.export(running_average_model(tmp_path / "a.onnx"), tmp_path / "pkg", state=["h=h_next"]) as package:
        signature = package.manifest.signature
        fp32 = _runner(package.path_of(package.manifest.base_onnx()))
    drift = 0.01

    def drifting(batch):  # its state a hundredth off each call; its output right for the state it is given
        out = fp32(batch)
        return {"y": out["y"], "h_next": out["h_next"] + drift}

    x = np.random.default_rng(1).standard_normal((40, 4)).astype(np.float32)
    streamed = Guard.of(fp32, [{"x": x}], stream=signature, rows=40, rows_are="validation rows (1 stream)")
    record = streamed.judge("drifting", lambda: drifting)
    assert set(record["outputs"]) == {"y"} and record["rows"] == 40
    # the state's error e grows as e = 0.5 e + drift towards 2 * drift, and y = h + 2 x is off by it
    assert record["outputs"]["y"]["max_abs_error"] == pytest.approx(2 * drift, rel=0.01)
    carried = {"x": x, "h": np.vstack([np.zeros((1, 4), np.float32), *streamed.reference[0]["y"][:-1, None] / 2])}
    per_row = Guard.of(fp32, [carried], rows=40).judge("drifting", lambda: drifting)
    assert per_row["outputs"]["y"]["max_abs_error"] < 1e-6 and per_row["outputs"]["h_next"]["max_abs_error"] > 0
