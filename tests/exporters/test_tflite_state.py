"""A streaming .tflite's resource variables become inputs and outputs: the ONNX artifact, its state fed
back call after call, answers as the stateful model does on LiteRT."""

from __future__ import annotations

import os

import numpy as np
import pytest
from console import deploy

import unideploy
from unideploy.signature import StateSpec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
pytest.importorskip("tf2onnx", reason="the tflite extra is not installed")
litert = pytest.importorskip("ai_edge_litert.interpreter", reason="the tflite extra is not installed")


def _running_average(path) -> None:
    """state <- 0.5 state + x, answer 2 state: a .tflite with VAR_HANDLE, READ_VARIABLE,
    ASSIGN_VARIABLE and CALL_ONCE, as TensorFlow's converter writes a Keras streaming layer."""

    class Stream(tf.Module):
        def __init__(self) -> None:
            self.state = tf.Variable(tf.fill([1, 4], 0.25), name="stream/states")

        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def __call__(self, x):
            self.state.assign(0.5 * self.state + x)
            return {"y": 2.0 * self.state}

    stream = Stream()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([stream.__call__.get_concrete_function()], stream)
    converter.experimental_enable_resource_variables = True
    path.write_bytes(converter.convert())


def _streamed(package, inputs: list[dict[str, np.ndarray]], state: dict[str, np.ndarray]) -> list[dict]:
    """The package's answers call by call, each call's ``*_next`` outputs fed back."""
    answers = []
    for row in inputs:
        got = unideploy.run(package, {**row, **state})
        state = {name: got[name + "_next"] for name in state}
        answers.append(got)
    return answers


