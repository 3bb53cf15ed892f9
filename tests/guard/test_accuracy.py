"""The metric follows the output: class scores by top-1 (accuracy with labels), embeddings by
cosine, detector heads by their detections (test_detections.py), probability maps by the regions
or the foreground they mark, coordinates per window beside class probabilities in units of the
window where fp32 detects, boxes and other regressions by relative error; per-output overrides and the cosine budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
from console import assert_one_line_error, deploy

from unideploy.errors import ExportError, InputError
from unideploy.guard.accuracy import choose_metrics, compare, describe, output_metric
from unideploy.guard.guard import Guard, settings_of

rng = np.random.default_rng(0)


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_each_kind_of_output_gets_its_metric_and_a_reason():
    logits = rng.standard_normal((8, 10)).astype(np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert output_metric("output", logits)[0] == "top1"
    assert output_metric("output", probs) == ("top1", "rows are probabilities over 10 classes: top-1 agreement")
    assert output_metric("output", _unit(rng.standard_normal((8, 384))))[0] == "cosine"
    assert output_metric("sentence_embedding", rng.standard_normal((8, 384)))[0] == "cosine"
    ctc = np.exp(rng.standard_normal((8, 40, 97)))
    assert output_metric("softmax", ctc / ctc.sum(-1, keepdims=True))[0] == "top1"  # OCR: per position
    assert output_metric("text_map", _text_map())[0] == "regions"  # decided probabilities, lines apart
    segment = np.zeros((8, 1, 32, 32))
    segment[:, :, 4:20, 4:20] = 1.0
    assert output_metric("person", segment)[0] == "mask"  # one region per map
    assert output_metric("image", rng.random((8, 1, 32, 32)))[0] == "relerr"  # intensities in [0, 1]
    assert output_metric("rgb", (rng.random((8, 3, 32, 32)) > 0.5) * 1.0)[0] == "relerr"  # not one channel
    assert output_metric("heatmap", rng.standard_normal((8, 1, 32, 32)))[0] == "relerr"
    assert output_metric("387", rng.standard_normal((32, 1, 97)))[0] == "top1"  # CTC logits [T, N, C]
    assert output_metric("last_hidden_state", rng.standard_normal((8, 16, 64)))[0] == "relerr"
    assert output_metric("boxes", rng.random((8, 2100, 4)) * 320)[0] == "relerr"
    assert output_metric("landmarks", rng.random((8, 63)) * 256)[0] == "relerr"  # not 63 classes
    assert output_metric("bbox", rng.random((8, 4)) * 320)[0] == "relerr"
    assert output_metric("class_scores", rng.standard_normal((8, 4)))[0] == "top1"
    assert output_metric("output0", rng.random((8, 84, 2100)))[0] == "detection"  # YOLOv8: [N, 4+80, anchors]
    assert output_metric("ids", np.arange(8)[:, None])[0] == "top1"


def _face_probabilities(faces: np.ndarray) -> np.ndarray:
    """[N, 2] probabilities (class 0 the background), the face class winning where ``faces``."""
    face = np.where(faces, 0.9, 0.1)
    return np.stack([1.0 - face, face], axis=-1)


def test_raw_values_beside_class_probabilities_are_regressions():
    """Values beside class probabilities that are too large to be coordinates in units of their
    window (pixels, sizes): relative error. Top-1 of them would flip on noise that moves nothing."""
    outputs = {
        "prob": _face_probabilities(np.arange(8) % 2 == 0),
        "Identity_1": 50.0 * rng.standard_normal((8, 4)),  # names that say nothing, as TensorFlow's
        "Identity_2": 50.0 * rng.standard_normal((8, 10)),
    }
    chosen = choose_metrics("auto", outputs, has_labels=False)
    assert chosen["prob"][0] == "top1"
    assert chosen["Identity_1"][0] == chosen["Identity_2"][0] == "relerr" and "'prob'" in chosen["Identity_1"][1]
    assert choose_metrics("auto", {"logits": outputs["Identity_2"]}, has_labels=False)["logits"][0] == "top1"
    assert choose_metrics(["Identity_1=top1"], outputs, has_labels=False)["Identity_1"][0] == "top1"  # asked: kept


@pytest.mark.parametrize("layout", ["rows", "positions", "channels-first"])
def test_window_coordinates_are_judged_in_window_units_at_the_windows_fp32_detects(layout):
    """MTCNN: per window, face probabilities and, beside them, box offsets and landmarks in units of
    the window (O-Net: rows; P-Net: every position of a map, channels last from Keras, channels
    first from MindSpore or PyTorch). The application drops the coordinates of background windows:
    noise there changes nothing, noise at a face moves its box."""
    faces = np.arange(64) % 4 == 0
    shape = (64,) if layout == "rows" else (4, 4, 4)

    def laid_out(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(a, -1, 1)) if layout == "channels-first" else a

    prob = laid_out(_face_probabilities(faces).reshape(*shape, 2))
    box = laid_out((0.1 * rng.standard_normal((64, 4))).reshape(*shape, 4))
    noise = laid_out((np.where(faces[:, None], 0.003, 0.5) * rng.choice([-1.0, 1.0], (64, 4))).reshape(*shape, 4))
    chosen = choose_metrics("auto", {"prob": prob, "box": box}, has_labels=False)
    assert chosen["box"][0] == "coords" and "16 windows" in chosen["box"][1] and "'prob'" in chosen["box"][1]
    assert chosen["prob"][0] == "top1"
    assert ("channels on axis 1" in chosen["prob"][1]) == (layout == "channels-first")

    result = compare([{"prob": prob, "box": box}], [{"prob": prob, "box": box + noise}], None, "auto", 1.0)
    entry = result["outputs"]["box"]
    assert entry["windows"] == 16 and entry["windows_total"] == 64
    assert entry["drop_points"] == pytest.approx(0.3) and result["within_budget"]
    assert entry["relative_error"] > 1.0  # relerr over every window would have refused it
    assert "off by 0.30% of the window on average" in describe(result)

    shifted = box + laid_out(np.where(faces[:, None], 0.02, 0.0).reshape(*shape, 1))  # faces' edges move 2 %
    result = compare([{"prob": prob, "box": box}], [{"prob": prob, "box": shifted}], None, "auto", 1.0)
    assert result["deciding_output"] == "box" and result["drop_points"] == pytest.approx(2.0)
    assert not result["within_budget"]


def test_coords_needs_windows_classed_as_objects():
    box = 0.1 * rng.standard_normal((8, 4))
    background = _face_probabilities(np.zeros(8, dtype=bool))
    assert choose_metrics("auto", {"prob": background, "box": box}, False)["box"][0] == "relerr"  # none detected
    for outputs in ({"box": box}, {"prob": background, "box": box}):
        with pytest.raises(InputError, match="--metric coords: output 'box'.*use --metric relerr"):
            compare([outputs], [outputs], None, ["box=coords"], 1.0)


def test_text_labels_are_judged_by_equal_values():
    """A classifier answering class names (scikit-learn's, through skl2onnx): each row's name equal
    to fp32's, and no distance computed between texts (it crashed on 'benign' as a float)."""
    names = np.array(["malignant", "benign"] * 4)
    probabilities = _face_probabilities(np.arange(8) % 2 == 0)
    chosen = choose_metrics("auto", {"label": names, "probabilities": probabilities}, has_labels=False)
    assert chosen["label"] == ("top1", "text values (class names): share of equal values")
    flipped = names.copy()
    flipped[0] = "benign"
    result = compare(
        [{"label": names, "probabilities": probabilities}],
        [{"label": flipped, "probabilities": probabilities}],
        None,
        "auto",
        1.0,
    )
    label = result["outputs"]["label"]
    assert label["top1_agreement"] == 0.875 and label["drop_points"] == 12.5 and label["max_abs_error"] == 1.0
    assert "cosine_mean" not in label and not result["within_budget"] and result["deciding_output"] == "label"
    assert "label: top1 drop 12.50 points (budget 1), top-1 agreement 0.8750" in describe(result)


def test_a_refusal_says_when_one_row_is_worth_more_than_the_budget():
    """Top-1 agreement moves by a row's share: on 24 validation rows one changed prediction is 4.17
    points, and a 1-point budget can only refuse it (fp16 of MobileNetV2, 2026-11-30). The refusal
    says so and how many rows would judge within the budget; where rows resolve it, where more
    changed than any number of rows would allow, or the candidate is within budget, nothing is
    added."""
    rng = np.random.default_rng(3)

    def judged(rows: int, changed: int, budget: float = 1.0) -> str:
        scores = rng.random((rows, 10)).astype(np.float32)
        moved = scores.copy()
        moved[:changed, :] = scores[:changed, ::-1]  # reversed scores: another argmax
        assert (scores[:changed].argmax(1) != moved[:changed].argmax(1)).all()
        return describe(compare([{"logits": scores}], [{"logits": moved}], None, "top1", budget))

    assert judged(24, 1).endswith(
        "top-1 agreement 0.9583; one of the 24 compared is 4.17 points, more than the budget, so a single change "
        "refuses: validate on 100 or more (--validation) to judge within it"
    )
    assert "validate on 50 or more" in judged(24, 1, budget=2.0)
    assert judged(50, 5).endswith("top-1 agreement 0.9000")  # 10 points: not one row's doing
    assert judged(200, 3).endswith("top-1 agreement 0.9850")  # over budget, but a row is 0.5 points
    assert judged(24, 0).endswith("top-1 agreement 1.0000")
    # a search that keeps layers as they were for that row (fp16's) says so in its own words
    from unideploy.guard.metrics.builtin import one_row_decides

    kept = one_row_decides({"compared": 24, "budget_points": 1.0, "drop_points": 4.1667}, "keeps layers in fp32")
    assert "so a single change keeps layers in fp32: validate on 100 or more" in kept


def test_recurrent_state_is_joined_along_its_rows_and_judged_by_relative_error():
    """An LSTM's state [2, batch, 128] beside a speech probability per row, over two batches of 3
    and 5 rows: where the signature says its rows lie on axis 1, the batches are joined there (8
    rows, not a [4, ...] stack) and it is judged by its relative error, saying why; without the
    signature, the rows it does not have on axis 0 say the same."""
    rng = np.random.default_rng(0)
    batches = [
        {"speech": rng.random((n, 1)).astype(np.float32), "stateN": rng.standard_normal((2, n, 128))} for n in (3, 5)
    ]
    moved = [{"speech": b["speech"], "stateN": b["stateN"] + 1e-4} for b in batches]
    result = compare(batches, moved, None, "auto", 1.0, output_axes={"speech": 0, "stateN": 1})
    state = result["outputs"]["stateN"]
    assert state["metric"] == "relerr" and state["why"].startswith("the rows of 'stateN' lie on axis 1")
    assert "[2, 8, 128]" in state["why"] and result["rows"] == 8 and result["within_budget"]
    inferred = choose_metrics("auto", {"speech": np.zeros((8, 1)), "stateN": np.zeros((4, 4, 128))}, False, rows=8)
    assert inferred["stateN"][0] == "relerr" and "axis 0 of 'stateN' is 4 for 8 rows" in inferred["stateN"][1]


def test_embeddings_are_judged_by_cosine_not_top1():
    rows = rng.standard_normal((16, 64))
    rows[:, :2] = 4.0  # two equal largest components: any noise flips the argmax of an embedding
    reference = _unit(rows)
    noisy = _unit(reference + 0.01 * rng.standard_normal(reference.shape))  # while its direction holds
    result = compare([{"emb": reference}], [{"emb": noisy}], None, "auto", 1.0)
    entry = result["outputs"]["emb"]
    assert entry["metric"] == "cosine" and entry["cosine_mean"] > 0.99 and result["within_budget"]
    assert entry["top1_agreement"] < 1.0  # top-1 would have refused it
    assert not compare([{"emb": reference}], [{"emb": noisy}], None, "auto", 1.0, min_cosine=0.99999)["within_budget"]


def test_every_output_must_hold_its_own_budget():
    logits = rng.standard_normal((20, 5))
    boxes = rng.random((20, 4, 10)) + 1.0
    drifted = boxes * 1.05  # 5 % relative error
    result = compare([{"scores": logits, "boxes": boxes}], [{"scores": logits, "boxes": drifted}], None, "auto", 1.0)
    assert result["outputs"]["scores"]["within_budget"] and not result["outputs"]["boxes"]["within_budget"]
    assert result["deciding_output"] == "boxes" and result["metric"] == "relerr"
    assert abs(result["drop_points"] - 5.0) < 1e-6 and not result["within_budget"]


def test_labels_make_the_first_class_output_an_accuracy():
    logits = rng.standard_normal((10, 3))
    chosen = choose_metrics("auto", {"emb": _unit(rng.standard_normal((10, 8))), "logits": logits}, True)
    assert chosen["logits"][0] == "accuracy" and chosen["emb"][0] == "cosine"


@pytest.mark.parametrize(
    "requested, pattern",
    [
        (["nonsense"], "unknown metric 'nonsense'"),
        (["missing=cosine"], "names output 'missing', which the model does not produce"),
        (["accuracy"], "--metric accuracy needs labels"),
    ],
)
def test_bad_metric_requests_are_refused(requested, pattern):
    with pytest.raises(InputError, match=pattern):
        choose_metrics(requested, {"output": rng.standard_normal((4, 3))}, False)


def test_cli_metric_per_output_and_the_reason_are_recorded(digits_package, digits, tmp_path):
    result = deploy(
        "optimize",
        digits_package,
        "-o",
        tmp_path / "fp16",
        "--quantize",
        "fp16",
        "--calibration",
        digits["data"],
        "--metric",
        "output=cosine",
        "--min-cosine",
        "0.999",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    entry = json.loads(result.stdout)["accuracy"]["outputs"]["output"]
    assert (
        entry["metric"] == "cosine" and entry["why"] == "as requested" and entry["budget_points"] == pytest.approx(0.1)
    )
    shown = deploy(
        "optimize", digits_package, "-o", tmp_path / "fp16b", "--quantize", "fp16", "--calibration", digits["data"]
    )
    assert shown.returncode == 0 and "judged 'output' by accuracy: labelled data" in shown.stdout
    bad = deploy(
        "optimize",
        digits_package,
        "-o",
        tmp_path / "x",
        "--quantize",
        "fp16",
        "--calibration",
        digits["data"],
        "--metric",
        "logits=cosine",
    )
    assert_one_line_error(bad, 2, "names output 'logits', which the model does not produce")


def _text_map() -> np.ndarray:
    reference = np.full((4, 1, 64, 64), 0.02)
    reference[:, :, 10:20, 5:60] = 0.9  # two text lines per image
    reference[:, :, 40:50, 5:30] = 0.7
    return reference


def test_a_text_map_is_judged_by_the_regions_post_processing_finds():
    """A text detector's map: noise on the background that crosses no threshold is a large relative
    error and no change to what the application sees; a region lost, split or merged is."""
    reference = _text_map()
    noisy = reference + rng.uniform(0.0, 0.1, reference.shape)  # background 0.02 -> up to 0.12
    result = compare([{"map": reference}], [{"map": noisy}], None, "auto", 1.0)
    entry = result["outputs"]["map"]
    assert entry["metric"] == "regions" and "2.0 separate regions per map" in entry["why"]
    assert entry["region_hmean"] == 1.0 and entry["regions_fp32"] == 8 and result["within_budget"]
    assert entry["relative_error"] > 0.01  # relerr would have refused it
    thinner = reference.copy()
    thinner[:, :, 10, 5:60] = thinner[:, :, 40, 5:30] = 0.02  # a border row lost: the same boxes
    entry = compare([{"map": reference}], [{"map": thinner}], None, "auto", 1.0)["outputs"]["map"]
    assert entry["region_hmean"] == 1.0 and entry["mask_iou"] == pytest.approx(720 / 800)
    faded = reference.copy()
    faded[:, :, 40:50, 5:30] = 0.4  # still above DB's 0.3: the same boxes (pixel IoU at 0.5 lost it)
    entry = compare([{"map": reference}], [{"map": faded}], None, "auto", 1.0)["outputs"]["map"]
    assert entry["region_hmean"] == 1.0 and entry["mask_iou"] == pytest.approx(550 / 800)
    faded[:, :, 40:50, 5:30] = 0.2  # below it: the second line's box is gone
    entry = compare([{"map": reference}], [{"map": faded}], None, "auto", 1.0)["outputs"]["map"]
    assert entry["region_threshold"] == 0.3 and entry["regions_matched"] == entry["regions"] == 4
    assert entry["region_hmean"] == pytest.approx(2 * 4 / (8 + 4)) and not entry["within_budget"]
    merged = reference.copy()
    merged[:, :, 20:40, 5:30] = 0.9  # the two lines run into one region: neither box survives
    entry = compare([{"map": reference}], [{"map": merged}], None, "auto", 1.0)["outputs"]["map"]
    assert entry["regions"] == 4 and entry["regions_matched"] == 0 and entry["drop_points"] == 100.0
    specks = reference.copy()
    specks[:, :, 30, 30] = specks[:, :, 55:57, 50:60] = 0.95  # smaller than DB keeps (a side < 3 px)
    entry = compare([{"map": reference}], [{"map": specks}], None, "auto", 1.0)["outputs"]["map"]
    assert entry["region_hmean"] == 1.0
    assert "hmean 0.0000: 0 of 8 regions kept (4 found at 0.3)" in describe(
        {"outputs": {"map": compare([{"map": reference}], [{"map": merged}], None, "auto", 1.0)["outputs"]["map"]}}
    )


def test_a_map_with_one_segment_per_image_is_judged_by_its_pixels():
    """A segmenter's one region per image keeps IoU > 0.5 through a large loss of its border: its
    pixels are what the application reads."""
    reference = np.full((4, 1, 64, 64), 0.02)
    reference[:, :, 8:56, 8:56] = 0.95
    shrunk = reference.copy()
    shrunk[:, :, 8:16] = 0.02
    entry = compare([{"map": reference}], [{"map": shrunk}], None, "auto", 1.0)["outputs"]["map"]
    assert entry["metric"] == "mask" and entry["mask_iou"] == pytest.approx(40 / 48)
    assert not entry["within_budget"] and "mask IoU 0.8333" in describe({"outputs": {"map": entry}})
    asked = compare([{"map": reference}], [{"map": shrunk}], None, "map=regions", 1.0)["outputs"]["map"]
    assert asked["metric"] == "regions" and asked["region_hmean"] == 1.0  # IoU 0.83 > 0.5: matched


def _ctc_logits(texts: list[list[int]], shift: int = 0, positions: int = 12, classes: int = 20) -> np.ndarray:
    """Logits [N, T, C] whose greedy CTC decoding is each text: character i at position 2i + shift,
    the blank (class 0) everywhere else, so repeated characters stay apart."""
    logits = np.zeros((len(texts), positions, classes))
    logits[:, :, 0] = 5.0
    for row, text in enumerate(texts):
        for i, char in enumerate(text):
            logits[row, 2 * i + shift] = 0.0
            logits[row, 2 * i + shift, char] = 5.0
    return logits + rng.uniform(0.0, 0.5, logits.shape)


def test_ctc_outputs_are_judged_by_the_text_they_decode_to():
    """An OCR recognizer: characters moved to the next position are the same text (per-position top-1
    would count every one of them); a character lost is one edit in the character error rate."""
    texts = [[1, 2, 3], [4, 4, 5], [2]]
    reference = _ctc_logits(texts)
    metric, why = output_metric("softmax_11.tmp_0", reference)
    assert metric == "text" and "class 0, the blank" in why
    moved = compare([{"y": reference}], [{"y": _ctc_logits(texts, shift=1)}], None, "auto", 1.0)["outputs"]["y"]
    assert moved["metric"] == "text" and moved["character_error_rate"] == 0.0 and moved["within_budget"]
    assert moved["top1_agreement"] < 0.8
    lost = compare([{"y": reference}], [{"y": _ctc_logits([[1, 2, 3], [4, 5], [2]])}], None, "auto", 1.0)
    entry = lost["outputs"]["y"]
    assert entry["character_error_rate"] == pytest.approx(1 / 7) and entry["texts_changed"] == 1
    assert not lost["within_budget"] and "character error rate 0.1429 (1 of 3 texts read differently" in describe(lost)
    # a CRNN exported at batch 1 gives [T, 1, C]: one text per batch
    per_text = [{"y": reference[i][:, None]} for i in range(3)]
    candidates = [{"y": _ctc_logits([t])[0][:, None]} for t in ([1, 2, 3], [4, 5], [2])]
    assert compare(per_text, candidates, None, "auto", 1.0)["outputs"]["y"]["character_error_rate"] == pytest.approx(
        1 / 7
    )
    with pytest.raises(InputError, match="not a CTC sequence"):
        compare([{"y": rng.standard_normal((4, 10))}], [{"y": rng.standard_normal((4, 10))}], None, "y=text", 1.0)


def test_nan_where_fp32_has_numbers_loses_the_output_whatever_its_metric():
    """Basic Pitch's TFLite fp16 turned a tiny constant into 0 and a log of it into NaN: a NaN or an
    infinity where fp32 has a number is the whole output lost (an argmax over NaN still agrees with
    fp32 on most rows), said as such rather than as a drop of 'nan points'."""
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10), 64).astype(np.float32)  # class probabilities: judged by top-1
    heat = rng.standard_normal((64, 8)).astype(np.float32)  # a regression: judged by relative error
    broken_probs, broken_heat = probs.copy(), heat.copy()
    broken_probs[:3, 5] = np.nan
    broken_heat[0, 0] = np.inf
    record = compare([{"p": probs, "h": heat}], [{"p": broken_probs, "h": broken_heat}], None, "auto", 1.0)
    assert not record["within_budget"]
    p, h = record["outputs"]["p"], record["outputs"]["h"]
    assert (p["metric"], p["non_finite"], p["drop_points"]) == ("top1", 3, 100.0)
    assert (h["metric"], h["non_finite"], h["drop_points"]) == ("relerr", 1, 100.0)
    said = describe(record)
    assert "3 of 640 values NaN or infinite where fp32's are finite" in said and "nan points" not in said
    assert compare([{"p": probs}], [{"p": probs}], None, "auto", 1.0)["within_budget"]


