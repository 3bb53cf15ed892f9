"""The accuracy guard: how far an optimized model's outputs are from the fp32 model's.

Each output is judged by the metric that fits what it holds, chosen from its shape and values
(and overridable per output with ``--metric OUTPUT=NAME``):

- ``accuracy``: labelled top-1 accuracy (needs ``labels``; the first class-score output),
  drop = fp32 accuracy - accuracy;
- ``top1``: class scores or probabilities, and sequences of them as OCR and token models give
  (raw scores ``[N, T, C]`` with more classes than positions, not named like embeddings or
  boxes): share of rows (positions) whose argmax matches fp32's; integer outputs: share of equal
  values;
- ``text``: those sequences when most positions hold one class, CTC's blank (an OCR recognizer's
  output on text): character error rate of the greedy-decoded text against fp32's (``ctc.py``);
- ``cosine``: embeddings (unit-length rows, or names that say so): drop = 1 - mean cosine of each
  row with fp32's, bounded by ``--min-cosine`` (default: 1 - budget/100); the worst row is kept;
- ``detection``: a YOLO-style detector head: average precision of the optimized model's
  detections with fp32's (after threshold and NMS) as the ground truth (``detections.py``);
- ``regions`` and ``mask``: probability maps (a text detector's or a segmenter's ``[N, 1, H, W]``
  in [0, 1], near 0 or 1 almost everywhere, unlike an image): maps that hold several separate
  regions each (text lines, words, cells) by the regions matched one to one (ICDAR's hmean at
  IoU 0.5 of the regions a DB detector's post-processing finds at its threshold, 0.3), the others
  (one segment per image) by the IoU of the foreground each model marks at every threshold in
  ``maps.THRESHOLDS``, the worst one counting (``maps.py``);
- ``coords``: coordinates per candidate window beside class probabilities whose class 0 is the
  background (MTCNN's box offsets and landmarks, in units of the window): mean absolute error in %
  of the window at the windows fp32 classes as objects (``coords.py``);
- ``relerr``: boxes, heatmaps and other regressions: L2 error relative to the L2 norm of the fp32
  outputs, over all validation rows.

Every drop is in percentage points of its metric; an optimization passes when every output's drop
is within its budget (``--max-accuracy-drop``, or ``--min-cosine`` for cosine).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from unideploy.errors import InputError
from unideploy.optimizers import coords, ctc, detections, maps

DEFAULT_BUDGET_POINTS = 1.0  # what a non-exact artifact may lose, in percentage points of its metric
METRICS = ("auto", "accuracy", "top1", "text", "cosine", "detection", "regions", "mask", "coords", "relerr")
_EMBEDDING_NAME = re.compile(r"(?i)embed|pool|sentence|feature|vector|hidden|encod")
_CLASS_NAME = re.compile(r"(?i)logit|prob|score|class|label|softmax")
_REGRESSION_NAME = re.compile(r"(?i)box|coord|landmark|offset|delta|regress|depth|flow|point")


def output_metric(name: str, ref: np.ndarray) -> tuple[str, str]:
    """The metric for one output, from its shape and its fp32 values, and why."""
    if not np.issubdtype(ref.dtype, np.floating):
        return "top1", "integer values (labels or ids): share of equal values"
    values = ref.astype(np.float64)
    if _probabilities(ref):
        if (text := _ctc(ref)) is not None:
            return text
        what = "rows" if ref.ndim == 2 else "positions"
        return "top1", f"{what} are probabilities over {ref.shape[-1]} classes: top-1 agreement"
    if ref.ndim == 2 and ref.shape[-1] >= 2:
        if np.allclose(np.linalg.norm(values, axis=-1), 1.0, atol=1e-3):
            return "cosine", f"rows are unit-length {ref.shape[-1]}-d embeddings: cosine similarity"
        if _EMBEDDING_NAME.search(name) and not _CLASS_NAME.search(name):
            return "cosine", f"'{name}' names {ref.shape[-1]}-d embeddings: cosine similarity"
        return "top1", f"rows are scores over {ref.shape[-1]} classes: top-1 agreement"
    shaped = detections.shaped_layouts(ref)  # a detector head's layout, with or without a detection
    if (head := detections.layout(ref, shaped)) is not None:
        return (
            "detection",
            f"{head.name} detector head: AP@{detections.MATCH_IOU} of the detections against fp32's "
            f"(score >= {detections.SCORE_THRESHOLD}, NMS)",
        )
    if not shaped and maps.is_probability_map(ref):
        shape, thresholds = "x".join(map(str, ref.shape[1:])), " and ".join(map(str, maps.THRESHOLDS))
        if (regions := maps.mean_regions(ref)) >= maps.MIN_REGIONS_PER_MAP:
            return (
                "regions",
                f"{shape} probability map with {regions:.1f} separate regions per map (text, instances): "
                f"hmean of the regions matched at IoU {maps.REGION_IOU}, binarized at {maps.REGION_THRESHOLD}",
            )
        return "mask", f"{shape} probability map: IoU of the foreground at {thresholds}"
    if (
        ref.ndim == 3
        and ref.shape[-1] > max(ref.shape[1], 1)
        and not shaped
        and not (_EMBEDDING_NAME.search(name) and not _CLASS_NAME.search(name))
        and not _REGRESSION_NAME.search(name)
    ):
        return _ctc(ref) or ("top1", f"positions are scores over {ref.shape[-1]} classes: top-1 agreement per position")
    return (
        "relerr",
        f"{'x'.join(map(str, ref.shape[1:])) or 'scalar'} values per row (boxes, maps, regression): relative error",
    )


def _ctc(ref: np.ndarray) -> tuple[str, str] | None:
    """A sequence of class scores whose positions mostly hold one class (CTC's blank) decodes to text."""
    if (blank := ctc.blank_class(ref)) is None:
        return None
    share = float((ref.argmax(-1) == blank).mean())
    return (
        "text",
        f"CTC scores over {ref.shape[-1]} classes per position (class {blank}, the blank, at {share:.0%} of "
        "them): character error rate of the greedy-decoded text",
    )


def _probabilities(ref: np.ndarray) -> bool:
    values = ref.astype(np.float64)
    return (
        ref.ndim >= 2
        and ref.shape[-1] >= 2
        and np.issubdtype(ref.dtype, np.floating)
        and bool((values >= -1e-6).all())
        and bool(np.allclose(values.sum(-1), 1.0, atol=1e-3))
    )


def choose_metrics(
    requested: str | Sequence[str], reference: Mapping[str, np.ndarray], has_labels: bool
) -> dict[str, tuple[str, str]]:
    """(metric, why) per output: ``auto`` chooses; ``NAME`` applies to every output, ``OUTPUT=NAME``
    to one. ``accuracy`` (chosen by auto when there are labels) goes to the first class-score output."""
    items = [requested] if isinstance(requested, str) else list(requested) or ["auto"]
    default, per_output = "auto", {}
    for item in items:
        output, _, metric = item.rpartition("=")
        if metric not in METRICS:
            raise InputError(f"unknown metric '{metric}'", f"use one of: {', '.join(METRICS)}")
        if output and output not in reference:
            raise InputError(
                f"--metric names output '{output}', which the model does not produce",
                f"its outputs are: {', '.join(reference)}",
            )
        if output:
            per_output[output] = metric
        else:
            default = metric
    if "accuracy" in (default, *per_output.values()) and not has_labels:
        raise InputError(
            "--metric accuracy needs labels", "add a 'labels' array to the data, or use --metric top1/cosine"
        )
    chosen: dict[str, tuple[str, str]] = {}
    auto = [name for name in reference if per_output.get(name, default) == "auto"]
    for name, ref in reference.items():
        chosen[name] = output_metric(name, ref) if name in auto else (per_output.get(name, default), "as requested")
    # A detector head gives class probabilities and, beside them, raw boxes or landmarks: those
    # are coordinates or regressions, whatever their width (MTCNN: probabilities, 4 box offsets,
    # 10 landmarks, per window).
    classes = next((n for n in auto if _probabilities(reference[n])), None)
    for name in auto:
        ref = reference[name]
        if (
            not classes
            or name == classes
            or chosen[name][0] not in ("top1", "relerr")
            or _probabilities(ref)
            or not np.issubdtype(ref.dtype, np.floating)
        ):
            continue
        if coords.in_window_units(ref, reference[classes]):
            windows = int(coords.detected(reference[classes]).sum())
            chosen[name] = (
                "coords",
                f"{ref.shape[-1]} coordinates per window beside the class probabilities of '{classes}' (box "
                f"offsets, landmarks, in units of the window): mean error in % of the window, at the {windows} "
                "windows fp32 classes as objects",
            )
        elif chosen[name][0] == "top1":
            chosen[name] = (
                "relerr",
                f"raw values beside the class probabilities of '{classes}' (boxes, landmarks, "
                "regression): relative error",
            )
    if has_labels and default == "auto" and "accuracy" not in per_output.values():
        first = next((n for n, (m, _) in chosen.items() if m == "top1" and n not in per_output), None)
        if first is not None:
            chosen[first] = ("accuracy", f"labelled data: top-1 accuracy against the labels ({chosen[first][1]})")
    return chosen


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1).astype(np.float64) if a.ndim > 1 else a.reshape(-1, 1).astype(np.float64)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = _rows(a), _rows(b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = (a * b).sum(axis=1)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), (np.abs(a - b).max(axis=1) == 0).astype(float))


