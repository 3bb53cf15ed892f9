"""Which constants a ``tflite-fp16`` keeps in fp32 (edge/tflite_fp16.py): an epsilon fp16 flushes
to zero, and the weights of a sum that cancels before a log, on a SavedModel built here; Basic
Pitch's real SavedModel, whose fp16 was NaN everywhere, is in tests/test_zoo.py."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")
tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")

from ai_edge_litert.interpreter import Interpreter  # noqa: E402
from tensorflow.lite.tools import flatbuffer_utils  # noqa: E402

from unideploy.edge.tflite import saved_model_to_tflite  # noqa: E402

EPSILON = 1e-10  # as a spectrogram's log(|X|^2 + 1e-10) adds: fp16 holds nothing below 6e-08


class _LogEnergy(tf.Module):
    """log((x . w)^2 + 1e-10) of two weights that nearly cancel (1.0001 and -1: fp16 rounds the
    first to 1.0), then a dense layer of 64x64 ordinary weights that fp16 carries."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.cancel = tf.constant(np.array([[1.0001], [-1.0], [0.5], [0.25]], np.float32))
        self.spread = tf.constant(rng.standard_normal((4, 64)).astype(np.float32))
        self.dense = tf.constant((rng.standard_normal((64, 64)) / 8).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        energy = tf.math.log(tf.square(tf.matmul(x, self.cancel)) + EPSILON)
        return tf.matmul(energy * tf.matmul(x, self.spread), self.dense)


def _outputs(path, rows: np.ndarray) -> np.ndarray:
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    (given,), (taken,) = interpreter.get_input_details(), interpreter.get_output_details()
    out = []
    for row in rows:
        interpreter.set_tensor(given["index"], row[None])
        interpreter.invoke()
        out.append(interpreter.get_tensor(taken["index"])[0].copy())
    return np.stack(out)


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("log-energy") / "saved_model"
    module = _LogEnergy()
    tf.saved_model.save(module, str(path), signatures=module.__call__)
    return path


def _rows() -> np.ndarray:
    """Silence (the sum is 0: only the epsilon keeps the log finite), the cancelling pair (1e-4),
    and ordinary rows."""
    rng = np.random.default_rng(1)
    return np.concatenate([np.zeros((2, 4)), [[1.0, 1.0, 0.0, 0.0]] * 2, rng.uniform(-1, 1, (4, 4))]).astype(np.float32)


def test_fp16_keeps_the_epsilon_and_the_cancelling_weights_in_fp32(saved_model, tmp_path):
    rows = _rows()
    fp32, _ = saved_model_to_tflite(saved_model, "fp32", tmp_path)
    fp16, kept = saved_model_to_tflite(saved_model, "fp16", tmp_path, [{"x": row[None]} for row in rows])
    reference, reduced = _outputs(fp32, rows), _outputs(fp16, rows)
    assert np.isfinite(reference).all()
    # within fp16's rounding of the dense layers, where without the rule silence is -inf or NaN
    # and the cancelling pair's log is 4.6 off (log(1e-10) for log(1e-8))
    assert np.isfinite(reduced).all(), reduced
    assert np.abs(reduced - reference).max() <= 1e-2 * np.abs(reference).max(), np.abs(reduced - reference).max()
    reasons = list(kept.values())
    assert any("holds values up to 1e-10, below fp16's normal range" in r for r in reasons), kept
    assert any("computes what the log reads, which comes down to" in r for r in reasons), kept
    # the 64x64 layer after the log stays fp16: the artifact is smaller than fp32 by most of it
    assert fp16.stat().st_size < fp32.stat().st_size - 64 * 64 * 2 * 0.9, (fp16.stat().st_size, fp32.stat().st_size)
    # the fp16 copies nothing reads are emptied, the metadata's buffers (the runtime version) not
    model = flatbuffer_utils.read_model(str(fp16))
    assert all(len(model.buffers[entry.buffer].data) for entry in model.metadata), model.metadata


def test_without_calibration_rows_only_the_epsilon_stays_fp32(saved_model, tmp_path):
    """With no rows to measure on, the magnifier's input is unknown: the epsilon alone is put back
    (silence stays finite) and the cancelling pair keeps fp16's rounding, which the accuracy guard
    then judges (tests/edge/test_edge_target.py)."""
    rows = _rows()
    saved_model_to_tflite(saved_model, "fp32", tmp_path)
    fp16, kept = saved_model_to_tflite(saved_model, "fp16", tmp_path)
    assert len(kept) == 1 and "below fp16's normal range" in next(iter(kept.values())), kept
    assert np.isfinite(_outputs(fp16, rows)).all()
