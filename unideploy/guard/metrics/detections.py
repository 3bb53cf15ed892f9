"""The ``detection`` metric: do an optimized detector's top detections agree with fp32's?

A detector's raw head holds thousands of candidate boxes, nearly all of them background; the
relative error over all of them says little about what a user sees after thresholding and
non-maximum suppression. This metric does what the application does to both models' outputs
(score threshold, class-aware NMS, at most ``MAX_DETECTIONS`` per image) and measures the
optimized model's average precision (IoU >= ``MATCH_IOU``, same class) with fp32's detections as
the ground truth: the mAP@0.5 a user would measure, against fp32 instead of labels.

Layouts recognised:

- YOLOv8 / Ultralytics export: ``[N, 4 + C, anchors]``, boxes decoded to (cx, cy, w, h) pixels,
  class scores in [0, 1], no objectness;
- YOLOv5-style: ``[N, anchors, 5 + C]``, decoded boxes, objectness then class scores in [0, 1];
- YOLOX as its ONNX export leaves it (``decode_in_inference=False``): ``[N, anchors, 5 + C]``
  with boxes as grid offsets and log sizes, decoded here as YOLOX's own post-processing does.
  The grids are found from the anchor count, so the input must be square (strides 8/16/32, or
  8/16/32/64 for P6 models): ``anchors = 21 n^2`` or ``85 n^2``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

SCORE_THRESHOLD = 0.25  # Ultralytics' and YOLOv5's default confidence: fp32's detections, the truth
EVAL_SCORE_THRESHOLD = 0.001  # COCO's and Ultralytics' evaluations rank detections down to this score
NMS_IOU = 0.45
MATCH_IOU = 0.5
MAX_DETECTIONS = 100
MIN_ANCHORS = 100  # a head has many more candidate boxes than attributes per box
YOLOX_STRIDES = ((8, 16, 32), (8, 16, 32, 64))
MAX_LOG_SIZE = 10.0  # a YOLOX box's log width/height: beyond it, exp() means the values are not sizes


@dataclass(frozen=True)
class Layout:
    anchors_last: bool  # [N, 4 + C, anchors] (YOLOv8) rather than [N, anchors, 5 + C] (YOLOv5, YOLOX)
    strides: tuple[int, ...] = ()  # YOLOX: boxes are grid offsets at these strides, to decode

    @property
    def name(self) -> str:
        if self.strides:
            return f"YOLOX-style [N, anchors, 5+classes], grid offsets at strides {'/'.join(map(str, self.strides))}"
        return "YOLOv8-style [N, 4+classes, anchors]" if self.anchors_last else "YOLOv5-style [N, anchors, 5+classes]"

    def boxes_scores(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(boxes [A, 4] as x1 y1 x2 y2, class scores [A, C]) of one image's head."""
        attrs = row.T if self.anchors_last else row
        attrs = attrs.astype(np.float64)
        if self.strides:
            grid, stride = _grid(len(attrs), self.strides)
            attrs = attrs.copy()
            attrs[:, :2] = (attrs[:, :2] + grid) * stride[:, None]
            attrs[:, 2:4] = np.exp(np.clip(attrs[:, 2:4], None, MAX_LOG_SIZE)) * stride[:, None]
        cx, cy, w, h = attrs[:, 0], attrs[:, 1], attrs[:, 2], attrs[:, 3]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        scores = attrs[:, 4:] if self.anchors_last else attrs[:, 4:5] * (attrs[:, 5:] if attrs.shape[1] > 5 else 1.0)
        return boxes, scores


def shaped_layouts(ref: np.ndarray) -> list[Layout]:
    """The layouts whose geometry and value ranges ``ref`` fits (many candidate boxes of a few
    attributes, decoded boxes non-negative or YOLOX's log sizes bounded, scores in [0, 1]),
    whether or not it holds a detection."""
    if ref.ndim != 3 or not np.issubdtype(ref.dtype, np.floating) or not np.isfinite(ref).all():
        return []
    fitting = []
    yolox = [Layout(False, strides) for strides in YOLOX_STRIDES if _square_grids(ref.shape[1], strides)]
    for candidate in (Layout(anchors_last=True), Layout(anchors_last=False), *yolox):
        attrs = np.moveaxis(ref, 1, 2) if candidate.anchors_last else ref
        anchors, width = attrs.shape[1], attrs.shape[2]
        if width < 5 or anchors < max(MIN_ANCHORS, 8 * width):
            continue
        boxes, scores = attrs[..., :4], attrs[..., 4:]
        if (scores < -1e-6).any() or (scores > 1 + 1e-6).any():
            continue
        if (np.abs(boxes[..., 2:]).max() <= MAX_LOG_SIZE) if candidate.strides else not (boxes < -1e-3).any():
            fitting.append(candidate)
    return fitting


