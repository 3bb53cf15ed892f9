"""Shapes every way a model declares them: -1 and unnamed dims, dynamic H/W that only some sizes
fit, --input-shape on ONNX, static output dims, and the stop before any work when nothing sizes
a dynamic dim (the failure classes of real models nobody here wrote)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from console import assert_one_line_error, deploy
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import unideploy
from unideploy.errors import InputError

IR_VERSION = 9


def _dim_proto(value) -> onnx.TensorShapeProto.Dimension:
    dim = onnx.TensorShapeProto.Dimension()
    if isinstance(value, int):
        dim.dim_value = value  # -1 and 0 are what some exporters write for "unknown"
    elif value is not None:
        dim.dim_param = value
    return dim


def _value(name: str, dims: list) -> onnx.ValueInfoProto:
    info = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    shape = info.type.tensor_type.shape
    shape.dim.extend(_dim_proto(d) for d in dims)
    return info


def _two_branch_detector(path, in_dims: list, out_dims: list) -> None:
    """A YOLO-like head: stride-2 and stride-4 branches, upsampled and concatenated across
    branches, so only sizes divisible by 4 run (8 does, 6 does not), like a real detector's 32."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, "w2")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [
        helper.make_node("Conv", ["images", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c2", "", "scales"], ["up"], mode="nearest"),
        helper.make_node("Concat", ["r1", "up"], ["cat"], axis=1),
        helper.make_node("Sigmoid", ["cat"], ["boxes"]),
    ]
    graph = helper.make_graph(
        nodes, "detector", [_value("images", in_dims)], [_value("boxes", out_dims)], [w1, w2, scales]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), str(path))


def test_dims_declared_minus_one_are_dynamic_and_sized_by_input_shape(tmp_path):
    _two_branch_detector(tmp_path / "det.onnx", [-1, 3, -1, -1], [-1, 8, -1, -1])
    with unideploy.export(
        tmp_path / "det.onnx", tmp_path / "pkg", input_shapes=["images:1,3,height=16,width=24"]
    ) as package:
        sig = package.manifest.signature
        assert sig.inputs[0].shape == ("batch", 3, "height", "width")
        assert sig.outputs[0].shape == ("batch", 8, "boxes_dim2", "boxes_dim3")
        shapes = sorted(s.inputs["images"].shape for s in package.reference_samples())
        assert shapes == [(1, 3, 16, 24), (4, 3, 8, 16)]  # two batch sizes, and two values of H and W
        assert package.manifest.validation["onnx-fp32"]["passed"]
    declared = onnx.load(str(tmp_path / "pkg" / "artifacts" / "model.onnx")).graph.input[0]
    assert [d.dim_param or d.dim_value for d in declared.type.tensor_type.shape.dim] == ["batch", 3, "height", "width"]


def test_unnamed_dims_stop_the_export_with_the_option_to_pass(tmp_path):
    _two_branch_detector(tmp_path / "det.onnx", ["N", 3, None, "?"], ["N", 8, None, None])
    with pytest.raises(InputError) as caught:
        unideploy.export(tmp_path / "det.onnx", tmp_path / "pkg")
    message = str(caught.value)
    assert "height (axis 2 of 'images')" in message and "width (axis 3 of 'images')" in message
    assert "--input-shape images:1,3,height=SIZE,width=SIZE" in message
    assert not (tmp_path / "pkg").exists()


def test_plain_sizes_fix_dynamic_dims_of_an_onnx_model(tmp_path):
    _two_branch_detector(tmp_path / "det.onnx", ["N", 3, "H", "W"], ["N", 8, "H2", "W2"])
    result = deploy(
        "export", str(tmp_path / "det.onnx"), "-o", str(tmp_path / "pkg"), "--input-shape", "images:1x3x32x32", "--json"
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert manifest["signature"]["inputs"][0]["shape"] == ["N", 3, 32, 32]  # the model's own batch name
    assert manifest["signature"]["outputs"][0]["shape"] == ["N", 8, 16, 16]  # static, from the runs
    model = onnx.load(str(tmp_path / "pkg" / "artifacts" / "model.onnx"))
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:] == [3, 32, 32]


