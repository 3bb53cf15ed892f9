"""Which artifact an engine is built from, and how, for a requested precision.

- fp32 / fp16: from the fp32 ONNX artifact (fp16 is a builder flag; TensorRT keeps sensitive
  layers in fp32 itself, which an fp16 ONNX would not let it do).
- int8: explicit quantization from the package's QDQ int8 artifact when TensorRT can take it (the
  scales were calibrated and accuracy-checked by ``deploy optimize --int8-variant symmetric``);
  otherwise the fp32 ONNX with TensorRT's entropy calibrator over the user's calibration data.
  TensorRT takes only symmetric int8 Q/DQ: the CPU-tuned ``static`` variant (uint8 activations)
  and the ``dynamic`` one (MatMulInteger) are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from unideploy.errors import InputError
from unideploy.onnx.precision import DYNAMIC_INT8_OPS
from unideploy.package import Artifact, Manifest
from unideploy.package.manifest import Precision, is_precision

PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class BuildPlan:
    artifact: Artifact  # the ONNX the engine is parsed from
    precision: Precision
    fp16: bool  # builder flags
    int8: bool
    calibrate: bool  # needs the entropy calibrator (implicit int8)
    reason: str


def tensorrt_qdq_problem(onnx_path: Path) -> str | None:
    """Why TensorRT cannot build this graph with explicit quantization, or None if it can: it
    needs Q/DQ pairs whose zero points are int8 zeros (symmetric), and no dynamic-int8 operators."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    if not {"QuantizeLinear", "DequantizeLinear"} <= ops:
        return "it has no QuantizeLinear/DequantizeLinear pairs"
    if ops & DYNAMIC_INT8_OPS:
        return f"it uses dynamic-int8 operators ({', '.join(sorted(ops & DYNAMIC_INT8_OPS))})"
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or len(node.input) < 3 or node.input[2] not in constants:
            continue
        zero_point = numpy_helper.to_array(constants[node.input[2]])
        if zero_point.dtype.name != "int8" or zero_point.any():
            return (
                f"its activations are quantized to {zero_point.dtype.name} with non-zero zero points "
                "(asymmetric); TensorRT takes symmetric int8 only"
            )
    return None


def plan_build(
    manifest: Manifest, precision: str, artifact_path: Callable[[Artifact], Path], has_calibration: bool
) -> BuildPlan:
    """``artifact_path(artifact) -> Path`` locates artifacts (the package knows where)."""
    if precision not in PRECISIONS or not is_precision(precision):
        raise InputError(f"unknown TensorRT precision '{precision}'", f"use one of: {', '.join(PRECISIONS)}")
    onnx = [a for a in manifest.artifacts if a.format == "onnx"]
    base = manifest.base_onnx()
    if precision == "int8":
        refused = {}
        for artifact in (a for a in onnx if a.precision == "int8"):
            refused[artifact.id] = tensorrt_qdq_problem(artifact_path(artifact))
            if refused[artifact.id] is None:
                return BuildPlan(
                    artifact, "int8", True, True, False, f"explicit quantization from the QDQ artifact '{artifact.id}'"
                )
        not_usable = "".join(f"; '{k}' cannot be used: {why}" for k, why in refused.items())
        if base is not None and has_calibration:
            return BuildPlan(
                base,
                "int8",
                True,
                True,
                True,
                f"TensorRT's entropy calibrator over the calibration data, on '{base.id}'{not_usable}",
            )
        raise InputError(
            "TensorRT int8 needs a symmetric QDQ int8 artifact in the package or calibration data" + not_usable,
            "add --quantize int8 --int8-variant symmetric --calibration DATA (explicit, accuracy-checked),"
            " or just --calibration DATA (TensorRT calibrates when the engine is built)",
        )
    if base is None:
        raise InputError(
            "the package has no fp32 ONNX artifact to build a TensorRT engine from",
            "export the model again (every export writes one)",
        )
    if base.precision != "fp32":
        raise InputError(
            f"TensorRT {precision} is built from an fp32 model, and the package's ONNX artifact '{base.id}' "
            f"computes in {base.precision}, as its source model does",
            "export with --target cpu: ONNX Runtime runs that artifact on the GPU's CUDA provider as well; or "
            "export the fp32 model it was made from with --target gpu",
        )
    return BuildPlan(base, precision, precision == "fp16", False, False, f"from '{base.id}'")
