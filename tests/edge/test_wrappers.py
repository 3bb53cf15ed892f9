"""Generated Kotlin and Swift for signatures the bundle tests' CNNs do not reach (several inputs,
integer tensors, named dynamic dimensions, awkward names), checked by the tree-sitter parsers."""

from __future__ import annotations

import pytest

from unideploy.edge.codegen import kotlin, swift
from unideploy.edge.codegen.wrapped import identifier, type_name, wrapped
from unideploy.errors import InputError
from unideploy.signature import Signature, StateSpec, TensorSpec

pytest.importorskip("tree_sitter_kotlin", reason="the bundle extra is not installed")
pytest.importorskip("tree_sitter_swift", reason="the bundle extra is not installed")
from unideploy.edge.codegen.check import syntax_errors

TEXT = Signature(
    (
        TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("attention-mask", "int64", ("batch", "seq")),
        TensorSpec("in", "uint8", (1, 3)),
    ),
    (TensorSpec("last_hidden_state", "float32", ("batch", "seq", 384)), TensorSpec("pooled", "int32", ("batch",))),
)


# Silero VAD's layout (LSTM state [2, batch, 128]) beside a wake-word buffer of int8 starting at -128
STREAM = Signature(
    (
        TensorSpec("input", "float32", ("batch", 576)),
        TensorSpec("state", "float32", (2, "batch", 128)),
        TensorSpec("stream_6_states", "int8", (1, 2, 1, 40)),
    ),
    (
        TensorSpec("output", "float32", ("batch", 1)),
        TensorSpec("stateN", "float32", (2, "batch", 128)),
        TensorSpec("stream_6_states_next", "int8", (1, 2, 1, 40)),
    ),
).with_state((StateSpec("state", "stateN"), StateSpec("stream_6_states", "stream_6_states_next", -128)))


def sources() -> dict[str, tuple[str, str]]:
    tfl = wrapped(
        "MiniLM-L6",
        "tflite",
        "model.int8.tflite",
        TEXT,
        {"output_0": "last_hidden_state", "output_1": "pooled"},
        "serving_default",
    )
    ort = wrapped("MiniLM-L6", "onnxruntime", "model.ort", TEXT)
    return {
        "Outputs.kt": (kotlin.outputs_class(tfl, "ai.example"), "kotlin"),
        "Tflite.kt": (kotlin.tflite_class(tfl, "ai.example"), "kotlin"),
        "Ort.kt": (kotlin.ort_class(ort, "ai.example"), "kotlin"),
        "Outputs.swift": (swift.outputs_struct(tfl), "swift"),
        "Tflite.swift": (swift.tflite_class(tfl), "swift"),
        "Ort.swift": (swift.ort_class(ort), "swift"),
        "StreamTflite.kt": (kotlin.tflite_class(_stream("tflite"), "ai.example"), "kotlin"),
        "StreamOrt.kt": (kotlin.ort_class(_stream("onnxruntime"), "ai.example"), "kotlin"),
        "StreamTflite.swift": (swift.tflite_class(_stream("tflite")), "swift"),
        "StreamOrt.swift": (swift.ort_class(_stream("onnxruntime")), "swift"),
    }


def _stream(runtime: str):
    return wrapped("silero-vad", runtime, "model.tflite", STREAM, None, "serving_default")


@pytest.mark.parametrize("name", list(sources()))
def test_generated_source_parses(name):
    text, language = sources()[name]
    assert syntax_errors(text, language) == []


def test_wrappers_take_typed_arrays_and_one_parameter_per_dynamic_dimension():
    code = sources()
    signature = "inputIds: LongArray, attentionMask: LongArray, inValue: ByteArray, batch: Int, seq: Int"
    assert f"fun run({signature}): MiniLML6Outputs" in code["Tflite.kt"][0]
    assert f"fun run({signature}): MiniLML6Outputs" in code["Ort.kt"][0]
    assert (
        "OnnxJavaType.UINT8" in code["Ort.kt"][0] and "longArrayOf(batch.toLong(), seq.toLong())" in code["Ort.kt"][0]
    )
    # TFLite names outputs by position: the wrapper reads output_1 and returns it as `pooled`
    assert 'outputIndex.getValue("output_1")' in code["Tflite.kt"][0] and "pooled = IntArray(" in code["Tflite.kt"][0]
    assert 'runner.output(named: "output_1")' in code["Tflite.swift"][0]
    swift_signature = "inputIds: [Int64], attentionMask: [Int64], inValue: [UInt8], batch: Int, seq: Int"
    assert f"public func run({swift_signature}) throws -> MiniLML6Outputs" in code["Ort.swift"][0]
    assert "public let pooledShape: [Int]" in code["Outputs.swift"][0]


def test_a_streaming_models_wrappers_carry_its_state_with_step_and_reset():
    """step() takes the real inputs and the dims the state does not fix, calls run() with the state
    it keeps (from its initial values, one row) and keeps the state run() returns; reset() starts
    again. A model without state has neither."""
    kotlin_lines = [
        "private var carriedStream6States = ByteArray(80) { (-128).toByte() }",
        "private var carriedState = FloatArray(256) { 0.0f }",
        "fun step(input: FloatArray): SileroVadOutputs {",
        "val outputs = run(input, carriedState, carriedStream6States, 1)",
        "carriedState = outputs.stateN",
        "fun reset() {",
    ]
    swift_lines = [
        "private var carriedStream6States = [Int8](repeating: -128, count: 80)",
        "public func step(input: [Float]) throws -> SileroVadOutputs {",
        "try run(input: input, state: carriedState, stream6States: carriedStream6States, batch: 1)",
        "carriedStream6States = outputs.stream6StatesNext",
        "public func reset() {",
    ]
    code = sources()
    expected = {"StreamTflite.kt": kotlin_lines, "StreamOrt.kt": kotlin_lines}
    expected |= {"StreamTflite.swift": swift_lines, "StreamOrt.swift": swift_lines}
    for name, lines in expected.items():
        assert [line for line in lines if line not in code[name][0]] == [], name
    assert "fun step(" not in code["Tflite.kt"][0] and "func reset(" not in code["Ort.swift"][0]


def test_the_checker_finds_broken_source():
    assert syntax_errors("class A { fun run(x: Int { return x } }", "kotlin")
    assert syntax_errors("public final class A { func run(x: Int -> Int { x } }", "swift")


def test_names_become_identifiers():
    assert [identifier(n) for n in ("input_ids", "attention-mask", "in", "0x", "")] == [
        "inputIds",
        "attentionMask",
        "inValue",
        "t0x",
        "value",
    ]
    assert type_name("mini-lm") == "MiniLm" and type_name("3d-unet") == "Model3dUnet"


def test_untypable_dtypes_and_colliding_names_are_refused():
    with pytest.raises(InputError, match="tensor 'x' is float16"):
        wrapped("M", "onnxruntime", "m.ort", Signature((TensorSpec("x", "float16", (1,)),), ()))
    clash = Signature((TensorSpec("a_b", "float32", (1,)), TensorSpec("aB", "float32", (1,))), ())
    with pytest.raises(InputError, match="distinct identifiers"):
        wrapped("M", "onnxruntime", "m.ort", clash)
