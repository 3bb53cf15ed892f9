"""The built-in metrics (``guard/accuracy.py`` says which fits which output). Each drop is a
fraction of what the metric measures; the guard turns it into percentage points."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from unideploy.errors import InputError
from unideploy.guard.metrics import bins, coords, ctc, detections, maps
from unideploy.guard.metrics.base import Budget, Metric, Output, classes, cosines, probabilities, relative_error


def one_row_decides(record: Mapping[str, Any], outcome: str = "refuses") -> str:
    """Where a metric counting agreeing rows (or positions) refuses for one changed row, worth more
    than the budget alone, the words that say so: fewer rows than the budget can resolve turn any
    single changed prediction into a refusal, which a user reads as the optimization's fault (fp16
    of MobileNetV2 judged on 24 photos: one changed of 24 is 4.17 points against a budget of 1).
    Where more rows changed than the budget allows however many were compared, nothing is added.
    ``outcome``: what that single change does (a refusal; a search "keeps layers in fp32")."""
    compared, budget, drop = record.get("compared"), record.get("budget_points"), record.get("drop_points", 0)
    if not compared or not budget or drop <= budget or 100 / compared <= budget or drop - 100 / compared > budget:
        return ""
    return (
        f"; one of the {compared} compared is {100 / compared:.2f} points, more than the budget, so a single "
        f"change {outcome}: validate on {math.ceil(100 / budget)} or more (--validation) to judge within it"
    )


class LabelledAccuracy(Metric):
    name = "accuracy"
    measures = (
        "labelled top-1 accuracy (needs 'labels'; the first class-score output): fp32's accuracy minus the candidate's"
    )
    needs_labels = True

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        truth = np.asarray(output.labels)[: len(output.reference)].reshape(len(output.reference), -1)
        fp32 = float((classes(output.reference) == truth).all(axis=1).mean())
        got = float((classes(output.candidate) == truth).all(axis=1).mean())
        return fp32 - got, {"accuracy_fp32": fp32, "accuracy": got, "compared": len(truth)}

    def detail(self, record: Mapping[str, Any]) -> str:
        return f"accuracy {record['accuracy_fp32']:.4f} -> {record['accuracy']:.4f}" + one_row_decides(record)


class TopOneAgreement(Metric):
    name = "top1"
    measures = "class scores, and sequences of them: share of rows (positions) whose argmax matches fp32's; integers: equal values"

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        agree = classes(output.reference) == classes(output.candidate)
        return 1.0 - float(agree.mean()), {"compared": int(agree.size)}

    def detail(self, record: Mapping[str, Any]) -> str:
        return f"top-1 agreement {record['top1_agreement']:.4f}" + one_row_decides(record)


class NeighbouringBins(Metric):
    name = "bins"
    measures = (
        "scores over ordered bins (pitch, angle, age): share of rows (positions) whose argmax lies within "
        f"{bins.TOLERANCE} bin of fp32's"
    )

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        if output.reference.ndim < 2 or output.reference.shape[-1] < 2:
            raise InputError(
                f"--metric bins: output '{output.name}' {list(output.reference.shape)} holds no scores over bins",
                "it needs [N, bins] or [N, T, bins] scores; use --metric relerr for other outputs",
            )
        found = bins.agreement(output.reference, output.candidate)
        return 1.0 - found["bins_agreement"], found

    def detail(self, record: Mapping[str, Any]) -> str:
        return (
            f"within {record['bins_tolerance']} bin {record['bins_agreement']:.4f} (top-1 exactly "
            f"{record['top1_agreement']:.4f}; moved {record['bins_moved_most']} bins at most)"
        )


class CharacterErrorRate(Metric):
    name = "text"
    measures = "CTC sequences (an OCR recognizer's): character error rate of the greedy-decoded text against fp32's"

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        blank = ctc.blank_class(output.reference)
        if blank is None:
            raise InputError(
                f"--metric text: output '{output.name}' {list(output.reference.shape)} is not a CTC sequence of "
                "class scores, or decodes to no text on the validation data",
                f"it needs [N, T, C] (or [T, 1, C]) scores with one class, the blank, best at >= "
                f"{ctc.MIN_BLANK_SHARE:.0%} of positions and others too; use --metric top1 for per-position "
                "agreement",
            )
        found = ctc.error_rate(output.reference_batches, output.candidate_batches, blank)
        return found["character_error_rate"], found

    def detail(self, record: Mapping[str, Any]) -> str:
        return (
            f"character error rate {record['character_error_rate']:.4f} ({record['texts_changed']} of "
            f"{record['texts']} texts read differently; top-1 per position {record['top1_agreement']:.4f})"
        )


class CosineSimilarity(Metric):
    name = "cosine"
    measures = "embeddings: 1 - the mean cosine of each row with fp32's (the worst row is kept)"
    budget: ClassVar[Budget] = "min_cosine"

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        return 1.0 - float(cosines(output.reference, output.candidate).mean()), {}

    def detail(self, record: Mapping[str, Any]) -> str:
        return f"cosine mean {record['cosine_mean']:.5f}, worst row {record['cosine_min']:.5f}"


class DetectionAP(Metric):
    name = "detection"
    measures = "a YOLO-style detector head: AP of the candidate's detections with fp32's as the truth (threshold, NMS)"

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        head = detections.layout(output.reference)
        if head is None:
            raise InputError(
                f"--metric detection: output '{output.name}' {list(output.reference.shape)} is not a detector "
                "head with decoded boxes, or holds no detection on the validation data",
                "it needs [N, 4+classes, anchors] or [N, anchors, 5+classes] with (cx, cy, w, h) boxes and "
                f"scores >= {detections.SCORE_THRESHOLD}; use --metric relerr for other outputs",
            )
        found = detections.agreement(head, output.reference, output.candidate)
        return 1.0 - found["detection_ap"], found

    def detail(self, record: Mapping[str, Any]) -> str:
        return (
            f"AP {record['detection_ap']:.4f} against fp32's, {record['detections_matched']} of "
            f"{record['detections_fp32']} detections kept ({record['detections']} found)"
        )


class DecisionAgreement(Metric):
    name = "decision"
    measures = (
        "a probability per row (a detector's yes or no: voice activity, a wake word): share of rows decided "
        "as fp32 decides them at every threshold, the worst counting"
    )

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        by_threshold = maps.decision_agreement(output.reference, output.candidate, output.decision_thresholds)
        agreement = min(by_threshold.values())
        return 1.0 - agreement, {"decision_agreement_by_threshold": by_threshold, "decision_agreement": agreement}

    def detail(self, record: Mapping[str, Any]) -> str:
        return (
            f"decisions agree on {record['decision_agreement']:.2%} of rows (worst of thresholds "
            f"{', '.join(record['decision_agreement_by_threshold'])})"
        )


class MaskIoU(Metric):
    name = "mask"
    measures = "probability maps of one segment each: IoU of the foreground at every threshold, the worst counting"

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        by_threshold = maps.mask_ious(output.reference, output.candidate)
        iou = min(by_threshold.values())
        return 1.0 - iou, {"mask_iou_by_threshold": by_threshold, "mask_iou": iou}

    def detail(self, record: Mapping[str, Any]) -> str:
        return f"mask IoU {record['mask_iou']:.4f} (worst of thresholds {', '.join(record['mask_iou_by_threshold'])})"


class RegionHmean(MaskIoU):
    name = "regions"
    measures = (
        "probability maps of several regions (text lines, cells): ICDAR's hmean of the regions matched one to one"
    )

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        _, found = super().score(output)
        found.update(maps.region_agreement(output.reference, output.candidate))
        return 1.0 - found["region_hmean"], found

    def detail(self, record: Mapping[str, Any]) -> str:
        return (
            f"hmean {record['region_hmean']:.4f}: {record['regions_matched']} of {record['regions_fp32']} regions "
            f"kept ({record['regions']} found at {record['region_threshold']}), pixel IoU {record['mask_iou']:.4f}"
        )


class CoordinateError(Metric):
    name = "coords"
    measures = (
        "coordinates per window beside class probabilities (MTCNN): mean error in % of the window where fp32 detects"
    )

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        values = output.reference
        windows = next(
            (
                other
                for name, other in output.all_references.items()
                if name != output.name and probabilities(other) and coords.in_window_units(values, other)
            ),
            None,
        )
        if windows is None:
            raise InputError(
                f"--metric coords: output '{output.name}' {list(values.shape)} has no class probabilities beside it "
                "with one row per window, or its values are not coordinates in units of the window, or no window "
                "is classed as an object on the validation data",
                f"it needs another output of the same leading shape with probabilities over classes (class "
                f"{coords.BACKGROUND} the background) and values within +-{coords.MAX_UNITS:g}; use --metric "
                "relerr for other outputs",
            )
        found = coords.agreement(values, output.candidate, windows)
        return found["coord_error"], found

    def detail(self, record: Mapping[str, Any]) -> str:
        return (
            f"coordinates off by {record['coord_error']:.2%} of the window on average, worst window "
            f"{record['coord_error_worst']:.2%}, at the {record['windows']} of {record['windows_total']} windows "
            "fp32 detects"
        )


class RelativeError(Metric):
    name = "relerr"
    measures = "boxes, heatmaps and other regressions: L2 error relative to the L2 norm of fp32's, over all rows"

    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        return relative_error(output.reference, output.candidate), {}

    def detail(self, record: Mapping[str, Any]) -> str:
        return f"relative error {record['relative_error']:.4g}"