@functools.cache
def _square_grids(anchors: int, strides: tuple[int, ...]) -> int:
    """The side in cells of the coarsest grid when ``anchors`` are the cells of square grids at
    ``strides`` (each twice the last), else 0."""
    cells = sum(4**i for i in range(len(strides)))  # per cell of the coarsest grid
    side = round((anchors / cells) ** 0.5)
    return side if side and side * side * cells == anchors else 0


@functools.cache
def _grid(anchors: int, strides: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Each anchor's (x, y) cell and its stride, finest grid first (YOLOX's order); made once per
    head geometry, as every image's rows decode on the same grids (callers never write to it)."""
    side = _square_grids(anchors, strides) * 2 ** (len(strides) - 1)
    cells, stride = [], []
    for i, s in enumerate(strides):
        n = side // 2**i
        ys, xs = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        stride.append(np.full(n * n, s))
    return np.concatenate(cells).astype(np.float64), np.concatenate(stride).astype(np.float64)


def layout(ref: np.ndarray, shaped: list[Layout] | None = None) -> Layout | None:
    """The head layout of fp32 outputs ``ref``, or None where they do not look like detections
    (or hold no detection above the threshold to compare); ``shaped``: its ``shaped_layouts``,
    where the caller has them."""
    candidates = shaped_layouts(ref) if shaped is None else shaped
    return next((c for c in candidates if any(len(detect(c, row)[0]) for row in ref)), None)


def detect(
    layout_: Layout, row: np.ndarray, threshold: float = SCORE_THRESHOLD
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image's detections after the score threshold and class-aware NMS, best first:
    (boxes [K, 4], classes [K], scores [K])."""
    boxes, scores = layout_.boxes_scores(row)
    classes, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best >= threshold)
    keep = keep[np.argsort(-best[keep], kind="stable")]
    chosen: list[int] = []
    for i in keep:
        same = [j for j in chosen if classes[j] == classes[i]]
        if not same or iou(boxes[i], boxes[same]).max() <= NMS_IOU:
            chosen.append(int(i))
            if len(chosen) == MAX_DETECTIONS:
                break
    return boxes[chosen], classes[chosen], best[chosen]


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one x1y1x2y2 box with each of ``others``."""
    width = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = width * height
    return inter / np.maximum(_area(box) + _area(others) - inter, 1e-12)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[..., 2] - boxes[..., 0], 0, None) * np.clip(boxes[..., 3] - boxes[..., 1], 0, None)


def agreement(layout_: Layout, reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Average precision of the optimized model's detections with fp32's as the ground truth.

    fp32's detections at ``SCORE_THRESHOLD`` are the truth; the optimized model's are ranked by
    score down to ``EVAL_SCORE_THRESHOLD``, as COCO's and Ultralytics' evaluations keep them, and
    each is matched, best first within its image, to an unmatched truth of its class with IoU >=
    ``MATCH_IOU``. AP is the area under that ranking's precision-recall curve (every point, with
    precision made non-increasing): a confident detection missed or invented costs much, one whose
    score moved across the threshold costs little, as it does to the mAP a user measures. The
    counts at the threshold are kept for the message."""
    ranked: list[tuple[float, bool]] = []
    truths = matched = found = 0
    for ref_row, cand_row in zip(reference, candidate):
        truth_boxes, truth_classes, _ = detect(layout_, ref_row)
        boxes, classes, scores = detect(layout_, cand_row, EVAL_SCORE_THRESHOLD)
        truths += len(truth_boxes)
        free = np.ones(len(truth_boxes), bool)
        for box, cls, score in zip(boxes, classes, scores):
            options = np.flatnonzero(free & (truth_classes == cls))
            hit = False
            if len(options):
                overlaps = iou(box, truth_boxes[options])
                if overlaps.max() >= MATCH_IOU:
                    free[options[overlaps.argmax()]] = False
                    hit = True
            ranked.append((float(score), hit))
            if score >= SCORE_THRESHOLD:
                found, matched = found + 1, matched + hit
    return {
        "detection_ap": _average_precision(ranked, truths),
        "detections_fp32": truths,
        "detections": found,
        "detections_matched": matched,
    }


def _average_precision(ranked: list[tuple[float, bool]], truths: int) -> float:
    if not truths:
        return 1.0 if not any(score >= SCORE_THRESHOLD for score, _ in ranked) else 0.0
    hits = np.array([hit for _, hit in sorted(ranked, key=lambda r: -r[0])], bool)
    if not len(hits):
        return 0.0
    true_positives = np.cumsum(hits)
    precision = true_positives / np.arange(1, len(hits) + 1)
    recall = true_positives / truths
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.diff(np.concatenate([[0.0], recall]))
    return float((steps * envelope).sum())
