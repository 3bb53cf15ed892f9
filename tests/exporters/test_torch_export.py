"""PyTorch 2 programs (.pt2): signature and sizes from the program itself, validation against it,
and the same CLI as every source."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from console import assert_one_line_error, deploy
from models import AttentionBlock, Framer, SmallCNN, check_framer_package

import unideploy
from unideploy.errors import InputError


def _save(model: torch.nn.Module, args: tuple, path, dynamic=None) -> None:
    torch.export.save(torch.export.export(model.eval(), args, dynamic_shapes=dynamic), str(path))


def test_cnn_program_with_dynamic_batch_round_trips(tmp_path):
    _save(
        SmallCNN(),
        (torch.randn(2, 1, 8, 8),),
        tmp_path / "cnn.pt2",
        {"x": {0: torch.export.Dim("batch", min=1, max=64)}},
    )
    result = deploy("export", tmp_path / "cnn.pt2", "-o", tmp_path / "pkg", "--json")
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    assert manifest["source"]["exporter"] == "torch-export" and manifest["source"]["framework"] == "torch"
    assert manifest["signature"]["inputs"][0]["shape"] == ["batch", 1, 8, 8]
    assert manifest["validation"]["onnx-fp32"]["passed"] and manifest["validation"]["onnx-fp32"]["batch_sizes"] == [
        1,
        4,
    ]
    x = np.random.default_rng(0).standard_normal((5, 1, 8, 8)).astype(np.float32)
    expected = torch.export.load(str(tmp_path / "cnn.pt2")).module()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(unideploy.run(tmp_path / "pkg", {"x": x})["output"], expected, atol=1e-4, rtol=1e-3)


def test_attention_program_with_dynamic_sequence_is_validated_at_two_lengths(tmp_path):
    seq = torch.export.Dim("seq", min=2, max=64)
    _save(
        AttentionBlock(),
        (torch.randn(2, 16, 16),),
        tmp_path / "attn.pt2",
        {"x": {0: torch.export.Dim("batch", min=1, max=64), 1: seq}},
    )
    with unideploy.export(tmp_path / "attn.pt2", tmp_path / "pkg") as package:
        spec = package.manifest.signature.inputs[0]
        assert spec.shape[0] == "batch" and isinstance(spec.shape[1], str) and spec.shape[2] == 16
        assert sorted(s.inputs["x"].shape for s in package.reference_samples()) == [(1, 16, 16), (4, 8, 16)]
        assert package.manifest.validation["onnx-fp32"]["passed"]


def test_static_program_keeps_its_batch_and_refuses_other_sizes(tmp_path):
    _save(SmallCNN(), (torch.randn(1, 1, 8, 8),), tmp_path / "cnn.pt2")
    with unideploy.export(tmp_path / "cnn.pt2", tmp_path / "pkg") as package:
        assert package.manifest.signature.inputs[0].shape == (1, 1, 8, 8)
    result = deploy("export", tmp_path / "cnn.pt2", "-o", tmp_path / "other", "--input-shape", "x:1x1x16x16")
    assert_one_line_error(result, 2, "axis 2 of 'x' is fixed at 8 in the model")


def test_file_that_is_not_a_program_is_refused(tmp_path):
    (tmp_path / "bad.pt2").write_bytes(b"not a zip at all")
    with pytest.raises(InputError, match="cannot tell what kind of model"):
        unideploy.export(tmp_path / "bad.pt2", tmp_path / "pkg")
    result = deploy("export", tmp_path / "bad.pt2", "-o", tmp_path / "pkg", "--exporter", "torch-export")
    assert_one_line_error(result, 2, "cannot be loaded as a torch.export program")


def test_a_non_tensor_argument_fixed_by_torch_export_is_confirmed_with_constant(tmp_path):
    """`forward(audio, sample_rate: int)` through torch.export: the program answers only for the
    rate it was exported with. Without --constant the refusal names the flag and that value;
    another value is refused saying why; the right one exports, is recorded in the manifest and
    runs the 16 kHz branch (it was refused as "not a tensor", while the hint said to leave
    --constant out)."""
    audio = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Framer().eval(), (torch.from_numpy(audio), 16000), dynamic_shapes=({0: batch}, None))
    torch.export.save(program, str(tmp_path / "framer.pt2"))
    args = ["export", tmp_path / "framer.pt2"]

    refused = deploy(*args, "-o", tmp_path / "none.udp")
    assert_one_line_error(
        refused, 2, r"'sample_rate' is not a tensor: torch.export fixed it at 16000.*--constant sample_rate=16000"
    )
    other = deploy(*args, "-o", tmp_path / "other.udp", "--constant", "sample_rate=8000")
    assert_one_line_error(other, 2, r"--constant sample_rate=8000, but torch.export fixed 'sample_rate' at 16000")
    made = deploy(*args, "-o", tmp_path / "vad.udp", "--constant", "sample_rate=16000")
    assert made.returncode == 0, made.stderr
    check_framer_package(tmp_path / "vad.udp", audio, program.module()(torch.from_numpy(audio), 16000).detach().numpy())
