"""Batch buckets: calls padded to a few sizes, each run on a session that sees only its own."""

from __future__ import annotations

import numpy as np

from unideploy.package import Package
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.batch_buckets import (
    bucket_for,
    bucket_seconds,
    cut_at_bucket,
    default_buckets,
    pad_rows,
    run_in_buckets,
)
from unideploy.runtimes.selection import open_runtime


def test_default_buckets_are_powers_of_eight_up_to_the_batch_limit():
    assert default_buckets(32) == (1, 8, 32)
    assert default_buckets(24) == (1, 8, 24)
    assert default_buckets(256) == (1, 8, 64, 256)
    assert default_buckets(8) == (1, 8)
    assert default_buckets(1) == (1,)
    assert [bucket_for(n, (1, 8, 32)) for n in (1, 2, 8, 9, 32, 40)] == [1, 8, 8, 32, 32, 32]


# EfficientNet-Lite0's calls on the H200 (bench and served, docs/gpu.md): about the same time up
# to 4 rows, then roughly proportional to the rows
H200_SECONDS = {1: 0.00100, 2: 0.00102, 4: 0.00120, 8: 0.00205, 16: 0.00360, 32: 0.00660}


def test_a_batch_that_would_mostly_be_padding_is_cut_at_the_bucket_below():
    """Where a bucket's calls cost the device about their rows, 9 rows run 8 and carry one and 20
    run 16; where padding is nearly free (the small buckets) or small, everything runs at once."""
    buckets = tuple(H200_SECONDS)
    assert cut_at_bucket([1] * 9, buckets, H200_SECONDS) == 8
    assert cut_at_bucket([1] * 20, buckets, H200_SECONDS) == 16
    assert cut_at_bucket([1] * 15, buckets, H200_SECONDS) == 15  # one row of padding
    assert cut_at_bucket([1] * 3, buckets, H200_SECONDS) == 3  # a 4-row call costs what a 2-row one does
    assert cut_at_bucket([1] * 8, buckets, H200_SECONDS) == 8  # a bucket's size: nothing to cut
    assert cut_at_bucket([4, 3, 2], buckets, H200_SECONDS) == 2  # whole requests: 7 rows now, 2 next
    assert cut_at_bucket([6, 5], buckets, H200_SECONDS) == 1  # 6 rows in the 8-row bucket, 5 next
    assert cut_at_bucket([9, 2], buckets, H200_SECONDS) == 2  # the first request alone is past 8
    assert cut_at_bucket([1] * 9, buckets, {}) == 9  # not measured: padded, as before
    assert cut_at_bucket([1] * 40, buckets, H200_SECONDS) == 40  # past the largest: run in pieces


def test_each_bucket_is_planned_then_timed_on_a_real_session(cnn_package):
    """A bucket's first call (the GPU's re-plan) is not its time: each bucket runs once, then twice
    more timed, and the faster counts."""
    x = np.random.default_rng(0).random((8, 1, 8, 8), dtype=np.float32)
    with Package.open(cnn_package) as pkg:
        _, engine = open_runtime(pkg, options=RuntimeOptions(device="cpu"))
        sizes: list[int] = []

        def run(inputs):
            sizes.append(inputs["x"].shape[0])
            return engine.run(inputs)

        measured = bucket_seconds(run, lambda size: {"x": x[:size]}, (1, 8))
    assert sizes == [1, 1, 1, 8, 8, 8]
    assert set(measured) == {1, 8} and all(s > 0 for s in measured.values())


def test_padding_repeats_a_real_row():
    ids = np.array([[5, 6], [7, 8]], np.int64)
    padded = pad_rows({"ids": ids}, 4)["ids"]
    assert padded.tolist() == [[5, 6], [7, 8], [7, 8], [7, 8]]
    assert pad_rows({"ids": ids}, 2)["ids"] is ids


def test_padding_and_pieces_follow_each_tensors_batch_axis(tmp_path):
    """Recurrent state [2, batch, 3] beside x [batch, 4] (ONNX's LSTM layout): padded, cut and
    joined along axis 1 (buckets applied only where every input's batch was axis 0, so a GPU
    session of such a model re-planned for each new batch size). A real session through buckets
    answers every row as a direct run does."""
    from onnx_models import rows_of_state, stateful_model

    import unideploy

    state = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    padded = pad_rows({"state": state, "scale": np.float32(2)}, 4, {"state": 1})
    assert padded["state"].shape == (2, 4, 3) and padded["scale"] == 2
    np.testing.assert_array_equal(padded["state"][:, 3], state[:, 1])  # the last real row, repeated

    np.savez(tmp_path / "example.npz", **rows_of_state(4, 0))
    unideploy.export(
        stateful_model(tmp_path / "stateful.onnx"), tmp_path / "pkg", example_inputs=str(tmp_path / "example.npz")
    ).close()
    rows = rows_of_state(11, 1)
    with Package.open(tmp_path / "pkg") as pkg:
        signature = pkg.manifest.signature
        assert signature.output_batch_axes == {"y": 0, "stateN": 1}
        _, engine = open_runtime(pkg, options=RuntimeOptions(device="cpu"))
        direct = engine.run(rows)
        seen: list[tuple[int, int]] = []

        def run(size, inputs):
            seen.append((inputs["x"].shape[0], inputs["state"].shape[1]))
            return engine.run(inputs)

        out = run_in_buckets(run, rows, (1, 4), signature.batch_axes, signature.output_batch_axes)
    assert seen == [(4, 4), (4, 4), (4, 4)]  # 11 rows: 4 + 4 + 3 padded to 4
    for name in ("y", "stateN"):
        np.testing.assert_allclose(out[name], direct[name], rtol=1e-6, atol=1e-6)


def test_a_real_session_answers_the_same_through_buckets(cnn_package):
    """Every row answered as by a direct run; the session saw only bucket sizes, and a call past
    the largest bucket ran in pieces of it."""
    x = np.random.default_rng(0).random((70, 1, 8, 8), dtype=np.float32)
    with Package.open(cnn_package) as pkg:
        _, engine = open_runtime(pkg, options=RuntimeOptions(device="cpu"))
        direct = engine.run({"x": x})["output"]
        seen: list[int] = []

        def run(size, inputs):
            seen.append(inputs["x"].shape[0])
            return engine.run(inputs)

        for rows in (1, 3, 70):
            out = run_in_buckets(run, {"x": x[:rows]}, (1, 4, 32))["output"]
            np.testing.assert_allclose(out, direct[:rows], rtol=1e-6, atol=1e-6)
    assert seen == [1, 4, 32, 32, 32]  # 70 rows: 32 + 32 + 6 padded to 32


def test_engines_that_do_not_pay_per_shape_ignore_buckets(cnn_package):
    with Package.open(cnn_package) as pkg:
        _, engine = open_runtime(pkg, options=RuntimeOptions(device="cpu", batch_buckets=(1, 8)))
        assert engine.batch_buckets == () and "batch_buckets" not in engine.describe()
