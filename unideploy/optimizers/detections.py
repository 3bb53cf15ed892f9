"""The ``detection`` metric: do an optimized detector's top detections agree with fp32's?

A detector's raw head holds thousands of candidate boxes, nearly all of them background; the
relative error over all of them says little about what a user sees after thresholding and
non-maximum suppression. This metric does what the application does to both models' outputs
(score threshold, class-aware NMS, at most ``MAX_DETECTIONS`` per image) and counts the fp32
detections the optimized model reproduces: same class, IoU >= ``MATCH_IOU``.

Layouts recognised, boxes already decoded to (cx, cy, w, h) in pixels:

- YOLOv8 / Ultralytics export: ``[N, 4 + C, anchors]``, class scores in [0, 1], no objectness;
- YOLOv5-style: ``[N, anchors, 5 + C]``, objectness then class scores, each in [0, 1].

Heads that leave boxes as grid offsets (YOLOX exported without its decoder) are not recognised
and stay with the relative error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCORE_THRESHOLD = 0.25  # Ultralytics' and YOLOv5's default confidence
NMS_IOU = 0.45
MATCH_IOU = 0.5
MAX_DETECTIONS = 100
MIN_ANCHORS = 100  # a head has many more candidate boxes than attributes per box


@dataclass(frozen=True)
class Layout:
    anchors_last: bool  # [N, 4 + C, anchors] (YOLOv8) rather than [N, anchors, 5 + C] (YOLOv5)

    @property
    def name(self) -> str:
        return "YOLOv8-style [N, 4+classes, anchors]" if self.anchors_last else "YOLOv5-style [N, anchors, 5+classes]"

    def boxes_scores(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(boxes [A, 4] as x1 y1 x2 y2, class scores [A, C]) of one image's head."""
        attrs = row.T if self.anchors_last else row
        attrs = attrs.astype(np.float64)
        cx, cy, w, h = attrs[:, 0], attrs[:, 1], attrs[:, 2], attrs[:, 3]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        scores = attrs[:, 4:] if self.anchors_last else attrs[:, 4:5] * (attrs[:, 5:] if attrs.shape[1] > 5 else 1.0)
        return boxes, scores


def layout(ref: np.ndarray) -> Layout | None:
    """The head layout of fp32 outputs ``ref``, or None where they do not look like decoded
    detections (or hold no detection above the threshold to compare)."""
    if ref.ndim != 3 or not np.issubdtype(ref.dtype, np.floating) or not np.isfinite(ref).all():
        return None
    for candidate in (Layout(anchors_last=True), Layout(anchors_last=False)):
        attrs = np.moveaxis(ref, 1, 2) if candidate.anchors_last else ref
        anchors, width = attrs.shape[1], attrs.shape[2]
        if width < 5 or anchors < max(MIN_ANCHORS, 8 * width):
            continue
        boxes, scores = attrs[..., :4], attrs[..., 4:]
        if (boxes < -1e-3).any() or (scores < -1e-6).any() or (scores > 1 + 1e-6).any():
            continue
        if any(len(detect(candidate, row)[0]) for row in ref):
            return candidate
    return None


def detect(layout_: Layout, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One image's detections after the threshold and class-aware NMS: (boxes [K, 4], classes [K])."""
    boxes, scores = layout_.boxes_scores(row)
    classes, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best >= SCORE_THRESHOLD)
    keep = keep[np.argsort(-best[keep], kind="stable")]
    chosen: list[int] = []
    for i in keep:
        same = [j for j in chosen if classes[j] == classes[i]]
        if not same or iou(boxes[i], boxes[same]).max() <= NMS_IOU:
            chosen.append(int(i))
            if len(chosen) == MAX_DETECTIONS:
                break
    return boxes[chosen], classes[chosen]


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one x1y1x2y2 box with each of ``others``."""
    width = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = width * height
    return inter / np.maximum(_area(box) + _area(others) - inter, 1e-12)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[..., 2] - boxes[..., 0], 0, None) * np.clip(boxes[..., 3] - boxes[..., 1], 0, None)


def agreement(layout_: Layout, reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Detections matched (same class, IoU >= ``MATCH_IOU``, each used once) over the larger of the
    two models' counts, summed over images: a missed and an extra detection both count against."""
    matched = larger = found_ref = found_cand = 0
    for ref_row, cand_row in zip(reference, candidate):
        ref_boxes, ref_classes = detect(layout_, ref_row)
        cand_boxes, cand_classes = detect(layout_, cand_row)
        free = np.ones(len(cand_boxes), bool)
        for box, cls in zip(ref_boxes, ref_classes):
            options = np.flatnonzero(free & (cand_classes == cls))
            if len(options):
                overlaps = iou(box, cand_boxes[options])
                if overlaps.max() >= MATCH_IOU:
                    free[options[overlaps.argmax()]] = False
                    matched += 1
        larger += max(len(ref_boxes), len(cand_boxes))
        found_ref, found_cand = found_ref + len(ref_boxes), found_cand + len(cand_boxes)
    return {
        "detection_agreement": matched / larger if larger else 1.0,
        "detections_fp32": found_ref,
        "detections": found_cand,
        "detections_matched": matched,
    }
