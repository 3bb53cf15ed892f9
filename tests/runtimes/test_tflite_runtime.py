"""The ``tflite`` runtime's failures: what LiteRT says when one of its kernels stops, operator first."""

from __future__ import annotations

import re

import numpy as np
import pytest

from unideploy.errors import RuntimeFailure
from unideploy.runtimes import RUNTIMES
from unideploy.signature import Signature, TensorSpec

tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")


def test_a_kernel_that_stops_is_named_with_its_node_and_the_check_that_failed(tmp_path):
    """Full-integer int8 quantizes x / (relu(x) + 0.001) with one scale for the divisor's range: its
    small values become the zero point, which LiteRT's int8 DIV refuses to divide by (Magika's
    full-integer TFLite did so in the zoo)."""

    class Ratio(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32)])
        def __call__(self, x):
            return {"y": x / (tf.nn.relu(x) + 1e-3)}

    tf.saved_model.save(Ratio(), str(tmp_path / "saved"))
    converter = tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "saved"))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    converter.representative_dataset = lambda: (
        [100 * rng.standard_normal((1, 8)).astype(np.float32)] for _ in range(16)
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    (tmp_path / "ratio.tflite").write_bytes(converter.convert())
    signature = Signature((TensorSpec("x", "float32", (1, 8)),), (TensorSpec("y", "float32", (1, 8)),))
    x = 100 * rng.standard_normal((1, 8)).astype(np.float32)
    with (
        RUNTIMES.get("tflite")(tmp_path / "ratio.tflite", signature) as runtime,
        pytest.raises(RuntimeFailure) as failed,
    ):
        runtime.run({"x": x})
    assert failed.value.message.startswith("LiteRT's DIV kernel stopped at node "), failed.value.message
    assert (
        "where its check tflite/kernels/div.cc" in failed.value.message
        and "zero_point did not hold" in failed.value.message
    )


def test_an_index_past_a_table_is_the_requests_values_as_onnx_runtime_says(tmp_path):
    """A lookup in a table of 10 rows (TFLite's GATHER, as a text model's embedding): an id past it
    stops the kernel on its bounds check, which is the request's values (``RefusedValues``: 400
    served, exit 2), as ONNX Runtime's INVALID_ARGUMENT is; ids within it answer the rows they name."""
    from unideploy.errors import InputError, RefusedValues

    class Lookup(tf.Module):
        table = tf.constant(np.repeat(np.arange(10, dtype=np.float32)[:, None], 3, axis=1))

        @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.int32)])
        def __call__(self, ids):
            return {"y": tf.reduce_mean(tf.gather(self.table, ids), axis=1)}

    tf.saved_model.save(Lookup(), str(tmp_path / "saved"))
    (tmp_path / "lookup.tflite").write_bytes(
        tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "saved")).convert()
    )
    signature = Signature((TensorSpec("ids", "int32", (2, 4)),), (TensorSpec("y", "float32", (2, 3)),))
    ids = np.array([[0, 1, 2, 3], [9, 9, 8, 8]], np.int32)
    with RUNTIMES.get("tflite")(tmp_path / "lookup.tflite", signature) as runtime:
        np.testing.assert_allclose(runtime.run({"ids": ids})["y"], [[1.5] * 3, [8.5] * 3])
        ids[1, 2] = 10
        with pytest.raises(RefusedValues) as refused:
            runtime.run({"ids": ids})
    assert isinstance(refused.value, InputError) and refused.value.exit_code == 2
    assert re.fullmatch(
        r"the model refused the input values: LiteRT's GATHER kernel stopped at node \d+ of the model, "
        r"where its check gather index out of bounds did not hold",
        refused.value.message,
    ), refused.value.message
