"""Reference batches: which one holds the user's own sizes."""

from __future__ import annotations

import numpy as np
import pytest

from unideploy.errors import InputError
from unideploy.samples import MAX_EXAMPLE_BATCHES, example_batches, fixed_rows, run_in_batches, widest
from unideploy.signature import Signature, StateSpec, TensorSpec


def test_the_widest_batch_is_the_users_example_not_its_crop():
    """example_batches puts the batch with fewer rows first: a 256-row example's one-row crop (544
    samples instead of 576) comes before it; sizes for a fixed-size conversion are the example's."""
    signature = Signature((TensorSpec("input", "float32", ("batch", "samples")),))
    example = {"input": np.zeros((256, 576), np.float32)}
    crop, full = example_batches(example, signature)
    assert crop["input"].shape == (1, 544) and full["input"].shape == (256, 576)
    assert widest([crop, full], signature) is full


def test_without_dynamic_sizes_the_first_batch_is_taken():
    signature = Signature((TensorSpec("x", "float32", ("batch", 4)),))
    first, second = {"x": np.zeros((1, 4))}, {"x": np.zeros((8, 4))}
    assert widest([first, second], signature) is first


def test_a_model_that_fixes_its_batch_takes_an_example_a_batch_at_a_time():
    """A batch-2 model given 6 rows runs 3 batches of 2; rows its batch does not divide are refused
    naming the size; a dynamic batch keeps the example whole; at most MAX_EXAMPLE_BATCHES are kept."""
    fixed = Signature((TensorSpec("x", "float32", (2, 4)), TensorSpec("sr", "int64", ())))
    assert fixed_rows(fixed) == 2 and fixed_rows(Signature((TensorSpec("x", "float32", ("batch", 4)),))) is None
    batches = example_batches({"x": np.arange(24, dtype=np.float32).reshape(6, 4), "sr": np.array(8)}, fixed)
    assert [b["x"].shape for b in batches] == [(2, 4)] * 3 and batches[2]["x"][0, 0] == 16
    assert all(b["sr"] == 8 for b in batches)  # a scalar is every batch's
    with pytest.raises(InputError, match="has size 5 on axis 0, expected 2"):
        example_batches({"x": np.zeros((5, 4), np.float32), "sr": np.array(8)}, fixed)
    one = Signature((TensorSpec("x", "float32", (1, 4)),))
    assert len(example_batches({"x": np.zeros((100, 4), np.float32)}, one)) == MAX_EXAMPLE_BATCHES
    dynamic = Signature((TensorSpec("x", "float32", ("batch", 4)),))
    assert [b["x"].shape for b in example_batches({"x": np.zeros((6, 4), np.float32)}, dynamic)] == [(1, 4), (6, 4)]


def test_a_model_that_fixes_its_batch_runs_a_file_of_rows_a_batch_at_a_time():
    """run_in_batches: each batch of 2 through the model, the answers joined in order; whole where
    the batch is dynamic or the rows are one batch."""
    fixed = Signature((TensorSpec("x", "float32", (2, 3)),), (TensorSpec("y", "float32", (2,)),))
    calls = []

    def run(inputs):
        calls.append(inputs["x"].shape)
        return {"y": inputs["x"].sum(axis=1)}

    x = np.arange(18, dtype=np.float32).reshape(6, 3)
    assert run_in_batches(run, {"x": x}, fixed)["y"].tolist() == x.sum(axis=1).tolist() and calls == [(2, 3)] * 3
    calls.clear()
    run_in_batches(run, {"x": x[:2]}, fixed)
    dynamic = Signature((TensorSpec("x", "float32", ("batch", 3)),), (TensorSpec("y", "float32", ("batch",)),))
    run_in_batches(run, {"x": x}, dynamic)
    assert calls == [(2, 3), (6, 3)]


