"""Probability maps (a text detector's or a segmenter's one-channel output) judged by what
post-processing reads from them: the pixels it marks, or the separate regions (text boxes) it finds.

A DB text detector binarizes its map at 0.3 and turns each connected region into a box; a pixel
or two moved on a region's border changes no box, a region lost, split or merged changes the
text the recognizer reads. Regions are matched one to one at IoU > 0.5 and summarised as the
harmonic mean of precision and recall, as ICDAR's text-detection evaluation does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

THRESHOLDS = (0.3, 0.5)  # pixels: DB text detection binarizes at 0.3; a probability's own midpoint is 0.5
REGION_THRESHOLD = 0.3  # regions: where DB's post-processing binarizes (PaddleOCR's and RapidOCR's det_db_thresh)
MAX_UNDECIDED = 0.1  # the share of a probability map's values that may lie between 0.1 and 0.9
REGION_IOU = 0.5  # ICDAR's match: IoU above it (two regions can each match at most one this way)
MIN_REGION_SIDE = 3  # DB's post-processing drops regions whose box has a shorter side
MIN_REGIONS_PER_MAP = 2.0  # maps holding at least this many separate regions, on average, are judged by regions


def is_probability_map(ref: np.ndarray) -> bool:
    """One channel of values in [0, 1] over spatial positions, nearly all of them decided (a
    sigmoid's map is near 0 or 1 almost everywhere: PP-OCRv4's text map has 0.2 % of its pixels
    between 0.1 and 0.9; an image or a depth map in [0, 1] has most), with some foreground."""
    return (
        (ref.ndim == 3 or (ref.ndim == 4 and 1 in (ref.shape[1], ref.shape[-1])))
        and decided(ref)
        and bool((ref >= max(THRESHOLDS)).any())
    )


def decided(ref: np.ndarray) -> bool:
    """Probabilities of a yes or a no, nearly all of them decided: values in [0, 1], at most
    ``MAX_UNDECIDED`` of them between 0.1 and 0.9 (a sigmoid's, where an image's or a regressed
    value's in [0, 1] spread over the range)."""
    values = ref.astype(np.float64)
    return (
        bool((values >= -1e-6).all() and (values <= 1 + 1e-6).all())
        and float(((values > 0.1) & (values < 0.9)).mean()) <= MAX_UNDECIDED
    )


def decision_agreement(a: np.ndarray, b: np.ndarray, thresholds: Sequence[float]) -> dict[str, float]:
    """The share of values both models decide alike (>= threshold or not), per threshold."""
    return {f"{t:g}": float(((a >= t) == (b >= t)).mean()) for t in thresholds}


def mean_regions(ref: np.ndarray) -> float:
    """Separate regions per map, over the maps that mark any (at DB's threshold)."""
    counts = [int(np.count_nonzero(_region_areas(_label(m >= REGION_THRESHOLD)))) for m in _maps(ref)]
    marked = [c for c in counts if c]
    return float(np.mean(marked)) if marked else 0.0


def mask_ious(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """IoU of the foreground (>= threshold) the two maps mark, over all rows, per threshold; where
    neither marks any, they agree."""
    ious = {}
    for threshold in THRESHOLDS:
        fa, fb = a >= threshold, b >= threshold
        union = int(np.logical_or(fa, fb).sum())
        ious[str(threshold)] = float(np.logical_and(fa, fb).sum() / union) if union else 1.0
    return ious


def region_agreement(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """The regions of ``b`` (optimized) matched to those of ``a`` (fp32), both binarized where the
    post-processing does: a region splitting or merging at another threshold changes no box."""
    truth = found = matched = 0
    for ma, mb in zip(_maps(a), _maps(b), strict=True):
        la, lb = _label(ma >= REGION_THRESHOLD), _label(mb >= REGION_THRESHOLD)
        areas_a, areas_b = _region_areas(la), _region_areas(lb)
        truth += int(np.count_nonzero(areas_a))
        found += int(np.count_nonzero(areas_b))
        matched += _matches(la, lb, areas_a, areas_b)
    return {
        "region_hmean": 1.0 if truth == found == 0 else 2.0 * matched / (truth + found),
        "regions_fp32": truth,
        "regions": found,
        "regions_matched": matched,
        "region_threshold": REGION_THRESHOLD,
    }


def _maps(ref: np.ndarray) -> np.ndarray:
    """[N, H, W] from [N, H, W], [N, 1, H, W] or [N, H, W, 1]."""
    if ref.ndim == 4:
        return ref[:, 0] if ref.shape[1] == 1 else ref[..., 0]
    return ref


def _label(foreground: np.ndarray) -> np.ndarray:
    from scipy import ndimage  # here: every CLI command imports the metric names, few judge a map

    labels, _ = ndimage.label(foreground)  # 4-connected, as contours of a binarized map separate them
    return labels


def _region_areas(labels: np.ndarray) -> np.ndarray:
    """Pixels per label (index 0 is the background, kept at 0), with regions too small for
    post-processing to keep set to 0."""
    from scipy import ndimage

    areas = np.bincount(labels.ravel())
    areas[0] = 0
    for index, box in enumerate(ndimage.find_objects(labels), start=1):
        if box is not None and min(s.stop - s.start for s in box) < MIN_REGION_SIDE:
            areas[index] = 0
    return areas


def _matches(la: np.ndarray, lb: np.ndarray, areas_a: np.ndarray, areas_b: np.ndarray) -> int:
    """Pairs of kept regions with IoU > REGION_IOU (each region is in at most one such pair)."""
    both = (la > 0) & (lb > 0)
    if not both.any():
        return 0
    pairs, overlap = np.unique(np.stack([la[both], lb[both]]), axis=1, return_counts=True)
    i, j = pairs
    kept = (areas_a[i] > 0) & (areas_b[j] > 0)
    iou = overlap[kept] / (areas_a[i][kept] + areas_b[j][kept] - overlap[kept])
    return int(np.count_nonzero(iou > REGION_IOU))