def test_a_stateful_model_takes_its_state_as_inputs_and_gives_the_next_as_outputs(tmp_path):
    source = tmp_path / "stream.tflite"
    _running_average(source)
    interpreter = litert.Interpreter(model_path=str(source))
    ops = {op["op_name"] for op in interpreter._get_ops_details()}
    assert {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE"} <= ops
    made = deploy("export", source, "-o", tmp_path / "pkg")
    assert made.returncode == 0, made.stdout + made.stderr
    rows = [{"x": np.random.default_rng(i).standard_normal((1, 4)).astype(np.float32)} for i in range(4)]
    with unideploy.open_package(tmp_path / "pkg") as package:
        signature = package.manifest.signature
        state_name = next(name for name in signature.input_names if name != "x")
        assert state_name == "stream_states" and set(signature.output_names) == {"y", "stream_states_next"}
        assert "1 resource variables (streaming state)" in package.manifest.source["conversion_path"]
        assert "(all 0.25)" in package.manifest.source["conversion_path"]  # where the caller starts
        assert signature.state == (StateSpec("stream_states", "stream_states_next", 0.25),)
        answers = _streamed(package, rows, {state_name: np.full((1, 4), 0.25, np.float32)})
        # given the rows alone, a run carries the recorded state over them itself
        streamed = unideploy.run(package, {"x": np.concatenate([row["x"] for row in rows])})
    runner = interpreter.get_signature_runner()
    expected = [runner(x=row["x"])["y"] for row in rows]  # the source keeps its state itself
    for got, want in zip(answers, expected):
        np.testing.assert_allclose(got["y"], want, rtol=1e-6)
    np.testing.assert_allclose(streamed["y"], np.concatenate(expected), rtol=1e-6)
    np.testing.assert_allclose(streamed["stream_states_next"], answers[-1]["stream_states_next"], rtol=1e-6)


def test_micro_wake_word_hears_okay_nabu_through_onnx_as_through_litert(zoo_models, tmp_path):
    """microWakeWord's "Okay Nabu" detector as pymicro-wakeword ships it (int8, six streaming
    buffers of past audio features in resource variables, which tf2onnx stopped on with "list index
    out of range"), on eSpeak NG's voice saying it between other phrases, through the features
    ESPHome computes: the probabilities within two uint8 steps of LiteRT's on average, and the
    detector hears the phrase at the same calls (the mean of 5 calls rising over its 0.85 cutoff).
    For the edge target its TFLite artifact is the source with the same state inputs and outputs."""
    source = zoo_models.shipped(zoo_models.MICRO_WAKE_WORD)
    made = deploy("export", source, "-o", tmp_path / "pkg", "--target", "edge")
    assert made.returncode == 0, made.stdout + made.stderr
    verified = deploy("verify", tmp_path / "pkg")  # the edge's TFLite: the source with the same state inputs
    assert verified.returncode == 0, verified.stdout + verified.stderr
    interpreter = litert.Interpreter(model_path=str(source))
    interpreter.allocate_tensors()
    (audio_in,), (score_out,) = interpreter.get_input_details(), interpreter.get_output_details()
    audio = zoo_models.spoken(["Okay Nabu.", "Turn on the kitchen lights.", "Hey Jarvis.", "Okay, Nabu!"])
    windows = zoo_models.wake_word_windows(audio, *audio_in["quantization"])
    expected = []
    for window in windows:
        interpreter.set_tensor(audio_in["index"], window)
        interpreter.invoke()
        expected.append(int(interpreter.get_tensor(score_out["index"])[0, 0]))
    with unideploy.open_package(tmp_path / "pkg") as package:
        signature = package.manifest.signature
        assert "tflite-int8" in {artifact.id for artifact in package.manifest.artifacts}
        assert len(signature.input_names) == 7 and package.manifest.source["conversion_path"].endswith(
            "(all -128))"
        )  # six int8 buffers, each starting at its zero point: silence, recorded as the state's start
        assert [(s.input, s.output, s.initial) for s in signature.state] == [
            (name, name + "_next", -128.0) for name in signature.input_names[1:]
        ]
        answers = unideploy.run(package, {"input_audio": np.concatenate(windows)})  # one stream, state carried
    got, expected = answers["dense_1"][:, 0].astype(int), np.array(expected)
    # int8 kernels round their own way (LiteRT's fixed-point multipliers, ONNX Runtime's float scales):
    # measured 1.5 steps on average, 18 at most where the score crosses its cutoff (the state matched exactly)
    assert np.abs(got - expected).mean() <= 2

    def detections(scores: np.ndarray) -> np.ndarray:  # the calls where the mean of 5 rises over 0.85
        fired = np.convolve(scores / 256, np.ones(5) / 5, "valid") > 0.85
        return np.flatnonzero(fired[1:] & ~fired[:-1]) + 1

    heard = detections(expected)
    assert len(heard) == 2 and len(detections(got)) == 2  # "Okay Nabu", not "Hey Jarvis"
    assert np.abs(detections(got) - heard).max() <= 1


def test_a_variable_read_and_never_written_is_refused_naming_it(tmp_path):
    """The running average with its ASSIGN_VARIABLE taken out: the variable is read and never
    written, a state only a stateful runtime could keep; refused naming it, nothing written."""
    from tensorflow.lite.python import schema_py_generated as schema
    from tensorflow.lite.tools import flatbuffer_utils

    source = tmp_path / "stream.tflite"
    _running_average(source)
    model = flatbuffer_utils.read_model(str(source))
    assign = {
        i for i, code in enumerate(model.operatorCodes) if code.builtinCode == schema.BuiltinOperator.ASSIGN_VARIABLE
    }
    main = model.subgraphs[0]
    main.operators = [op for op in main.operators if op.opcodeIndex not in assign]
    flatbuffer_utils.write_model(model, str(tmp_path / "read-only.tflite"))
    made = deploy("export", tmp_path / "read-only.tflite", "-o", tmp_path / "pkg")
    assert made.returncode != 0 and "stream/states" in made.stderr and "not both read and written" in made.stderr
    assert not (tmp_path / "pkg").exists()
