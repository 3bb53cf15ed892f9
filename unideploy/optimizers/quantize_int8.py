"""INT8 quantization with onnxruntime.quantization, choosing the variant per model.

- ``static``: QDQ, uint8 activations, int8 per-channel weights, calibrated (MinMax, Entropy or
  Percentile) after ``quant_pre_process``. Only compute-heavy and data-movement operators are
  quantized, so precision-sensitive ones (LayerNorm, Softmax, GELU/Erf, ...) get float inputs and
  run in float, unless ``quantize_sensitive``. Best for conv nets.
- ``dynamic``: int8 per-channel weights of MatMul/Gemm, activations quantized at run time
  (per-tensor weights cost MiniLM-L6 its accuracy: cosine to fp32 0.96, vs 0.992), and int8
  embedding tables (Gather from a weight, dequantized as rows are looked up). For
  MatMul-heavy models (transformers). Only products with a weight are quantized: attention's
  activation x activation products (Q.K^T, probabilities.V) stay in float, as do convolutions
  (ConvInteger is several times slower than fp32 on x86).

- ``symmetric``: ``static`` with int8 activations and zero points of 0 (both sides symmetric),
  the explicit quantization TensorRT builds (``--target gpu --trt-precision int8``). Not in
  ``auto``: on CPUs it is no faster than ``static`` and a little less exact.

A Concat whose inputs hold values on very different ranges (YOLOv8's head: box coordinates up to
the image size beside class probabilities in [0, 1]) would quantize them all with one scale, which
leaves the narrow input a few levels or none (every probability 0 or 2.5): calibrated variants
keep such a Concat in fp32 from the start, and the report says why. When a calibrated variant
(``static``, ``symmetric``) exceeds the accuracy budget, the layers most sensitive to quantization
are kept in fp32 until it fits (``sensitivity.py``; their SQNR is measured on the whole tensor,
which the wide input dominates, so it cannot find a mixed-range Concat); the report names them and
what they cost in speed.

``auto`` builds ``static`` and ``dynamic``, measures each against fp32 (accuracy on validation data and latency at
batch 1 and a large batch) and keeps the fastest one within the accuracy budget, saying why.
INT8 is asked for speed: one slower than fp32 at every batch size measured is refused with the
numbers (``keep_slower``, for a package built on one CPU and served on another, keeps it with a
note), except ``symmetric``, which is made for TensorRT on a GPU.
On CPUs without VNNI, u8 x s8 products can saturate; weights then use 7 bits (reduce_range).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from unideploy.errors import ExportError, InputError, first_line
from unideploy.guard.measure import FASTER, cpu_has_vnni, slower_everywhere, slower_int8_refusal
from unideploy.guard.search import search, search_record, skipped
from unideploy.onnx.graph import branch_layers, control_flow_note, operator_list, weight_names
from unideploy.onnx.interface import opset_of
from unideploy.onnx.precision import INT8_OPS
from unideploy.optimizers.base import Batch, Evaluation, OptimizeRequest, OptimizerPass, PassContext, PassResult
from unideploy.optimizers.graph import gemm_to_matmul, name_nodes, plain_tensor_names
from unideploy.optimizers.options import Int8Options
from unideploy.optimizers.sensitivity import comparison_rows, rank_layers
from unideploy.quiet import quiet

# Static INT8 quantizes only these: the compute-heavy operators and those that just move or select
# values. Everything else (LayerNorm, Softmax, GELU/Erf, the Mul/Add/Div around them, ...) then
# receives float inputs and runs in float, which is where int8 transformers lose their accuracy.
STATIC_OPS = [
    "Conv",
    "ConvTranspose",
    "MatMul",
    "Gemm",
    "Relu",
    "Clip",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Concat",
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Resize",
    "Split",
    "Gather",
]
# A Concat whose inputs' calibrated ranges differ this much leaves the narrowest fewer than 256 / 16
# levels of a shared uint8 scale: kept in fp32.
MIXED_RANGE_RATIO = 16.0
# A searched INT8 model no faster than fp32 (by more than the timing's noise, FASTER) must at least be
# this much smaller to be worth adding.
WORTHWHILE_SIZE = 0.75
# Operators whose weights INT8 stores as integers (static and dynamic alike): without one of them
# fed by a weight there is nothing to quantize.
WEIGHTED_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Gather", "LSTM", "GRU", "Attention"}


def refuse_without_weights(model: onnx.ModelProto) -> None:
    """An InputError (exit 2) for a model INT8 cannot change: no Conv, MatMul, Gemm, embedding or
    recurrent node takes a weight (a tree ensemble or another ONNX-ML model: ONNX Runtime's
    quantizer otherwise failed inside with "Failed to find proper ai.onnx domain" and exit 1)."""
    weights = weight_names(model.graph)
    if any(n.op_type in WEIGHTED_OPS and any(i in weights for i in n.input) for n in model.graph.node):
        return
    nested = branch_layers(model.graph, WEIGHTED_OPS)
    raise InputError(
        f"INT8 has nothing to quantize in this model: none of its operators ({operator_list(model.graph)}) "
        "is a Conv, MatMul, Gemm, embedding Gather or recurrent layer with weights"
        + control_flow_note(nested, "the quantizer"),
        (
            "export a graph without the control flow (the branch your settings take), or serve it as it is "
            "(its fp32 artifact is what runs)"
            if nested
            else "serve it as it is (its fp32 artifact is what runs), or optimize a model with such layers"
        ),
    )


class _Reader:
    """CalibrationDataReader over the calibration batches (duck-typed, as ORT only calls get_next)."""

    def __init__(self, batches: list[Batch]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> Batch | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # some calibrators call it
        pass


# Per-channel QDQ needs DequantizeLinear's ``axis``, which opset 13 introduced; older models (PP-OCR
# exports are opset 11-12) are converted first, or onnxruntime's quantizer writes an invalid graph.
PER_CHANNEL_OPSET = 13


def _upgrade_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, PER_CHANNEL_OPSET)
    except Exception as exc:
        raise ExportError(
            f"INT8 needs opset {PER_CHANNEL_OPSET} (per-channel weights) and this opset-{opset} model "
            f"cannot be converted: {first_line(exc)}",
            "re-export the model at opset 13 or later, or use --quantize fp16",
        ) from exc


def _calibration_cache(ctx: PassContext, variant: str) -> Path:
    return ctx.workdir / f"calibration-{variant}.json"


def mixed_range_concats(model: onnx.ModelProto, cache: Path) -> dict[str, str]:
    """Concat nodes whose inputs' calibrated ranges (the cache ``quantize_static`` wrote) differ by
    ``MIXED_RANGE_RATIO`` or more, with why each must stay fp32."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    if not cache.is_file():
        return {}
    ranges = load_tensors_data(cache).data
    mixed = {}
    for node in model.graph.node:
        if node.op_type != "Concat" or not node.name:  # nodes_to_exclude names nodes
            continue
        spans = [
            float(np.max(ranges[i].range_value[1]) - np.min(ranges[i].range_value[0]))
            for i in node.input
            if i in ranges
        ]
        if len(spans) > 1 and min(spans) > 0 and max(spans) / min(spans) >= MIXED_RANGE_RATIO:
            mixed[node.name] = (
                f"Concat of inputs whose ranges differ {max(spans) / min(spans):.0f}x (widest {max(spans):.4g}, "
                f"narrowest {min(spans):.4g}): one int8 scale would leave the narrowest "
                f"{255 * min(spans) / max(spans):.1f} of 255 levels"
            )
    return mixed