def _relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """L2 error over all rows relative to the L2 norm of the fp32 outputs: rows that are nearly
    zero (a text detector's heatmap of a photo without text) cannot blow it up, as a per-row ratio
    would."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(a)), 1e-12))


def _classes(a: np.ndarray) -> np.ndarray:
    if not np.issubdtype(a.dtype, np.floating):
        return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    return np.argmax(a, axis=-1).reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(-1, 1)


def compare(
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
    labels: np.ndarray | None,
    metric: str | Sequence[str],
    budget_points: float,
    min_cosine: float | None = None,
) -> dict[str, Any]:
    """Every output of ``candidate`` against ``reference``, by its metric, and the verdict."""
    names = list(reference[0])
    ref = {n: np.concatenate([b[n] for b in reference]) for n in names}
    cand = {n: np.concatenate([b[n] for b in candidate]) for n in names}
    chosen = choose_metrics(metric, ref, labels is not None)
    cosine_budget = budget_points if min_cosine is None else round((1.0 - min_cosine) * 100.0, 6)
    rows = int(ref[names[0]].shape[0])
    truth = np.asarray(labels)[:rows].reshape(rows, -1) if labels is not None else None
    outputs: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {"rows": rows, "outputs": outputs}
    for n in names:
        kind, why = chosen[n]
        r, c = ref[n], cand[n]
        cos = _cosine(r, c)
        agreement = float((_classes(r) == _classes(c)).mean())
        entry: dict[str, Any] = {
            "metric": kind,
            "why": why,
            "max_abs_error": float(np.abs(r.astype(np.float64) - c).max()),
            "cosine_mean": float(cos.mean()),
            "cosine_min": float(cos.min()),
            "relative_error": _relative_error(r, c),
            "top1_agreement": agreement,
        }
        if kind == "accuracy":
            entry["accuracy_fp32"] = float((_classes(r) == truth).all(axis=1).mean())
            entry["accuracy"] = float((_classes(c) == truth).all(axis=1).mean())
            result.update(accuracy_fp32=entry["accuracy_fp32"], accuracy=entry["accuracy"])
            drop = entry["accuracy_fp32"] - entry["accuracy"]
        elif kind == "top1":
            drop = 1.0 - agreement
        elif kind == "text":
            entry.update(ctc.error_rate([b[n] for b in reference], [b[n] for b in candidate], _blank(n, r)))
            drop = entry["character_error_rate"]
        elif kind == "cosine":
            drop = 1.0 - entry["cosine_mean"]
        elif kind == "detection":
            entry.update(detections.agreement(_head(n, r), r, c))
            drop = 1.0 - entry["detection_ap"]
        elif kind in ("mask", "regions"):
            entry["mask_iou_by_threshold"] = maps.mask_ious(r, c)
            entry["mask_iou"] = min(entry["mask_iou_by_threshold"].values())
            if kind == "regions":
                entry.update(maps.region_agreement(r, c))
            drop = 1.0 - entry["region_hmean" if kind == "regions" else "mask_iou"]
        elif kind == "coords":
            entry.update(coords.agreement(r, c, _window_classes(n, ref)))
            drop = entry["coord_error"]
        else:
            drop = entry["relative_error"]
        entry["drop_points"] = round(max(drop, 0.0) * 100.0, 4)
        entry["budget_points"] = cosine_budget if kind == "cosine" else budget_points
        entry["within_budget"] = entry["drop_points"] <= entry["budget_points"]
        outputs[n] = entry
    worst = max(outputs, key=lambda n: outputs[n]["drop_points"] - outputs[n]["budget_points"])
    result.update(
        metric=outputs[worst]["metric"],
        deciding_output=worst,
        top1_agreement=outputs[names[0]]["top1_agreement"],
        drop_points=outputs[worst]["drop_points"],
        budget_points=outputs[worst]["budget_points"],
        within_budget=all(o["within_budget"] for o in outputs.values()),
    )
    return result


def _head(name: str, ref: np.ndarray) -> detections.Layout:
    head = detections.layout(ref)
    if head is None:
        raise InputError(
            f"--metric detection: output '{name}' {list(ref.shape)} is not a detector head with decoded "
            "boxes, or holds no detection on the validation data",
            "it needs [N, 4+classes, anchors] or [N, anchors, 5+classes] with (cx, cy, w, h) boxes and "
            f"scores >= {detections.SCORE_THRESHOLD}; use --metric relerr for other outputs",
        )
    return head


def _window_classes(name: str, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The class probabilities whose windows output ``name`` holds coordinates of."""
    values = outputs[name]
    for other, classes in outputs.items():
        if other != name and _probabilities(classes) and coords.in_window_units(values, classes):
            return classes
    raise InputError(
        f"--metric coords: output '{name}' {list(values.shape)} has no class probabilities beside it with one "
        "row per window, or its values are not coordinates in units of the window, or no window is classed "
        "as an object on the validation data",
        f"it needs another output of the same leading shape with probabilities over classes (class "
        f"{coords.BACKGROUND} the background) and values within +-{coords.MAX_UNITS:g}; use --metric relerr "
        "for other outputs",
    )


