"""The ``coords`` metric: coordinates a detector regresses per candidate window, judged where and
how the application uses them.

A cascade face detector such as MTCNN gives, per candidate window, class probabilities (class 0
the background) and, beside them, coordinates in units of the window: box-edge offsets and
landmark positions. The application keeps the coordinates of the windows it classes as objects
and drops the rest, and it reads them in units of the window: 0.01 moves a box edge or a landmark
by 1 % of the face. The relative error over every candidate measures neither: most candidates are
background, and dividing by offsets that are small for a well-placed window turns a hundredth of a
pixel into percent. This metric takes the windows fp32 classes as objects and measures the mean
absolute difference of their coordinates in % of the window: the face-alignment benchmarks'
error normalised by the face's size, per coordinate (the layout does not say which values pair
into points), with fp32's coordinates as the ground truth. Whether the same windows are
classed as objects is the class probabilities' own top-1 agreement, judged beside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_UNITS = 2.0  # coordinates in units of their window stay within a window or two of it
BACKGROUND = 0  # the class index MTCNN, SSD and Faster R-CNN give the background


def detected(classes: np.ndarray) -> np.ndarray:
    """Which windows (every position but the class axis) fp32 classes as an object."""
    return np.asarray(classes.argmax(-1) != BACKGROUND)


def in_window_units(values: np.ndarray, classes: np.ndarray) -> bool:
    """Whether ``values`` reads as coordinates of the windows ``classes`` scores: one row of them
    per window (the same leading shape), small enough to be in units of the window, and at least
    one window classed as an object to judge them at."""
    return (
        values.ndim == classes.ndim
        and values.shape[:-1] == classes.shape[:-1]
        and bool(np.isfinite(values).all())
        and float(np.abs(values).max(initial=0.0)) <= MAX_UNITS
        and bool(detected(classes).any())
    )


def agreement(reference: np.ndarray, candidate: np.ndarray, classes: np.ndarray) -> dict[str, Any]:
    """Mean absolute coordinate error at the windows fp32 detects (at least one: ``in_window_units``),
    in units of the window, and the worst window's (its own mean over its coordinates)."""
    windows = detected(classes).reshape(-1)
    width = reference.shape[-1]
    ref = reference.reshape(-1, width)[windows].astype(np.float64)
    cand = candidate.reshape(-1, width)[windows].astype(np.float64)
    per_window = np.abs(ref - cand).mean(axis=1)
    return {
        "coord_error": float(per_window.mean()),
        "coord_error_worst": float(per_window.max()),
        "windows": int(windows.sum()),
        "windows_total": int(windows.size),
    }
