"""Batch buckets: calls padded to a few sizes, each run on a session that sees only its own."""

from __future__ import annotations

import numpy as np

from unideploy.package import Package
from unideploy.runtimes import RuntimeOptions
from unideploy.runtimes.batch_buckets import bucket_for, default_buckets, pad_rows, run_in_buckets
from unideploy.runtimes.selection import open_runtime


def test_default_buckets_are_powers_of_two_up_to_the_batch_limit():
    assert default_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert default_buckets(24) == (1, 2, 4, 8, 16, 24)
    assert default_buckets(1) == (1,)
    assert [bucket_for(n, (1, 8, 32)) for n in (1, 2, 8, 9, 32, 40)] == [1, 8, 8, 32, 32, 32]


def test_padding_repeats_a_real_row():
    ids = np.array([[5, 6], [7, 8]], np.int64)
    padded = pad_rows({"ids": ids}, 4)["ids"]
    assert padded.tolist() == [[5, 6], [7, 8], [7, 8], [7, 8]]
    assert pad_rows({"ids": ids}, 2)["ids"] is ids


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