def _pitch_bins(centres: np.ndarray, bins: int = 360, width: float = 1.25) -> np.ndarray:
    """Scores over ordered bins as a pitch tracker gives them: a bump around each row's pitch bin
    (CREPE's targets are blurred over 25 cents, 1.25 of its 20-cent bins)."""
    axis = np.arange(bins)
    return np.exp(-0.5 * ((axis[None, :] - centres[:, None]) / width) ** 2).astype(np.float32)


def test_scores_over_ordered_bins_are_judged_within_one_bin():
    """CREPE's INT8 moved the best of its 360 pitch bins by one (20 cents) on most of the frames
    where it disagreed: exact top-1 counts that as a wrong answer, the bins metric as a match; a
    move of three bins or more is still a miss."""
    centres = rng.uniform(40, 320, 128)
    reference = _pitch_bins(centres)
    metric, why = output_metric("output", reference)
    assert metric == "bins" and "360 ordered bins" in why and "within 1 bin" in why, why
    nudged = _pitch_bins(centres + np.where(np.arange(128) % 4 == 0, 1.0, 0.0))  # a quarter of the rows one bin up
    record = compare([{"output": reference}], [{"output": nudged}], None, "auto", 1.0)
    entry = record["outputs"]["output"]
    assert record["within_budget"] and entry["bins_agreement"] == 1.0 and entry["top1_agreement"] < 0.8
    assert "within 1 bin 1.0000 (top-1 exactly" in describe(record)
    strayed = _pitch_bins(centres + np.where(np.arange(128) % 8 == 0, 3.0, 0.0))
    entry = compare([{"output": reference}], [{"output": strayed}], None, "auto", 1.0)["outputs"]["output"]
    assert entry["drop_points"] == pytest.approx(12.5) and entry["bins_moved_most"] == 3
    contour = 0.4 * _pitch_bins(rng.uniform(40, 220, 4 * 172), bins=264) + rng.normal(0.1, 0.01, (4 * 172, 264))
    per_frame = contour.reshape(4, 172, 264)  # Basic Pitch's: a bump per frame over a floor near 0.1
    assert output_metric("contour", per_frame)[0] == "bins"
    assert output_metric("output", rng.standard_normal((64, 360)))[0] != "bins"  # unrelated classes
    with pytest.raises(InputError, match="holds no scores over bins"):
        compare([{"y": reference[:, 0]}], [{"y": reference[:, 0]}], None, "y=bins", 1.0)


