"""TorchScript export on real models: every path, dynamic batch, control flow, failures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import unideploy
from unideploy.errors import ExportError, InputError

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

ROUND_TRIP = [
    "cnn_scripted",
    "cnn_traced",
    "attention_scripted",
    "attention_traced",
    "tokens_traced",
    "control_flow_scripted",
]


def _inputs_like(package, batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for spec in package.manifest.signature.inputs:
        shape = [batch if i == 0 else (d if isinstance(d, int) else 6) for i, d in enumerate(spec.shape)]
        out[spec.name] = (rng.integers(0, 50, shape) if spec.dtype == "int64" else rng.standard_normal(shape)).astype(
            spec.dtype
        )
    return out


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_export_matches_torch_at_a_new_batch_size(name, torch_models, tmp_path):
    path, shapes = torch_models[name]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes) as package:
        record = package.manifest.validation["onnx-fp32"]
        assert record["passed"] and record["batch_sizes"] == [1, 4]
        assert package.manifest.source["conversion_path"].startswith("torch.onnx legacy")
        assert all(spec.shape[0] == "batch" for spec in package.manifest.signature.inputs)
        inputs = _inputs_like(package, batch=7, seed=1)
        got = unideploy.run(package, inputs)
    module = torch.jit.load(str(path))
    with torch.no_grad():
        expected = module(*(torch.from_numpy(inputs[s.split(":")[0]]) for s in shapes))
    expected = expected if isinstance(expected, tuple) else (expected,)
    for value, reference in zip(got.values(), expected):
        np.testing.assert_allclose(value, reference.numpy(), atol=1e-4, rtol=1e-3)


def test_layout_is_recorded_where_onnx_defines_it(torch_models, tmp_path):
    for name, layout in (("cnn_traced", "NCHW"), ("attention_traced", None)):
        path, shapes = torch_models[name]
        with unideploy.export(path, tmp_path / name, input_shapes=shapes) as package:
            assert package.manifest.signature.inputs[0].layout == layout


def test_named_dynamic_dimension_accepts_other_lengths(torch_models, tmp_path):
    path, shapes = torch_models["tokens_traced"]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes) as package:
        ids = package.manifest.signature.inputs[0]
        assert ids.dtype == "int64" and ids.shape == ("batch", "seq")
        logits = unideploy.run(package, {"input_ids": np.ones((3, 11), np.int64), "mask": np.ones((3, 11), np.float32)})
    assert logits["output_0"].shape == (3, 3) and logits["output_1"].shape == (3, 16)


def test_single_input_takes_the_users_name(tmp_path):
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2)))  # forward(self, input)
    torch.jit.save(module, str(tmp_path / "seq.pt"))
    with unideploy.export(tmp_path / "seq.pt", tmp_path / "pkg", input_shapes=["features:3x4"]) as package:
        assert package.manifest.signature.input_names == ["features"]


def test_control_flow_is_kept_as_onnx_if_and_loop(torch_models, tmp_path):
    path, shapes = torch_models["control_flow_scripted"]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes) as package:
        ops = {n.op_type for n in onnx.load(str(package.path_of("onnx-fp32"))).graph.node}
        assert {"If", "Loop"} <= ops
        small, large = np.full((1, 3), 0.1, np.float32), np.full((1, 3), 9.0, np.float32)
        # 0.1 -> *2 = 0.2, no halving; 9.0 -> *2 = 18 -> halved 5 times = 0.5625, +5 steps
        np.testing.assert_allclose(unideploy.run(package, {"x": small})["output"], 0.2, rtol=1e-6)
        np.testing.assert_allclose(unideploy.run(package, {"x": large})["output"], 5.5625, rtol=1e-6)


def test_traced_multihead_attention_falls_back_to_torch_export(torch_models, tmp_path):
    path, shapes = torch_models["mha_traced"]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes) as package:
        assert package.manifest.source["conversion_path"] == "TS2EP + torch.export (dynamo)"
        spec = package.manifest.signature.inputs[0]
        assert spec.shape == ("batch", 5, 16)  # constant dims pinned, batch kept dynamic
        assert package.manifest.validation["onnx-fp32"]["passed"]
        assert unideploy.run(package, {"x": np.zeros((6, 5, 16), np.float32)})["output"].shape == (6, 5, 16)


def test_static_shapes_fix_the_batch(torch_models, tmp_path):
    path, shapes = torch_models["cnn_scripted"]
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes, static_shapes=True) as package:
        assert package.manifest.signature.inputs[0].shape == (2, 1, 8, 8)
        assert package.manifest.validation["onnx-fp32"]["batch_sizes"] == [2]
        with pytest.raises(InputError, match="size 3 on axis 0, expected 2"):
            unideploy.run(package, {"x": np.zeros((3, 1, 8, 8), np.float32)})


def test_example_inputs_become_the_reference_samples(torch_models, tmp_path):
    path, _ = torch_models["cnn_scripted"]
    example = {"x": np.random.default_rng(3).standard_normal((3, 1, 8, 8)).astype(np.float32)}
    with unideploy.export(path, tmp_path / "pkg", example_inputs=example) as package:
        samples = package.reference_samples()
        assert [s.batch_size for s in samples] == [1, 3]
        np.testing.assert_array_equal(samples[1].inputs["x"], example["x"])


def test_unsupported_operator_is_named(torch_models, tmp_path):
    path, shapes = torch_models["histc_traced"]
    with pytest.raises(ExportError, match=r"operator aten::histc"):
        unideploy.export(path, tmp_path / "pkg", input_shapes=shapes)
    assert list(tmp_path.iterdir()) == []


def test_missing_shapes_and_wrong_names_are_explained(torch_models, tmp_path):
    path, _ = torch_models["cnn_scripted"]
    with pytest.raises(InputError, match="carry no input shapes"):
        unideploy.export(path, tmp_path / "a")
    tokens, _shapes = torch_models["tokens_traced"]
    with pytest.raises(InputError, match="forward\\(\\) takes input_ids, mask"):
        unideploy.export(tokens, tmp_path / "b", input_shapes=["ids:1x6:int64", "mask:1x6"])
    with pytest.raises(InputError, match="bad dimension"):
        unideploy.export(path, tmp_path / "c", input_shapes=["x:1x1x8xq"])
    assert list(tmp_path.iterdir()) == []


def test_tolerance_failure_reports_per_output_error_and_writes_nothing(torch_models, tmp_path):
    from unideploy.errors import ValidationError

    path, shapes = torch_models["attention_traced"]
    with pytest.raises(ValidationError, match=r"output: max abs [0-9.e-]+, max rel [0-9.e-]+, \d+ values off"):
        unideploy.export(path, tmp_path / "pkg", input_shapes=shapes, atol=0.0, rtol=0.0)
    assert list(tmp_path.iterdir()) == []


def test_not_torchscript_is_refused(tmp_path):
    bogus = tmp_path / "model.pt"
    bogus.write_bytes(b"not a model")
    with pytest.raises(InputError, match="cannot tell what kind of model"):
        unideploy.export(bogus, tmp_path / "pkg")
    with pytest.raises(InputError, match="cannot be loaded as TorchScript"):
        unideploy.export(bogus, tmp_path / "pkg", exporter="torchscript", input_shapes=["x:1x2"])


class SmallNet(torch.nn.Module):
    """A module pickled whole by torch.save (its class is importable from this test file)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, x):
        return self.fc(self.conv1(x).mean((2, 3)))