def test_sizes_the_model_cannot_take_fail_validation_not_internally(tmp_path):
    _two_branch_detector(tmp_path / "det.onnx", ["N", 3, "H", "W"], ["N", 8, "H", "W"])
    result = deploy(
        "export", str(tmp_path / "det.onnx"), "-o", str(tmp_path / "pkg"), "--input-shape", "images:1x3x6x6"
    )
    assert result.returncode in (1, 2) and "internal error" not in result.stderr, result.stderr
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize(
    "shape, pattern",
    [
        ("images:1x3x32", "gives 'images' 3 dims, but the model declares rank 4"),
        ("images:1x4x32x32", "axis 1 of 'images' is fixed at 3 in the model; --input-shape gives 4"),
        ("pixels:1x3x32x32", "names 'pixels', which the model does not take"),
    ],
)
def test_input_shape_that_contradicts_the_model_is_refused(tmp_path, shape, pattern):
    _two_branch_detector(tmp_path / "det.onnx", ["N", 3, "H", "W"], ["N", 8, "H", "W"])
    result = deploy("export", str(tmp_path / "det.onnx"), "-o", str(tmp_path / "pkg"), "--input-shape", shape)
    assert_one_line_error(result, 2, pattern)


def test_example_input_sizes_dynamic_dims_and_is_cropped_for_the_second_run(tmp_path):
    _two_branch_detector(tmp_path / "det.onnx", ["N", 3, "H", "W"], ["N", 8, "H", "W"])
    example = {"images": np.random.default_rng(1).standard_normal((2, 3, 40, 48)).astype(np.float32)}
    with unideploy.export(tmp_path / "det.onnx", tmp_path / "pkg", example_inputs=example) as package:
        shapes = sorted(s.inputs["images"].shape for s in package.reference_samples())
        assert shapes == [(1, 3, 32, 40), (2, 3, 40, 48)]
        assert package.manifest.signature.inputs[0].shape == ("N", 3, "H", "W")  # the model's own names


def test_ultralytics_image_size_metadata_sizes_height_and_width(tmp_path):
    _two_branch_detector(tmp_path / "det.onnx", ["batch", 3, "height", "width"], ["batch", 8, "h2", "w2"])
    model = onnx.load(str(tmp_path / "det.onnx"))
    helper.set_model_props(model, {"imgsz": "[64, 96]", "task": "detect"})
    onnx.save(model, str(tmp_path / "det.onnx"))
    with unideploy.export(tmp_path / "det.onnx", tmp_path / "pkg") as package:
        assert sorted(s.inputs["images"].shape for s in package.reference_samples()) == [(1, 3, 64, 96), (4, 3, 32, 64)]
        assert package.manifest.signature.outputs[0].shape == ("batch", 8, "h2", "w2")  # its own names


class MeanPooledEncoder(nn.Module):
    """Token embeddings mean-pooled under a mask: a fixed-width embedding from a dynamic sequence,
    which the legacy exporter declares as [batch, Divoutput_dim_1]."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.proj = nn.Linear(24, 24)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.proj(self.embed(ids)))
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def test_static_output_dim_stays_static_after_torchscript_export(tmp_path):
    ids = torch.randint(0, 50, (2, 12))
    torch.jit.save(torch.jit.trace(MeanPooledEncoder().eval(), (ids, torch.ones_like(ids))), str(tmp_path / "enc.pt"))
    with unideploy.export(
        tmp_path / "enc.pt", tmp_path / "pkg", input_shapes=["ids:1,seq=16:int64", "mask:1,seq=16:int64"]
    ) as package:
        assert package.manifest.signature.outputs[0].shape == ("batch", 24)
        assert sorted(s.inputs["ids"].shape for s in package.reference_samples()) == [(1, 16), (4, 8)]


def test_an_output_declared_with_the_wrong_rank_takes_the_dims_it_computes(tmp_path):
    """ddddocr's recognizer declares its output [1, seqlen] and returns [seq, batch, classes]: the
    signature (what servers publish as model metadata) says what the model computes."""
    _two_branch_detector(tmp_path / "det.onnx", [-1, 3, -1, -1], [1, "seqlen"])
    with unideploy.export(
        tmp_path / "det.onnx", tmp_path / "det.udp", input_shapes=["images:1x3xheight=16xwidth=32"]
    ) as pkg:
        (boxes,) = pkg.manifest.signature.outputs
        assert boxes.shape == ("batch", 8, "boxes_dim2", "boxes_dim3")  # half the input's height and width