def test_wide_rows_whose_largest_value_does_not_stand_out_are_regressions():
    """BlazePose gives 39 landmarks' (x, y, z, visibility, presence) as 195 unnamed values per row:
    read as scores over 195 classes, its INT8 lost "81 points of top-1" that meant nothing. A
    classifier's winner stands far above the rest of its row; coordinates spread evenly do not."""
    landmarks = rng.uniform(0, 256, (32, 195))
    metric, why = output_metric("Identity", landmarks)
    assert metric == "relerr" and "no value of the 195 per row stands out as a class's winner does" in why, why
    logits = rng.standard_normal((32, 1000))
    logits[np.arange(32), rng.integers(0, 1000, 32)] += 6.0  # each row's class, confidently
    assert output_metric("output", logits)[0] == "top1"
    assert output_metric("logits", landmarks)[0] == "top1"  # named as class scores: as named
    assert output_metric("Identity", landmarks[:, :19])[0] == "top1"  # too few values to tell


def test_a_candidate_whose_output_has_another_shape_is_refused_by_name():
    """A conversion that mixed up two outputs (a [N, 5] one given where fp32 gives [N, 4]) has
    nothing to score: the guard says which output and both shapes, where numpy's broadcasting
    error was an internal one (exit 70)."""
    rng = np.random.default_rng(0)
    alpha, zeta = rng.standard_normal((6, 5)), rng.standard_normal((6, 4))
    with pytest.raises(ExportError, match=r"output 'alpha' as \[4\] per row where fp32 gives \[5\]"):
        compare([{"alpha": alpha, "zeta": zeta}], [{"alpha": zeta, "zeta": alpha}], None, "auto", 1.0)