def test_torch_save_files_are_named_with_the_way_to_convert_them(tmp_path):
    """torch.save of a state_dict (weights only) and of a whole module: each refused with what the
    file is and the line that makes a file we take, read without unpickling it (the pickle names a
    class defined here, which a load would import and run)."""
    net = SmallNet()
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    torch.save(net, tmp_path / "whole.pt")
    with pytest.raises(
        InputError, match=r"state_dict: weights only \(4 weight and bias tensors, such as 'conv1.weight'"
    ) as weights:
        unideploy.export(tmp_path / "weights.pt", tmp_path / "pkg")
    assert "model.load_state_dict(torch.load(PATH))" in str(weights.value) and "torch.jit.script" in str(weights.value)
    with pytest.raises(InputError, match=r"pickled PyTorch module \(.*SmallNet\).*runs the code") as whole:
        unideploy.export(tmp_path / "whole.pt", tmp_path / "pkg")
    assert "weights_only=False" in str(whole.value)
    assert not (tmp_path / "pkg").exists()
    # what the scripted module saves is taken
    torch.jit.script(net).save(tmp_path / "scripted.pt")
    unideploy.export(tmp_path / "scripted.pt", tmp_path / "pkg", input_shapes=["x:1x1x8x8"]).close()


def test_a_non_tensor_argument_is_bound_with_constant_and_recorded(tmp_path):
    """`forward(audio, sample_rate: int)`: refused without a value (naming the flag), exported with
    --constant sample_rate=16000 (the 16 kHz branch, checked against the module at that rate), the
    value recorded in the manifest; an argument forward() does not have, and --constant on a source
    that has no such arguments, are refused."""
    from console import assert_one_line_error, deploy
    from models import Framer, check_framer_package

    scripted = tmp_path / "framer.pt"
    torch.jit.save(torch.jit.script(Framer().eval()), str(scripted))
    audio = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    np.savez(tmp_path / "audio.npz", audio=audio)
    args = ["export", scripted, "--example-input", tmp_path / "audio.npz"]

    refused = deploy(*args, "-o", tmp_path / "none.udp")
    assert_one_line_error(refused, 2, r"forward\(\) argument 'sample_rate' has type int.*--constant sample_rate=VALUE")
    result = deploy(*args, "-o", tmp_path / "vad.udp", "--constant", "sample_rate=16000")
    assert result.returncode == 0, result.stderr
    expected = torch.jit.load(str(scripted))(torch.from_numpy(audio), 16000).detach().numpy()
    check_framer_package(tmp_path / "vad.udp", audio, expected)

    unknown = deploy(*args, "-o", tmp_path / "x.udp", "--constant", "sample_rate=16000", "--constant", "hop=4")
    assert_one_line_error(unknown, 2, r"--constant hop: forward\(\) has no such non-tensor argument")
    onnx_source = tmp_path / "vad.udp" / "artifacts" / "model.onnx"  # an ONNX file binds its own inputs only
    other = deploy("export", onnx_source, "-o", tmp_path / "y.udp", "--constant", "sample_rate=16000")
    assert_one_line_error(other, 2, r"--constant sample_rate: the model has no such input \(its inputs: audio\)")


