"""Generated Kotlin and Swift for signatures the bundle tests' CNNs do not reach (several inputs,
integer tensors, named dynamic dimensions, awkward names), checked by the tree-sitter parsers."""

from __future__ import annotations

import pytest

from unideploy.edge.codegen import kotlin, swift
from unideploy.edge.codegen.wrapped import identifier, type_name, wrapped
from unideploy.errors import InputError
from unideploy.signature import Signature, TensorSpec

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
    }


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