def test_a_probability_per_row_is_judged_by_the_decisions_it_makes():
    """A voice-activity detector's speech probability (one per chunk, nearly all near 0 or 1) is a
    yes or a no: a candidate a few hundredths off decides as fp32 does, one that flips chunks does
    not; its relative error, dominated by the rows near 0, would say neither. Values spread over
    [0, 1] (a regressed score) or named as a regression keep relative error."""
    speech = np.r_[np.full(60, 0.02), np.full(40, 0.97)].reshape(-1, 1).astype(np.float32)
    speech[[10, 70], 0] = (0.4, 0.6)  # two chunks undecided
    assert output_metric("output", speech)[0] == "decision"
    assert output_metric("output", speech.ravel())[0] == "decision"  # [N] as well as [N, 1]
    assert output_metric("output", rng.random((100, 1)))[0] == "relerr"  # spread: not decisions
    assert output_metric("box_offset", speech)[0] == "relerr"
    close = compare([{"output": speech}], [{"output": speech + 0.03}], None, "auto", 1.0)
    assert close["within_budget"] and close["outputs"]["output"]["decision_agreement"] == 1.0
    flipped = speech.copy()
    flipped[[10, 70, 20], 0] = (0.6, 0.4, 0.35)  # two undecided chunks cross 0.5; one near 0 crosses 0.3
    record = compare([{"output": speech}], [{"output": flipped}], None, "auto", 1.0)
    agreement = record["outputs"]["output"]["decision_agreement_by_threshold"]
    assert agreement == {"0.3": 0.99, "0.5": 0.98} and record["drop_points"] == pytest.approx(2.0)
    assert "decisions agree on 98.00% of rows (worst of thresholds 0.3, 0.5)" in describe(record)


