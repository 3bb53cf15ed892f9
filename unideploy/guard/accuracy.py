"""How far a candidate model's outputs are from the fp32 model's, each output by its metric.

Each output is judged by the metric that fits what it holds, chosen here from its shape and values
(and overridable per output with ``--metric OUTPUT=NAME``); the metrics themselves are plug-ins
(``guard/metrics/``):

- ``accuracy``: labelled top-1 accuracy (needs ``labels``; the first class-score output),
  drop = fp32 accuracy - accuracy;
- ``top1``: class scores or probabilities, and sequences of them as OCR and token models give
  (raw scores ``[N, T, C]`` with more classes than positions, not named like embeddings or
  boxes): share of rows (positions) whose argmax matches fp32's; integer outputs: share of equal
  values;
- ``bins``: scores over ordered bins, smooth from one bin to the next (a pitch tracker's, an
  angle's or an age's distribution): share of rows (positions) whose argmax lies within one bin of
  fp32's (``bins.py``);
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
- ``decision``: one probability per row, nearly all of them near 0 or 1 (a voice-activity
  detector's speech, a wake word's): share of rows both models decide alike at every threshold the
  application decides at (``--decision-threshold``; by default 0.3 and 0.5), the worst counting (a
  row a few hundredths off stays decided as it was; its relative error, over probabilities near 0,
  would not);
- ``coords``: coordinates per candidate window beside class probabilities whose class 0 is the
  background (MTCNN's box offsets and landmarks, in units of the window): mean absolute error in %
  of the window at the windows fp32 classes as objects (``coords.py``);
- ``relerr``: boxes, heatmaps and other regressions (rows of many values none of which stands out
  as a class's winner does: landmarks' coordinates): L2 error relative to the L2 norm of the fp32
  outputs, over all validation rows.

Every drop is in percentage points of its metric; an optimization passes when every output's drop
is within its budget (``--max-accuracy-drop``, or ``--min-cosine`` for cosine).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any, cast

import numpy as np

from unideploy.errors import ExportError, InputError
from unideploy.guard.metrics import METRICS, bins, coords, ctc, detections, maps
from unideploy.guard.metrics.base import BUDGET_OPTIONS, Budget, Output, classes, cosines, probabilities, relative_error
from unideploy.package.manifest import AccuracyRecord, OutputAccuracy
from unideploy.samples import join_rows

DEFAULT_BUDGET_POINTS = 1.0  # what a non-exact artifact may lose, in percentage points of its metric
DEFAULT_DECISION_THRESHOLDS = maps.THRESHOLDS  # a yes or a no: at its midpoint, and at a cautious 0.3
_EMBEDDING_NAME = re.compile(r"(?i)embed|pool|sentence|feature|vector|hidden|encod")
_CLASS_NAME = re.compile(r"(?i)logit|prob|score|class|label|softmax")
_REGRESSION_NAME = re.compile(r"(?i)box|coord|landmark|offset|delta|regress|depth|flow|point")
# Rows this wide are read as class scores only where their winner stands out of the row; narrower
# ones (2 to 31 classes) have too few values for the largest's distance to say anything.
WINNER_MIN_CLASSES = 32
WINNER_MARGIN = 1.0  # standard deviations above where the largest of as many random values lies


def output_metric(
    name: str, ref: np.ndarray, decision_thresholds: Sequence[float] = DEFAULT_DECISION_THRESHOLDS
) -> tuple[str, str]:
    """The metric for one output, from its shape and its fp32 values, and why."""
    if ref.dtype.kind in "OSU":
        return "top1", "text values (class names): share of equal values"
    if not np.issubdtype(ref.dtype, np.floating):
        return "top1", "integer values (labels or ids): share of equal values"
    values = ref.astype(np.float64)
    if probabilities(ref):
        if (text := _ctc(ref)) is not None:
            return text
        what = "rows" if ref.ndim == 2 else "positions"
        return _bins(ref, what) or ("top1", f"{what} are probabilities over {ref.shape[-1]} classes: top-1 agreement")
    if ref.ndim == 2 and ref.shape[-1] >= 2:
        if np.allclose(np.linalg.norm(values, axis=-1), 1.0, atol=1e-3):
            return "cosine", f"rows are unit-length {ref.shape[-1]}-d embeddings: cosine similarity"
        if _EMBEDDING_NAME.search(name) and not _CLASS_NAME.search(name):
            return "cosine", f"'{name}' names {ref.shape[-1]}-d embeddings: cosine similarity"
        if _REGRESSION_NAME.search(name) and not _CLASS_NAME.search(name):
            # a box's 4 numbers or 21 landmarks' coordinates are not scores over 4 or 63 classes
            return (
                "relerr",
                f"'{name}' names {ref.shape[-1]} regressed values per row (boxes, landmarks): relative error",
            )
        if (ordinal := _bins(ref, "rows")) is not None:
            return ordinal
        if ref.shape[-1] >= WINNER_MIN_CLASSES and not _CLASS_NAME.search(name):
            winner, chance = winner_distance(ref)
            if winner < chance + WINNER_MARGIN:
                # BlazePose's 195 landmark values read as 195 classes lost 81 points of "top-1" to INT8
                return (
                    "relerr",
                    f"no value of the {ref.shape[-1]} per row stands out as a class's winner does (the largest "
                    f"{winner:.1f} standard deviations above the row's mean; {chance:.1f} for the largest of "
                    f"{ref.shape[-1]} random values): regressed values (landmarks, coordinates), relative error",
                )
        return "top1", f"rows are scores over {ref.shape[-1]} classes: top-1 agreement"
    if ref.ndim and ref.size == ref.shape[0] and maps.decided(ref) and not _REGRESSION_NAME.search(name):
        thresholds = " and ".join(f"{t:g}" for t in decision_thresholds)
        return (
            "decision",
            f"one probability per row, nearly all near 0 or 1 (a yes or a no: voice activity, a wake word): "
            f"share of rows decided alike at {thresholds}",
        )
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
        return (
            _ctc(ref)
            or _bins(ref, "positions")
            or ("top1", f"positions are scores over {ref.shape[-1]} classes: top-1 agreement per position")
        )
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


def _bins(ref: np.ndarray, what: str) -> tuple[str, str] | None:
    """Scores that rise and fall smoothly along their last axis are over ordered bins (pitch), where
    the best bin moving by one is a small error, not another class."""
    if (correlation := bins.ordinal(ref)) is None:
        return None
    return (
        "bins",
        f"{what} are scores over {ref.shape[-1]} ordered bins (each score correlates {correlation:.2f} with "
        f"the next): top-1 within {bins.TOLERANCE} bin",
    )


def winner_distance(ref: np.ndarray) -> tuple[float, float]:
    """How far the median row's largest value lies above the row's mean, in the row's standard
    deviations, and where the largest of as many independent normal values lies (Blom's estimate of
    the expected maximum). A classifier's winning class stands well above chance (EfficientNet's
    ImageNet logits: 5.9 against 3.2); regressed coordinates, bounded and spread evenly, do not
    (BlazePose's landmarks: 2.2 against 2.7, their world coordinates 2.6 against 2.5)."""
    count = ref.shape[-1]
    values = ref.reshape(-1, count).astype(np.float64)
    spread = values.std(-1)
    varied = spread > 0
    chance = NormalDist().inv_cdf((count - 0.375) / (count + 0.25))
    if not varied.any():
        return 0.0, chance
    return float(np.median((values.max(-1) - values.mean(-1))[varied] / spread[varied])), chance


def channels_first(reference: Mapping[str, np.ndarray]) -> set[str]:
    """Outputs laid out channels-first (NCHW, as PyTorch and MindSpore models answer): a map of
    class probabilities over axis 1 (a face detector's face/not-face per position), and the outputs
    beside it with the same rows and positions (its box offsets). Their metrics read them with the
    channels last, as they read a Keras model's; judged along the last axis, MTCNN's P-Net from
    MindIR fell back to relative error where the same network from Keras is judged per face."""
    maps = {
        name
        for name, ref in reference.items()
        if ref.ndim >= 3 and ref.shape[1] >= 2 and not probabilities(ref) and probabilities(np.moveaxis(ref, 1, -1))
    }
    places = {(reference[m].shape[0], *reference[m].shape[2:]) for m in maps}
    return maps | {
        name for name, ref in reference.items() if ref.ndim >= 3 and (ref.shape[0], *ref.shape[2:]) in places
    }


def channels_last(arrays: Mapping[str, np.ndarray], names: set[str]) -> dict[str, np.ndarray]:
    """``arrays`` with axis 1 of ``names`` moved last (``channels_first``'s view)."""
    return {n: np.moveaxis(a, 1, -1) if n in names else a for n, a in arrays.items()}


def choose_metrics(
    requested: str | Sequence[str],
    reference: Mapping[str, np.ndarray],
    has_labels: bool,
    rows: int | None = None,
    output_axes: Mapping[str, int | None] | None = None,
    decision_thresholds: Sequence[float] = DEFAULT_DECISION_THRESHOLDS,
) -> dict[str, tuple[str, str]]:
    """(metric, why) per output: ``auto`` chooses; ``NAME`` applies to every output, ``OUTPUT=NAME``
    to one. ``accuracy`` (chosen by auto when there are labels) goes to the first class-score output.
    ``rows``: how many rows the reference was computed on; an output whose axis 0 is not that many
    (recurrent state ``[layers, batch, hidden]``) holds no rows or positions to score one by one, and is
    judged by its relative error (read as per-position class scores, a state was taken for text).
    ``output_axes``: where each output's rows lie, where the signature says (``reference`` joined
    along them); an output whose rows are not on axis 0 is such a state."""
    items = [requested] if isinstance(requested, str) else list(requested) or ["auto"]
    default, per_output = "auto", {}
    for item in items:
        output, _, metric = item.rpartition("=")
        if metric != "auto" and metric not in METRICS.names():
            raise InputError(f"unknown metric '{metric}'", f"use one of: auto, {', '.join(METRICS.names())}")
        if output and output not in reference:
            raise InputError(
                f"--metric names output '{output}', which the model does not produce",
                f"its outputs are: {', '.join(reference)}",
            )
        if output:
            per_output[output] = metric
        else:
            default = metric
    for asked in {default, *per_output.values()} - {"auto"}:
        if METRICS.get(asked).needs_labels and not has_labels:
            raise InputError(
                f"--metric {asked} needs labels", "add a 'labels' array to the data, or use --metric top1/cosine"
            )
    first = channels_first(reference)
    reference = channels_last(reference, first)
    chosen: dict[str, tuple[str, str]] = {}
    auto = [name for name in reference if per_output.get(name, default) == "auto"]
    axes = output_axes or {}
    off_rows = {
        n
        for n in auto
        if axes.get(n, 0) not in (0, None) or (rows is not None and reference[n].ndim and reference[n].shape[0] != rows)
    }
    for name, ref in reference.items():
        if name in off_rows and axes.get(name, 0) not in (0, None):
            chosen[name] = (
                "relerr",
                f"the rows of '{name}' lie on axis {axes[name]} (recurrent state, {list(ref.shape)}): relative error",
            )
        elif name in off_rows:
            chosen[name] = (
                "relerr",
                f"axis 0 of '{name}' is {ref.shape[0]} for {rows} rows (the batch lies on another axis, as in "
                "recurrent state): relative error",
            )
        else:
            chosen[name] = (
                output_metric(name, ref, decision_thresholds)
                if name in auto
                else (per_output.get(name, default), "as requested")
            )
    # A detector head gives class probabilities and, beside them, raw boxes or landmarks: those
    # are coordinates or regressions, whatever their width (MTCNN: probabilities, 4 box offsets,
    # 10 landmarks, per window).
    classes = next((n for n in auto if probabilities(reference[n])), None)
    for name in auto:
        ref = reference[name]
        if (
            not classes
            or name == classes
            or name in off_rows
            or chosen[name][0] not in ("top1", "relerr")
            or probabilities(ref)
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
        scored = next((n for n, (m, _) in chosen.items() if m == "top1" and n not in per_output), None)
        if scored is not None:
            chosen[scored] = ("accuracy", f"labelled data: top-1 accuracy against the labels ({chosen[scored][1]})")
    for name in first & set(auto):
        chosen[name] = (chosen[name][0], f"{chosen[name][1]} (channels on axis 1, read last)")
    return chosen


def compare(
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
    labels: np.ndarray | None,
    metric: str | Sequence[str],
    budget_points: float,
    min_cosine: float | None = None,
    chosen: Mapping[str, tuple[str, str]] | None = None,
    output_axes: Mapping[str, int | None] | None = None,
    decision_thresholds: Sequence[float] = DEFAULT_DECISION_THRESHOLDS,
) -> AccuracyRecord:
    """Every output of ``candidate`` against ``reference``, by its metric, and the verdict.
    ``chosen``: the (metric, why) per output ``choose_metrics`` gave for this reference, where the
    caller judges many candidates against one (the guard), so it is not chosen again each time.
    ``output_axes``: where each output's rows lie (the batches are joined along them)."""
    names = list(reference[0])
    ref = join_rows(reference, output_axes)
    chosen = chosen or choose_metrics(
        metric, ref, labels is not None, output_axes=output_axes, decision_thresholds=decision_thresholds
    )
    first = channels_first(ref)
    ref = channels_last(ref, first)
    cand = channels_last(join_rows(candidate, output_axes), first)
    reference = [channels_last(b, first) for b in reference]
    candidate = [channels_last(b, first) for b in candidate]
    budgets: dict[Budget, float] = {
        "max_accuracy_drop": budget_points,
        "min_cosine": budget_points if min_cosine is None else round((1.0 - min_cosine) * 100.0, 6),
    }
    rows = int(ref[names[0]].shape[0])
    outputs: dict[str, OutputAccuracy] = {}
    labelled: tuple[float, float] | None = None  # (fp32, candidate)
    for n in names:
        kind, why = chosen[n]
        judge = METRICS.get(kind)()
        r, c = ref[n], cand[n]
        if r.shape != c.shape:  # a conversion that mixed up or reshaped outputs: nothing to score
            raise ExportError(
                f"the model judged gives output '{n}' as {list(c.shape[1:])} per row where fp32 gives "
                f"{list(r.shape[1:])}: it does not compute what the fp32 model does",
                "leave this artifact out; report the conversion that made it",
            )
        entry: dict[str, Any] = {"metric": kind, "why": why}
        if r.dtype.kind in "OSU":  # text has no distance: 1 where any value differs, as verify records it
            entry["max_abs_error"] = float(bool((r != c).any()))
        else:
            cos = cosines(r, c)
            entry.update(
                max_abs_error=float(np.abs(r.astype(np.float64) - c).max()),
                cosine_mean=float(cos.mean()),
                cosine_min=float(cos.min()),
                relative_error=relative_error(r, c),
            )
        entry["top1_agreement"] = float((classes(r) == classes(c)).mean())
        seen = Output(n, r, c, [b[n] for b in reference], [b[n] for b in candidate], ref, labels, decision_thresholds)
        drop, found = judge.score(seen)
        entry.update(found)
        if "accuracy" in found:  # labelled accuracy is the whole model's too
            labelled = (found["accuracy_fp32"], found["accuracy"])
        broken = _non_finite(r, c)
        if broken or not np.isfinite(drop):
            # NaN or infinity where fp32 has a number (a constant below fp16's range made 0, then a log
            # of it): no metric of the rest can vouch for it, and an argmax over NaN still agrees
            entry.update(non_finite=broken, values=int(np.size(c)))
            drop = 1.0
        entry["drop_points"] = round(max(drop, 0.0) * 100.0, 4)
        entry["budget_points"] = budgets[judge.budget]
        entry["within_budget"] = entry["drop_points"] <= entry["budget_points"]
        outputs[n] = cast(OutputAccuracy, entry)  # with the metric's own measurements beside the typed ones
    worst = max(outputs, key=lambda n: outputs[n]["drop_points"] - outputs[n]["budget_points"])
    result: AccuracyRecord = {
        "rows": rows,
        "outputs": outputs,
        "metric": outputs[worst]["metric"],
        "deciding_output": worst,
        "top1_agreement": outputs[names[0]]["top1_agreement"],
        "drop_points": outputs[worst]["drop_points"],
        "budget_points": outputs[worst]["budget_points"],
        "within_budget": all(o["within_budget"] for o in outputs.values()),
    }
    if labelled is not None:
        result["accuracy_fp32"], result["accuracy"] = labelled
    return result


def _non_finite(reference: np.ndarray, candidate: np.ndarray) -> int:
    """How many of a float output's values are NaN or infinite where the reference's are finite."""
    if not (np.issubdtype(candidate.dtype, np.floating) and np.issubdtype(reference.dtype, np.number)):
        return 0
    if candidate.shape != reference.shape:
        return 0  # the metrics say what differs
    return int(np.count_nonzero(~np.isfinite(candidate) & np.isfinite(reference)))


def detail(o: Mapping[str, Any]) -> str:
    """What one output's metric measured, in words (messages and the CLI's table)."""
    if "non_finite" in o:
        return (
            f"{o['non_finite']} of {o['values']} values NaN or infinite where fp32's are finite"
            if o["non_finite"]
            else f"its {o['metric']} is not a number"
        )
    return METRICS.get(o["metric"])().detail(o)


def metric_help() -> str:
    """The ``--metric`` choices, each with what it measures and the option that bounds it."""
    return "; ".join(f"{name}: {cls.measures} ({BUDGET_OPTIONS[cls.budget]})" for name, cls in METRICS)


def describe(accuracy: AccuracyRecord) -> str:
    """One line of numbers for messages: each output's metric, drop and budget."""
    return "; ".join(
        f"{name}: {o['metric']} drop {o['drop_points']:.2f} points (budget {o['budget_points']:g}), {detail(o)}"
        for name, o in accuracy["outputs"].items()
    )