def test_a_streaming_model_given_none_of_its_state_runs_the_rows_as_one_stream():
    """run_in_batches with the state left out: a row a call (a dynamic batch) with the state fed
    back from its initial value, the rows' answers joined and the last state given back; LSTM-style
    state [2, batch, 3] has its rows on axis 1. Some state given and some not is refused."""
    signature = Signature(
        (TensorSpec("x", "float32", ("batch", 3)), TensorSpec("h", "float32", (2, "batch", 3))),
        (TensorSpec("y", "float32", ("batch", 3)), TensorSpec("h_next", "float32", (2, "batch", 3))),
    ).with_state((StateSpec("h", "h_next", 1.0),))
    calls = []

    def run(inputs):
        calls.append(inputs["x"].shape)
        h_next = 0.5 * inputs["h"] + inputs["x"][None]
        return {"y": h_next.sum(axis=0), "h_next": h_next}

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = run_in_batches(run, {"x": x}, signature)
    h, expected = np.ones((2, 1, 3), np.float32), []
    for row in x:
        h = 0.5 * h + row
        expected.append(h.sum(axis=0)[0])
    assert calls == [(1, 3)] * 4 and got["h_next"].shape == (2, 1, 3)
    np.testing.assert_allclose(got["y"], np.array(expected))
    np.testing.assert_allclose(got["h_next"], h)
    given = run_in_batches(run, {"x": x[:1], "h": np.zeros((2, 1, 3), np.float32)}, signature)  # the caller's state
    np.testing.assert_allclose(given["h_next"], np.broadcast_to(x[0], (2, 1, 3)))
    two = Signature(
        (*signature.inputs, TensorSpec("c", "float32", (2, "batch", 3))),
        (*signature.outputs, TensorSpec("c_next", "float32", (2, "batch", 3))),
    ).with_state((StateSpec("h", "h_next"), StateSpec("c", "c_next")))
    with pytest.raises(InputError, match="state input\\(s\\) 'h' given without 'c'"):
        run_in_batches(run, {"x": x, "h": np.zeros((2, 4, 3), np.float32)}, two)


def test_a_fixed_size_artifact_s_rows_lie_where_its_package_s_do():
    """A batch-1 edge artifact of a recurrent model ([1, 3] and its state [2, 1, 3]) cannot say from
    its sizes that the state's rows are on axis 1; its package's signature can (``rows_like``, which
    ``Manifest.signature_of`` sets). So a file of rows with their state runs a row a call, the state
    cut and the answers joined along axis 1, as on the package's dynamic ONNX artifact (before, the
    state's axis 0 was read as its rows, the batch as not fixed, and the file refused at 5 rows)."""
    package = Signature(
        (TensorSpec("x", "float32", ("batch", 3)), TensorSpec("h", "float32", (2, "batch", 3))),
        (TensorSpec("y", "float32", ("batch", 3)), TensorSpec("h_next", "float32", (2, "batch", 3))),
    )
    fixed = Signature(
        (TensorSpec("x", "float32", (1, 3)), TensorSpec("h", "float32", (2, 1, 3))),
        (TensorSpec("y", "float32", (1, 3)), TensorSpec("h_next", "float32", (2, 1, 3))),
        rows_like=package,
    )
    assert fixed_rows(fixed) == 1 and fixed.batch_axes == {"x": 0, "h": 1}
    calls = []

    def run(inputs):
        calls.append((inputs["x"].shape, inputs["h"].shape))
        h_next = 0.5 * inputs["h"] + inputs["x"][None]
        return {"y": h_next.sum(axis=0), "h_next": h_next}

    rng = np.random.default_rng(0)
    rows = {"x": rng.standard_normal((5, 3)).astype(np.float32), "h": rng.standard_normal((2, 5, 3)).astype(np.float32)}
    got = run_in_batches(run, rows, fixed)
    assert calls == [((1, 3), (2, 1, 3))] * 5 and got["h_next"].shape == (2, 5, 3)
    np.testing.assert_allclose(got["h_next"], 0.5 * rows["h"] + rows["x"][None], rtol=1e-6)