def test_decisions_are_judged_where_the_application_cuts():
    """A wake word cut at 0.97: a candidate that moves confident rows across 0.97 keeps every
    decision at the defaults (0.3, 0.5) and loses them at the application's own threshold."""
    scores = np.r_[np.full(50, 0.01), np.full(50, 0.975)].reshape(-1, 1).astype(np.float32)
    lowered = scores.copy()
    lowered[50:55, 0] = 0.965  # five detections fall below 0.97, far above 0.5
    by_default = compare([{"output": scores}], [{"output": lowered}], None, "auto", 1.0)
    assert by_default["within_budget"] and by_default["outputs"]["output"]["decision_agreement"] == 1.0
    cut = compare([{"output": scores}], [{"output": lowered}], None, "auto", 1.0, decision_thresholds=(0.97,))
    assert cut["outputs"]["output"]["decision_agreement_by_threshold"] == {"0.97": 0.95}
    assert not cut["within_budget"] and "worst of thresholds 0.97" in describe(cut)
    assert "decided alike at 0.97" in output_metric("output", scores, (0.97,))[1]
    with pytest.raises(InputError, match=r"--decision-threshold 1\.5 is not a probability"):
        settings_of({"decision_thresholds": (0.5, 1.5)})
    assert settings_of(None)["decision_thresholds"] == ()  # the defaults, 0.3 and 0.5
    spread = {"output": np.random.default_rng(1).random((20, 1)).astype(np.float32)}  # a regressed score
    guard = Guard([spread], [spread], decision_thresholds=(0.97,))
    with pytest.raises(
        InputError, match=r"applies to outputs judged by 'decision', and none is here \(output: relerr\)"
    ):
        _ = guard.metrics
    assert Guard([spread], [spread], metric="output=decision", decision_thresholds=(0.97,)).metrics["output"][0] == (
        "decision"
    )