def detail(o: dict[str, Any]) -> str:
    """What one output's metric measured, in words (messages and the CLI's table)."""
    metric = o["metric"]
    if metric == "accuracy":
        return f"accuracy {o['accuracy_fp32']:.4f} -> {o['accuracy']:.4f}"
    if metric == "cosine":
        return f"cosine mean {o['cosine_mean']:.5f}, worst row {o['cosine_min']:.5f}"
    if metric == "top1":
        return f"top-1 agreement {o['top1_agreement']:.4f}"
    if metric == "text":
        return (
            f"character error rate {o['character_error_rate']:.4f} ({o['texts_changed']} of {o['texts']} texts "
            f"read differently; top-1 per position {o['top1_agreement']:.4f})"
        )
    if metric == "detection":
        return (
            f"AP {o['detection_ap']:.4f} against fp32's, {o['detections_matched']} of "
            f"{o['detections_fp32']} detections kept ({o['detections']} found)"
        )
    if metric == "regions":
        return (
            f"hmean {o['region_hmean']:.4f}: {o['regions_matched']} of {o['regions_fp32']} regions kept "
            f"({o['regions']} found at {o['region_threshold']}), pixel IoU {o['mask_iou']:.4f}"
        )
    if metric == "mask":
        return f"mask IoU {o['mask_iou']:.4f} (worst of thresholds {', '.join(o['mask_iou_by_threshold'])})"
    if metric == "coords":
        return (
            f"coordinates off by {o['coord_error']:.2%} of the window on average, worst window "
            f"{o['coord_error_worst']:.2%}, at the {o['windows']} of {o['windows_total']} windows fp32 detects"
        )
    return f"relative error {o['relative_error']:.4g}"


def _blank(name: str, ref: np.ndarray) -> int:
    blank = ctc.blank_class(ref)
    if blank is None:
        raise InputError(
            f"--metric text: output '{name}' {list(ref.shape)} is not a CTC sequence of class scores, or "
            "decodes to no text on the validation data",
            f"it needs [N, T, C] (or [T, 1, C]) scores with one class, the blank, best at >= "
            f"{ctc.MIN_BLANK_SHARE:.0%} of positions and others too; use --metric top1 for per-position agreement",
        )
    return blank


def describe(accuracy: dict[str, Any]) -> str:
    """One line of numbers for messages: each output's metric, drop and budget."""
    return "; ".join(
        f"{name}: {o['metric']} drop {o['drop_points']:.2f} points (budget {o['budget_points']:g}), {detail(o)}"
        for name, o in accuracy["outputs"].items()
    )