class _Step(torch.nn.Module):
    """One step of a GRU that takes its state and gives it back: state [layers, batch, hidden]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.rnn = torch.nn.GRU(4, 8, num_layers=2)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, new_state = self.rnn(x.unsqueeze(0), state)
        return out.squeeze(0), new_state


class _Streaming(torch.nn.Module):
    """The same step keeping its state between calls, as a streaming wrapper does."""

    def __init__(self) -> None:
        super().__init__()
        self.step = _Step()
        self._state = torch.zeros(2, 1, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, state = self.step(x, self._state)
        self._state = state
        return out


def test_recurrent_state_with_its_batch_on_axis_1_is_exported_at_two_batch_sizes(tmp_path):
    """--input-shape state:2,batch=1,8 puts the batch on axis 1: axis 0 (the layers) stays 2, and
    the source is run and checked at batch 1 and 4 (axis 0 was also made a batch axis, and the
    source failed on the state it was given)."""
    torch.jit.save(torch.jit.script(_Step()), str(tmp_path / "step.pt"))
    shapes = ["x:batch=1,4", "state:2,batch=1,8"]
    with unideploy.export(tmp_path / "step.pt", tmp_path / "pkg", input_shapes=shapes) as package:
        signature = package.manifest.signature
        assert [t.shape for t in signature.inputs] == [("batch", 4), (2, "batch", 8)]
        assert signature.outputs[1].shape == (2, "batch", 8)
        assert sorted(s.batch_size for s in package.manifest.samples) == [1, 4]
        state = np.zeros((2, 3, 8), np.float32)
        out = unideploy.run(package, {"x": np.ones((3, 4), np.float32), "state": state})
    assert out["output_1"].shape == (2, 3, 8)


def test_a_module_that_keeps_state_between_calls_is_refused_naming_it(tmp_path):
    from console import assert_one_line_error, deploy

    torch.jit.save(torch.jit.script(_Streaming()), str(tmp_path / "streaming.pt"))
    result = deploy("export", tmp_path / "streaming.pt", "-o", tmp_path / "pkg", "--input-shape", "x:1x4")
    assert_one_line_error(result, 2, r"'streaming.pt' changes its own attributes when it runs \(_state\)")
    assert "one of its submodules, step: torch.jit.save(module.NAME, path)" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_a_stream_example_is_traced_from_the_initial_state_and_refers_to_the_state_the_source_carries(
    zoo_models, tmp_path
):
    """Silero VAD's 16 kHz model (its TorchScript, from the silero-vad package) given a stream as
    --example-input: its chunks without the LSTM state --state names. The trace takes the state at
    its initial value; the reference rows each get the state the source carried to them, so the
    package run over the same chunks as one stream answers as they say."""
    from console import deploy

    source = zoo_models.silero_vad_16k(tmp_path)
    t = np.arange(12 * 576) / 16000
    chunks = (0.3 * np.sin(2 * np.pi * 220 * t) * (t > 0.2)).astype(np.float32).reshape(12, 576)
    np.savez(tmp_path / "stream.npz", x=chunks)
    made = deploy(
        "export",
        source,
        "-o",
        tmp_path / "pkg",
        *("--input-shape", "x:batch=1,576", "--input-shape", "state:2,batch=1,128", "--state", "state=output_1"),
        *("--example-input", tmp_path / "stream.npz"),
    )
    assert made.returncode == 0, made.stderr
    with unideploy.open_package(tmp_path / "pkg") as package:
        sample = max(package.reference_samples(), key=lambda s: s.batch_size)
    assert sample.batch_size == 12
    assert not sample.inputs["state"][:, 0].any() and sample.inputs["state"][:, 1:].any()
    streamed = unideploy.run(tmp_path / "pkg", {"x": chunks})
    np.testing.assert_allclose(streamed["output_0"], sample.outputs["output_0"], atol=1e-5)