class Int8Quantization(OptimizerPass):
    name = "quantize-int8"
    stage = "quantize"
    required_modules = ("onnx", "onnxruntime", "sympy")

    options = Int8Options

    def __init__(self, options: Int8Options | None = None) -> None:
        options = options or Int8Options()
        self.variant = options.int8_variant
        self.calibration_method = options.calibration_method
        self.quantize_sensitive = options.quantize_sensitive_ops
        self.keep_slower = options.keep_slower

    @classmethod
    def from_request(cls, request: OptimizeRequest) -> Int8Quantization | None:
        if request.quantize != "int8" and cls.name not in request.passes:
            return None
        return cls(cls.settings(request))

    def tag(self) -> str:
        return "int8"

    def apply(self, model_path: Path, ctx: PassContext) -> PassResult:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        refuse_without_weights(onnx.load(str(model_path)))
        prepared = ctx.workdir / "int8-prepared.onnx"
        try:  # its shape inference leaves a temporary model in the working directory when it fails
            with quiet(), contextlib.chdir(ctx.workdir):
                quant_pre_process(str(model_path), str(prepared))
        except Exception as exc:  # pre-processing is an optimisation; quantize the model as it is
            ctx.say(f"quantization pre-processing skipped: {first_line(exc)}")
            prepared = Path(model_path)
        model = onnx.load(str(prepared))
        opset = opset_of(model)
        if opset < PER_CHANNEL_OPSET:
            model = _upgrade_opset(model, opset)
        plain_tensor_names(model)  # names the quantizer's own cannot collide with
        prepared = ctx.workdir / "int8-source.onnx"
        onnx.save(model, str(prepared))
        gemm_to_matmul(model)  # onnxruntime's dynamic quantizer skips Gemm
        name_nodes(model)
        weights = {i.name for i in model.graph.initializer}
        weight_products = [
            n.name for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights
        ]
        has_matmul = bool(weight_products)
        # embedding tables (Gather from a weight) are stored int8 too: a transformer's vocabulary
        # is a third to half of its file (MiniLM-L6: 65% -> 25% of fp32, cosine unchanged)
        dynamic_nodes = weight_products + [
            n.name for n in model.graph.node if n.op_type == "Gather" and n.input[0] in weights
        ]
        dynamic_source = ctx.workdir / "int8-dynamic-source.onnx"
        if has_matmul:
            onnx.save(model, str(dynamic_source))
        wanted = ["static", "dynamic"] if self.variant == "auto" else [self.variant]
        if "dynamic" in wanted and not has_matmul:
            if self.variant == "dynamic":
                raise InputError(
                    "dynamic INT8 quantizes MatMul/Gemm weights, and this model has none", "use --int8-variant static"
                )
            wanted.remove("dynamic")
        reduce_range = not cpu_has_vnni()
        built: dict[str, Path] = {}
        skipped: dict[str, str] = {}
        searched: dict[str, dict[str, Any]] = {}
        for variant in wanted:
            ctx.say(f"quantizing to INT8 ({variant})")
            try:
                source = dynamic_source if variant == "dynamic" else prepared
                built[variant] = self._build(variant, source, ctx, reduce_range, dynamic_nodes)
                if variant != "dynamic":
                    built[variant], record = self._calibrated(variant, source, built[variant], ctx, reduce_range)
                    if record:
                        searched[variant] = record
            except ExportError as exc:
                if self.variant != "auto":
                    raise
                skipped[variant] = exc.message  # auto: the other variant may still do
        if not built:
            raise ExportError("no INT8 variant could be built: " + "; ".join(f"{v}: {r}" for v, r in skipped.items()))
        if len(built) == 1:
            variant = next(iter(built))
            why = f"{variant} requested" if self.variant != "auto" else "the only variant that applies to this model"
            candidates: list[dict[str, Any]] = []
        else:
            variant, why, candidates = self._choose(built, ctx)
        if variant != "symmetric" and not self.keep_slower:  # symmetric is TensorRT's: this CPU says nothing
            chosen = ctx.evaluate(built[variant])  # measured once: the final check reuses it
            if chosen.within_budget and (slower := slower_everywhere(chosen.latency_ms)):
                raise slower_int8_refusal(slower, built[variant].stat().st_size / Path(model_path).stat().st_size)
        return PassResult(
            path=built[variant],
            precision="int8",
            params={
                "variant": variant,
                "why": why,
                "candidates": candidates,
                "skipped": skipped,
                "calibration_method": self.calibration_method if variant != "dynamic" else None,
                "activations": {"static": "uint8", "symmetric": "int8 symmetric"}.get(variant, "uint8 (dynamic)"),
                "weights": "int8 per-channel",
                "sensitive_ops_in_float": not self.quantize_sensitive if variant != "dynamic" else None,
                "reduce_range": reduce_range,
                **searched.get(variant, {}),
                # what the search found for a variant not chosen (auto), for the refusal to say
                "other_searches": {v: r["search"] for v, r in searched.items() if v != variant and "search" in r},
            },
        )

    def _calibrated(
        self, variant: str, source: Path, quantized: Path, ctx: PassContext, reduce_range: bool
    ) -> tuple[Path, dict[str, Any]]:
        """A calibrated variant with its mixed-range Concats in fp32, searched when over budget; the
        record names the layers kept in fp32 and why (empty: none)."""
        mixed = mixed_range_concats(onnx.load(str(source)), _calibration_cache(ctx, variant))
        record: dict[str, Any] = {}
        if mixed:
            ctx.say(f"{len(mixed)} Concat(s) of inputs on different ranges stay fp32")
            quantized = self._build(variant, source, ctx, reduce_range, [], list(mixed))
        if not ctx.judge(quantized)["within_budget"]:
            quantized, record = self._search(variant, source, quantized, ctx, reduce_range, list(mixed))
        if mixed:
            record["fp32_layers"] = [{"node": n, "why": why} for n, why in mixed.items()] + record.get(
                "fp32_layers", []
            )
        return quantized, record

    def _search(
        self, variant: str, source: Path, quantized: Path, ctx: PassContext, reduce_range: bool, fp32: list[str]
    ) -> tuple[Path, dict[str, Any]]:
        """Keep the most sensitive layers in fp32 until the model fits the budget (see sensitivity.py)."""
        ctx.say(f"INT8 {variant} is over the accuracy budget: ranking layers by quantization sensitivity")
        try:
            with quiet():
                ranked = rank_layers(
                    source,
                    quantized,
                    comparison_rows(ctx),
                    ctx.workdir,
                    None if self.quantize_sensitive else STATIC_OPS,
                )
        except Exception as exc:  # the search is an improvement; without it the guard judges the plain model
            ctx.say(f"sensitivity ranking skipped: {first_line(exc)}")
            return quantized, {"fp32_layers": [], "search": skipped(first_line(exc))}
        result = search(
            [name for name, _ in ranked],
            lambda exclude: self._build(variant, source, ctx, reduce_range, [], [*fp32, *exclude]),
            ctx.judge,
            ctx.say,
            "INT8",
        )
        if result.path is None:  # one quantized node: nothing to keep in fp32 while quantizing the rest
            return quantized, {"fp32_layers": [], "search": skipped("one quantized node, nothing to search")}
        loss = dict(ranked)
        all_int8, kept = ctx.evaluate(quantized), ctx.evaluate(result.path)
        size = result.path.stat().st_size / source.stat().st_size
        record: dict[str, Any] = {
            "fp32_layers": [{"node": n, "sqnr_loss_db": round(loss[n], 2)} for n in result.restored],
            "search": search_record(
                len(ranked),
                "in fp32",
                result,
                speedup_all_int8=round(all_int8.mean_speedup, 3),
                speedup=round(kept.mean_speedup, 3),
                size_ratio=round(size, 3),
                drop_points_all_int8=all_int8.accuracy["drop_points"],
                cost=f"all layers in INT8 ran {all_int8.mean_speedup:.2f}x fp32 with a drop of "
                f"{all_int8.accuracy['drop_points']:.2f} points; with them in fp32, "
                f"{kept.mean_speedup:.2f}x at {size:.0%} of the size",
            ),
        }
        if result.within_budget and kept.mean_speedup < FASTER and size > WORTHWHILE_SIZE:
            # within budget only as a model that is neither faster nor much smaller: not an INT8 model
            record["search"]["refused"] = (
                f"within the budget only with {len(result.restored)} layers in fp32, "
                f"which runs {kept.mean_speedup:.2f}x fp32 at {size:.0%} of its size"
            )
            return quantized, record
        return result.path, record

    def _build(
        self,
        variant: str,
        prepared: Path,
        ctx: PassContext,
        reduce_range: bool,
        dynamic_nodes: list[str],
        fp32_layers: list[str] | tuple[str, ...] = (),
    ) -> Path:
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_dynamic,
            quantize_static,
        )

        out = ctx.workdir / f"int8-{variant}{f'-fp32x{len(fp32_layers)}' if fp32_layers else ''}.onnx"
        try:
            with quiet():
                if variant in ("static", "symmetric"):
                    if not ctx.calibration:
                        raise InputError(f"{variant} INT8 needs calibration data", "pass --calibration DATA")
                    symmetric = variant == "symmetric"
                    method = {
                        "minmax": CalibrationMethod.MinMax,
                        "entropy": CalibrationMethod.Entropy,
                        "percentile": CalibrationMethod.Percentile,
                    }[self.calibration_method]
                    cache = _calibration_cache(ctx, variant)  # every search candidate reuses it
                    quantize_static(
                        str(prepared),
                        str(out),
                        None if cache.exists() else _Reader(ctx.calibration),
                        quant_format=QuantFormat.QDQ,
                        nodes_to_exclude=list(fp32_layers),
                        calibration_cache_path=str(cache),
                        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        per_channel=True,
                        reduce_range=reduce_range,
                        calibrate_method=method,
                        op_types_to_quantize=None if self.quantize_sensitive else STATIC_OPS,
                        calibration_providers=["CPUExecutionProvider"],
                        extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True},
                    )
                else:
                    quantize_dynamic(
                        str(prepared),
                        str(out),
                        weight_type=QuantType.QInt8,
                        op_types_to_quantize=["MatMul", "Gather"],
                        nodes_to_quantize=dynamic_nodes,
                        per_channel=True,
                        reduce_range=reduce_range,
                    )
        except InputError:
            raise
        except Exception as exc:
            raise ExportError(
                f"INT8 {variant} quantization failed: {first_line(exc)}",
                "try --int8-variant dynamic/static, or --quantize fp16",
            ) from exc
        if not any(n.op_type in INT8_OPS for n in onnx.load(str(out)).graph.node):
            raise ExportError(
                f"INT8 {variant} quantization changed nothing in this model",
                "try the other --int8-variant, or --quantize fp16",
            )
        return out

    @staticmethod
    def _choose(built: dict[str, Path], ctx: PassContext) -> tuple[str, str, list[dict[str, Any]]]:
        measured: dict[str, Evaluation] = {}
        for variant, path in built.items():
            ctx.say(f"measuring INT8 {variant} against fp32")
            measured[variant] = ctx.evaluate(path)
        candidates = [
            {
                "variant": v,
                "drop_points": e.accuracy["drop_points"],
                "within_budget": e.within_budget,
                "speedup": {str(b): t["speedup"] for b, t in e.latency_ms.items()},
                "mean_speedup": round(e.mean_speedup, 3),
            }
            for v, e in measured.items()
        ]
        fits = [v for v, e in measured.items() if e.within_budget]
        summary = ", ".join(
            f"{c['variant']} {c['mean_speedup']:.2f}x / drop {c['drop_points']:.2f} pts" for c in candidates
        )
        if not fits:  # hand the most accurate to the guard, which refuses it with the numbers
            best = min(measured, key=lambda v: measured[v].accuracy["drop_points"])
            return best, f"no variant within the accuracy budget ({summary})", candidates
        best = max(fits, key=lambda v: measured[v].mean_speedup)
        return (
            best,
            f"fastest within the accuracy budget ({summary}; speedup = geometric mean over batch sizes)",
            candidates,
        )
