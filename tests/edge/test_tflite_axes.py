"""Which outputs a converter gave with their axes moved, and how to put them back (onnx2tf read
Silero VAD's state [2, batch, 128] as [batch, 2, 128]; the whole model is in tests/test_zoo.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert", reason="the edge extra is not installed")

from unideploy.edge.tflite import moved_axes


def test_an_output_in_another_order_gets_the_permutation_that_puts_it_back():
    state = np.arange(2 * 1 * 5).reshape(2, 1, 5)
    produced = {"stateN": state.transpose(1, 0, 2), "output": np.zeros((1, 1))}
    moved = moved_axes(produced, {"stateN": state, "output": np.zeros((1, 1))})
    assert moved == {"stateN": [1, 0, 2]}
    np.testing.assert_array_equal(produced["stateN"].transpose(moved["stateN"]), state)


def test_outputs_of_the_right_shape_or_of_other_sizes_are_not_moved():
    assert moved_axes({"y": np.zeros((2, 3))}, {"y": np.zeros((2, 3))}) == {}
    assert moved_axes({"y": np.zeros((2, 4))}, {"y": np.zeros((2, 3))}) == {}  # wrong, not moved: validation says so
    assert moved_axes({}, {"y": np.zeros((2, 3))}) == {}


def test_repeated_sizes_take_the_first_axis_that_fits():
    assert moved_axes({"y": np.zeros((4, 2, 2))}, {"y": np.zeros((2, 2, 4))}) == {"y": [1, 2, 0]}
