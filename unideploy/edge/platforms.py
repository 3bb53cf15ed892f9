"""The mobile platforms ``deploy bundle`` targets: which wrapper sources and dependency files each
gets. Adding a platform is one function here plus one entry in PLATFORMS."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from unideploy.edge.codegen import kotlin, swift
from unideploy.edge.codegen.wrapped import Wrapped

# Library versions written into the dependency lines. ONNX Runtime's follows the host's, which
# wrote the .ort file (an older mobile runtime may refuse a newer ORT format); LiteRT's are the
# releases these wrappers were written against.
LITERT_ANDROID_VERSION = "1.4.0"
TFLITE_SWIFT_VERSION = "2.17.0"


@dataclass(frozen=True)
class CodeFile:
    path: str  # inside the bundle
    text: str
    language: str  # what checks it: "kotlin", "swift", or "text" (not parsed)


@dataclass(frozen=True)
class Platform:
    name: str
    language: str
    runtimes: str  # for the README: what the wrappers run on
    generate: Callable[[list[Wrapped], str, str], list[CodeFile]]  # (models, namespace, ORT version)


def _by_runtime(models: list[Wrapped]) -> dict[str, Wrapped]:
    return {m.runtime: m for m in models}


def android(models: list[Wrapped], namespace: str, ort_version: str) -> list[CodeFile]:
    type_name = models[0].type_name
    root = "android/src/main/kotlin/" + namespace.replace(".", "/")
    runtimes = _by_runtime(models)
    files = [CodeFile(f"{root}/{type_name}Outputs.kt", kotlin.outputs_class(models[0], namespace), "kotlin")]
    if "tflite" in runtimes:
        files.append(
            CodeFile(f"{root}/{type_name}Tflite.kt", kotlin.tflite_class(runtimes["tflite"], namespace), "kotlin")
        )
    if "onnxruntime" in runtimes:
        files.append(
            CodeFile(f"{root}/{type_name}Ort.kt", kotlin.ort_class(runtimes["onnxruntime"], namespace), "kotlin")
        )
    files.append(
        CodeFile("android/dependencies.gradle.kts", kotlin.gradle_lines(LITERT_ANDROID_VERSION, ort_version), "kotlin")
    )
    return files


def ios(models: list[Wrapped], namespace: str, ort_version: str) -> list[CodeFile]:
    type_name = models[0].type_name
    root = f"ios/Sources/{type_name}"
    runtimes = _by_runtime(models)
    files = [CodeFile(f"{root}/{type_name}Outputs.swift", swift.outputs_struct(models[0]), "swift")]
    tflite_file = None
    if "tflite" in runtimes:
        tflite_file = f"{type_name}Tflite.swift"
        files.append(CodeFile(f"{root}/{tflite_file}", swift.tflite_class(runtimes["tflite"]), "swift"))
    if "onnxruntime" in runtimes:
        files.append(CodeFile(f"{root}/{type_name}Ort.swift", swift.ort_class(runtimes["onnxruntime"]), "swift"))
    files.append(CodeFile("ios/Package.swift", swift.package_swift(type_name, ort_version, tflite_file), "swift"))
    files.append(CodeFile("ios/Podfile", swift.podfile(type_name, TFLITE_SWIFT_VERSION, ort_version), "text"))
    return files


PLATFORMS = {
    "android": Platform("android", "kotlin", "TFLite (LiteRT) Interpreter and ONNX Runtime Android", android),
    "ios": Platform("ios", "swift", "TensorFlowLiteSwift and ONNX Runtime (onnxruntime-objc)", ios),
}


def namespace_for(model_name: str) -> str:
    """Default Kotlin package: ``ai.unideploy.models.<name>`` with the name made a valid segment."""
    segment = re.sub(r"[^0-9a-z]", "", model_name.lower()) or "model"
    return f"ai.unideploy.models.{'m' + segment if segment[0].isdigit() else segment}"
