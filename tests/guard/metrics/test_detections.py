"""A detector's head is judged by the detections a user would get from it, not by its raw values."""

from __future__ import annotations

import numpy as np
import pytest

from unideploy.errors import InputError
from unideploy.guard.accuracy import compare, describe, output_metric
from unideploy.guard.metrics import detections


@pytest.fixture(scope="module")
def yolov8_heads(zoo_models) -> np.ndarray:
    """NudeNet's YOLOv8n (Ultralytics export, 18 classes) on real photos: [N, 22, 2100]."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(zoo_models.shipped("nudenet/320n.onnx")), providers=["CPUExecutionProvider"])
    images = zoo_models.nchw(zoo_models.photos(32), 320, 320)
    return np.concatenate([session.run(None, {"images": images[i : i + 1]})[0] for i in range(len(images))])


@pytest.fixture(scope="module")
def yolox_heads(zoo_models) -> np.ndarray:
    """ddddocr's character detector (YOLOX, exported without its decoder) on real text scans:
    [N, 3549, 6], boxes as grid offsets at strides 8/16/32 of a 416 x 416 input."""
    import onnxruntime as ort

    path = zoo_models.shipped("ddddocr/common_det.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images = zoo_models.nchw(zoo_models.text_scans(6), 416, 416) * 255.0
    return np.concatenate([session.run(None, {"images": images[i : i + 1]})[0] for i in range(len(images))])


def _rows(heads: np.ndarray) -> list[dict[str, np.ndarray]]:
    return [{"output0": heads[i : i + 1]} for i in range(len(heads))]


def test_a_real_yolov8_head_is_judged_by_its_detections(yolov8_heads):
    metric, why = output_metric("output0", yolov8_heads)
    assert metric == "detection" and "YOLOv8" in why
    found = sum(len(detections.detect(detections.Layout(anchors_last=True), row)[0]) for row in yolov8_heads)
    assert 0 < found < 100 * len(yolov8_heads)  # NMS leaves a few per photo of the thousands of anchors

    # noise that moves no box far and no score across the threshold changes no detection, whatever
    # it does to the relative error of 2100 background anchors
    jittered = yolov8_heads * np.random.default_rng(0).uniform(0.99, 1.01, yolov8_heads.shape).astype(np.float32)
    same = compare(_rows(yolov8_heads), _rows(jittered), None, "auto", 1.0)["outputs"]["output0"]
    assert same["metric"] == "detection" and same["detection_ap"] > 0.99 and same["within_budget"]


def test_a_lost_object_and_a_changed_class_count_against(yolov8_heads):
    layout = detections.Layout(anchors_last=True)
    row = next(i for i, head in enumerate(yolov8_heads) if len(detections.detect(layout, head)[0]) >= 2)
    first, second = detections.detect(layout, yolov8_heads[row])[0][:2]
    boxes, _ = layout.boxes_scores(yolov8_heads[row])
    changed = yolov8_heads.copy()
    # every anchor on the first object loses its scores (the object is missed), every anchor on the
    # second gives them to another class
    on_first, on_second = detections.iou(first, boxes) > 0.3, detections.iou(second, boxes) > 0.3
    changed[row, 4:, on_first] = 0.0
    changed[row, 4:, on_second & ~on_first] = np.roll(changed[row, 4:, on_second & ~on_first], 1, axis=1)
    result = compare(_rows(yolov8_heads), _rows(changed), None, "detection", 1.0)
    entry = result["outputs"]["output0"]
    assert entry["detections_fp32"] - entry["detections_matched"] >= 2 and not entry["within_budget"]
    assert "detections kept" in describe(result)


def test_a_real_yolox_head_is_decoded_on_its_grids_and_judged_by_its_detections(yolox_heads):
    metric, why = output_metric("output", yolox_heads)
    assert metric == "detection" and "YOLOX" in why and "8/16/32" in why
    layout = detections.layout(yolox_heads)
    found = [detections.detect(layout, head)[0] for head in yolox_heads]
    assert sum(map(len, found)) >= 20  # characters on printed pages
    boxes = np.concatenate(found)
    # decoded on the right grids: boxes lie on the 416 x 416 image, character-sized
    assert boxes.min() > -8 and boxes.max() < 424
    sizes = boxes[:, 2:] - boxes[:, :2]
    assert 4 < np.median(sizes) < 100
    # every candidate box on one detected character loses its objectness: one detection lost
    row = next(i for i, f in enumerate(found) if len(f))
    changed = yolox_heads.copy()
    candidates, _ = layout.boxes_scores(changed[row])
    changed[row, detections.iou(found[row][0], candidates) > 0.3, 4] = 0.0
    entry = compare(_rows(yolox_heads), _rows(changed), None, "auto", 1.0)["outputs"]["output0"]
    assert entry["metric"] == "detection" and entry["detections_fp32"] - entry["detections_matched"] == 1


def _yolov5_head(boxes: list[tuple[float, float, float, float, float, int]], anchors: int = 300) -> np.ndarray:
    """[1, anchors, 5 + 3]: (cx, cy, w, h, objectness, class) for the first anchors, background after."""
    head = np.zeros((1, anchors, 8), np.float32)
    head[0, :, :4] = (50, 50, 4, 4)
    for i, (cx, cy, w, h, objectness, cls) in enumerate(boxes):
        head[0, i, :5] = (cx, cy, w, h, objectness)
        head[0, i, 5 + cls] = 0.9
    return head


def test_yolov5_layout_objectness_and_class_aware_nms():
    head = _yolov5_head(
        [(20, 20, 10, 10, 0.9, 0), (21, 20, 10, 10, 0.8, 0), (21, 20, 10, 10, 0.8, 1), (80, 80, 8, 8, 0.2, 2)]
    )
    layout = detections.layout(head)
    assert layout == detections.Layout(anchors_last=False)
    boxes, classes, _ = detections.detect(layout, head[0])
    # the second class-0 box overlaps the first and goes; the class-1 box stays; 0.2 x 0.9 is under the threshold
    assert classes.tolist() == [0, 1] and np.allclose(boxes[0], (15, 15, 25, 25))


def test_a_score_across_the_threshold_costs_little_and_a_confident_miss_much():
    """AP against fp32's detections: what mAP would say, not a count of every box alike."""
    truth = [(20, 20, 10, 10, 0.9, 0), (60, 20, 10, 10, 0.9, 1), (20, 60, 10, 10, 0.9, 2), (60, 60, 10, 10, 0.4, 0)]
    reference = _yolov5_head(truth)
    faded = _yolov5_head([*truth[:3], (60, 60, 10, 10, 0.2, 0)])  # 0.4 x 0.9 -> 0.2 x 0.9: under 0.25
    missed = _yolov5_head(truth[1:])  # a confident detection gone
    invented = _yolov5_head([*truth, (90, 90, 8, 8, 0.95, 1)])  # a confident one that fp32 does not make

    def judged(candidate: np.ndarray) -> dict:
        return compare([{"out": reference}], [{"out": candidate}], None, "detection", 1.0)["outputs"]["out"]

    assert judged(reference)["detection_ap"] == 1.0
    across = judged(faded)
    assert across["detection_ap"] == 1.0 and across["within_budget"]  # still found, ranked last
    assert across["detections_matched"] == 3  # at the threshold, a count would have lost it
    assert judged(missed)["detection_ap"] == pytest.approx(0.75) and not judged(missed)["within_budget"]
    assert judged(invented)["detection_ap"] < 0.99 and not judged(invented)["within_budget"]


def test_heads_without_decoded_boxes_or_detections_keep_the_relative_error():
    grid_offsets = np.random.default_rng(1).normal(0, 1, (2, 3549, 6)).astype(np.float32)  # YOLOX before its decoder
    assert output_metric("output", grid_offsets)[0] == "relerr"
    background = _yolov5_head([])  # a head that found nothing: nothing to agree on
    assert output_metric("output", background)[0] == "relerr"
    with pytest.raises(InputError, match="not a detector head"):
        compare([{"output": background}], [{"output": background}], None, "detection", 1.0)
