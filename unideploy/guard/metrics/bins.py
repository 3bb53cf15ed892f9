"""The ``bins`` metric: scores over ordered bins, where the argmax moving to the next bin is a
small error, not a wrong answer.

A pitch tracker (CREPE: 360 bins of 20 cents; Basic Pitch's contour: 264 bins of a third of a
semitone), an angle or an age regressed as a distribution over bins is read by its best bin, often
refined by the scores around it. Its scores rise and fall smoothly along the bin axis, since its
targets were blurred over neighbouring bins; a classifier's scores over unrelated classes do not.
Exact top-1 agreement counts a move of one bin (20 cents, inaudible) as a miss: on CREPE's INT8,
most of its disagreements were one bin. Pitch is evaluated as the share of frames within 50 cents
of the truth; this metric keeps one bin either way, which is within that for both models above.
"""

from __future__ import annotations

import numpy as np

MIN_BINS = 32  # fewer scores hold too few neighbours to tell order from chance
MIN_CORRELATION = 0.5  # the median row's correlation of each score with the next one's
TOLERANCE = 1  # the bins the argmax may move either way


def correlation_of_neighbours(ref: np.ndarray) -> float:
    """The median row's (or position's) correlation of each score with its neighbour on the last
    axis: near 1 for a smooth curve over ordered bins, near 0 for unrelated classes (an ImageNet
    classifier's logits 0.11, BlazePose's 195 landmark coordinates 0.14; CREPE 0.92, Basic Pitch's
    contour 0.66). Rows without any spread say nothing and are left out."""
    values = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    left = values[:, :-1] - values[:, :-1].mean(-1, keepdims=True)
    right = values[:, 1:] - values[:, 1:].mean(-1, keepdims=True)
    norms = np.sqrt((left * left).sum(-1) * (right * right).sum(-1))
    spread = norms > 0
    if not spread.any():
        return 0.0
    return float(np.median((left * right).sum(-1)[spread] / norms[spread]))


def ordinal(ref: np.ndarray) -> float | None:
    """The correlation of neighbouring scores where ``ref`` holds float scores over at least
    ``MIN_BINS`` bins that vary smoothly from bin to bin; None where it does not."""
    if ref.ndim < 2 or ref.shape[-1] < MIN_BINS or not np.issubdtype(ref.dtype, np.floating):
        return None
    if not np.isfinite(ref).all():
        return None
    correlation = correlation_of_neighbours(ref)
    return correlation if correlation >= MIN_CORRELATION else None


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float | int]:
    """The share of rows (positions) whose best bin lies within ``TOLERANCE`` bins of fp32's, and
    the exact share beside it."""
    moved = np.abs(reference.argmax(-1) - candidate.argmax(-1))
    return {
        "bins_agreement": float((moved <= TOLERANCE).mean()),
        "bins_tolerance": TOLERANCE,
        "bins_moved_most": int(moved.max(initial=0)),
    }
