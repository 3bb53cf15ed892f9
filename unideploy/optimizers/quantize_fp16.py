"""FP16: weights and compute in half precision, inputs and outputs kept fp32 for callers.

ONNX Runtime's CPU provider runs most fp16 operators by casting back to fp32, so on CPU this
halves the file and saves no time. The artifact is therefore marked for the gpu and edge targets
(CUDA/TensorRT, mobile GPUs and NPUs compute in fp16 natively), and the pass says so.

Half precision ends at 65504. Real models cross it: PaddleOCR's detector stores BatchNorm
variances near 1e8, and some layers produce activations in the tens of thousands. Such layers stay
in fp32 (with casts around them): those with a weight out of fp16's range, and those whose inputs
or outputs on the calibration rows come within a factor of two of it. Operators on already
quantized tensors (an ORT-quantized LSTM, DynamicQuantizeLinear) stay in fp32 as well.

Range is not the only way half precision fails: its 11-bit mantissa loses a small value added to a
large one, and some layers (a detector's probability map, a recurrent OCR head) amplify such
rounding beyond the budget. When the model is over budget, the layers that lose most to fp16 are
found and kept in fp32 by the same search as INT8's (``sensitivity.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from unideploy.errors import ExportError, InputError, first_line
from unideploy.guard.metrics.builtin import one_row_decides
from unideploy.guard.search import search, search_record, skipped
from unideploy.onnx.graph import bodies, consumers, names_read, operator_list
from unideploy.onnx.precision import FP16_TINY, QUANTIZED_OPS
from unideploy.optimizers.base import Batch, OptimizeRequest, OptimizerPass, PassContext, PassResult
from unideploy.optimizers.graph import intermediate_tensors, name_nodes
from unideploy.optimizers.options import Fp16Options
from unideploy.optimizers.sensitivity import comparison_rows, rank_layers
from unideploy.optimizers.transformer_fusion import fuse
from unideploy.quiet import quiet

FP16_MAX = 65504.0
HEADROOM = 2.0  # activations above FP16_MAX / HEADROOM on calibration rows may overflow on others
# Operators whose result moves by the relative error of an input (the position): log x, 1/x, y/x.
# Below fp16's normal range that error grows to 100 % (0: -inf, inf), as it does for a spectrogram's
# log(|X|^2 + 1e-10): Basic Pitch's onset map 0.20 off in fp16, 0.02 with its three nodes in fp32,
# 0.001 with the transform computing |X| (below).
MAGNIFIERS = {"Log": 0, "Reciprocal": 0, "Div": 1}
# What computes such an input from values, or moves them: kept in fp32 with it, back to the tensors
# above fp16's range.
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Abs", "Neg", "Pow", "Sqrt", "Max", "Min", "Clip", "Relu"}
MOVING = {
    "Reshape", "Transpose", "Pad", "Slice", "Unsqueeze", "Squeeze", "Concat", "Flatten", "Identity", "Split",
    "Expand", "Tile", "Gather",
}  # fmt: skip
# A sum whose terms cancel keeps fp16's error of its terms, not of its result: Basic Pitch's
# constant-Q transform sums loud samples into quiet bins, and with it in fp16 the onset map was 1.8 %
# off (0.5 % in fp32). Where the walk reaches a sum it goes on through the operators that compute
# the terms (moving, summing, scaling, multiplying, squaring values), whatever their magnitude, and
# stops at anything else (a rectifier, a softmax, a constant).
SUMS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "ReduceSum", "ReduceMean"}
TERMS = SUMS | MOVING | (ELEMENTWISE - {"Max", "Min", "Clip", "Relu"})


def out_of_range_nodes(model: onnx.ModelProto, model_path: Path, rows: Batch, workdir: Path) -> dict[str, str]:
    """Node name -> why it must stay fp32: a float weight beyond fp16's range, an activation near
    it, or a log, reciprocal or divisor of values below its normal range and what computes them."""
    readers = consumers(model.graph)
    producer = {tensor: node for node in model.graph.node for tensor in node.output}
    reasons: dict[str, str] = {}
    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            peak = float(np.abs(numpy_helper.to_array(init)).max(initial=0.0))
            if peak > FP16_MAX:
                for reader in readers.get(init.name, []):
                    reasons[reader.name] = f"weight '{init.name}' reaches {peak:.3g}"
    limit = FP16_MAX / HEADROOM
    smallest: dict[str, float] = {}  # tensors with values fp16 cannot keep: their smallest magnitude
    for tensor, (values, *_) in intermediate_tensors(model_path, rows, workdir).items():
        magnitudes = np.abs(np.asarray(values))
        peak = float(magnitudes.max(initial=0.0))
        if peak > limit:
            for node in [producer.get(tensor), *readers.get(tensor, [])]:
                if node is not None and node.name not in reasons:
                    reasons[node.name] = f"activation '{tensor}' reaches {peak:.3g}"
        least = float(magnitudes.min(initial=np.inf, where=magnitudes > 0))
        if least < FP16_TINY:
            smallest[tensor] = least
    integers = _not_float(model)  # a Reshape's shape: computed as integers in fp16 as well
    for node in model.graph.node:
        read = MAGNIFIERS.get(node.op_type)
        if read is None or read >= len(node.input) or node.input[read] not in smallest:
            continue
        tensor = node.input[read]
        below = f"comes down to {smallest[tensor]:.2g}, below fp16's normal range (from {FP16_TINY:.2g})"
        reasons.setdefault(node.name, f"takes the {node.op_type.lower()} of '{tensor}', which {below}")
        pending, walked = [(tensor, False)], set()  # tensors, and whether the walk passed a sum to reach each
        while pending:
            value, past_sum = pending.pop()
            source = producer.get(value)  # none for a weight or an input
            if source is None or source.name in walked:
                continue
            if source.op_type in SUMS or (past_sum and source.op_type in TERMS):
                why = "computes, through a sum,"
                pending += [(t, True) for t in source.input if t and t not in integers]
            elif not past_sum and source.op_type in ELEMENTWISE | MOVING:
                why = "computes"
                pending += [(t, False) for t in source.input if t in smallest]
            else:
                continue
            walked.add(source.name)
            reasons.setdefault(source.name, f"{why} what {node.op_type} '{node.name}' reads, which {below}")
    return reasons


def _not_float(model: onnx.ModelProto) -> set[str]:
    """Tensors ONNX's type inference finds to hold other than floats (shape arithmetic); none where
    it cannot run (a model over protobuf's 2 GB), which only lists more nodes as kept in fp32."""
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
    try:
        typed = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except (ValueError, onnx.shape_inference.InferenceError):
        return set()
    declared = {v.name: v.type.tensor_type.elem_type for v in [*typed.value_info, *typed.input, *typed.output]}
    declared.update({init.name: init.data_type for init in model.graph.initializer})
    return {name for name, elem_type in declared.items() if elem_type and elem_type not in floats}


def _skip_fp16_round_trips(model: onnx.ModelProto, in_fp32: set[str]) -> None:
    """The converter casts every fp32-kept node's output to fp16, and back to fp32 for a next node
    that is kept in fp32 too: a value beyond fp16's range becomes inf on the way. It does the same
    to the model's inputs (kept fp32 for callers), so a front end kept in fp32 computed on audio
    rounded to fp16 (Basic Pitch's onset map 1.3 % off, 0.1 % without). Such nodes read the fp32
    value directly, and the casts no node reads any more go."""
    producer = {out: node for node in model.graph.node for out in node.output}
    readers = consumers(model.graph)
    graph_inputs, graph_outputs = {i.name for i in model.graph.input}, {o.name for o in model.graph.output}
    for node in list(model.graph.node):
        to_fp16 = producer.get(node.input[0]) if node.op_type == "Cast" else None
        if to_fp16 is None or to_fp16.op_type != "Cast" or node.output[0] in graph_outputs:
            continue
        casts = [onnx.helper.get_attribute_value(a) for n in (node, to_fp16) for a in n.attribute if a.name == "to"]
        source = producer.get(to_fp16.input[0])
        if casts == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16] and (
            (source is not None and source.name in in_fp32) or to_fp16.input[0] in graph_inputs
        ):
            for reader in readers.get(node.output[0], []):
                for i, tensor in enumerate(reader.input):
                    if tensor == node.output[0]:
                        reader.input[i] = to_fp16.input[0]
            model.graph.node.remove(node)
    read = names_read(model.graph.node) | graph_outputs
    for node in list(model.graph.node):  # casts nothing reads now: with them and their declared types,
        # Basic Pitch's fp16 file (its largest weights kept fp32) was 147 % of its fp32 one's size, 102 % after
        if node.op_type == "Cast" and not read.intersection(node.output):
            model.graph.node.remove(node)
    made = {t for node in model.graph.node for t in node.output}
    declared = [info for info in model.graph.value_info if info.name in made]  # of the tensors left
    del model.graph.value_info[:]
    model.graph.value_info.extend(declared)


class Fp16Conversion(OptimizerPass):
    name = "quantize-fp16"
    stage = "quantize"
    options = Fp16Options

    def __init__(self, options: Fp16Options | None = None) -> None:
        self.transformer_fusions = (options or Fp16Options()).transformer_fusions

    @classmethod
    def from_request(cls, request: OptimizeRequest) -> Fp16Conversion | None:
        asked = request.quantize == "fp16" or cls.name in request.passes
        return cls(cls.settings(request)) if asked else None

    def tag(self) -> str:
        return "fp16"

    def apply(self, model_path: Path, ctx: PassContext) -> PassResult:
        rows = comparison_rows(ctx)
        fusions: dict[str, Any] = {}
        if self.transformer_fusions:
            try:
                with quiet():
                    fused = fuse(model_path, rows, ctx.workdir / "fused.onnx")
            except Exception as exc:  # the fusions are a speed-up: without them the plain model converts
                ctx.say(f"transformer fusions skipped: {first_line(exc)}")
                fusions = {"skipped": first_line(exc)}
            else:
                if fused is not None:
                    ctx.say(f"fused the transformer blocks: {fused.operators}")
                    fusions = {"heads": fused.heads, "hidden_size": fused.hidden_size, "operators": fused.operators}
                    model_path = fused.path
        model = name_nodes(onnx.load(str(model_path)))
        named = ctx.workdir / "fp16-source.onnx"
        onnx.save(model, str(named))
        ctx.say("checking weights and activations against the fp16 range")
        try:
            with quiet():
                in_fp32 = out_of_range_nodes(model, named, rows, ctx.workdir)
        except Exception as exc:
            raise ExportError(
                f"the fp32 model's activations could not be measured for FP16: {first_line(exc)}"
            ) from exc
        ctx.say(
            "converting weights and compute to FP16"
            + (f" ({len(in_fp32)} layer(s) stay fp32: out of fp16's range)" if in_fp32 else "")
        )
        out = _convert(model, list(in_fp32), ctx.workdir / "fp16.onnx")
        _refuse_unchanged(onnx.load(str(out)), set(in_fp32))
        fp32_layers: list[dict[str, Any]] = [{"node": n, "why": why} for n, why in in_fp32.items()]
        params: dict[str, Any] = {"keep_io_types": True, **({"transformer_fusions": fusions} if fusions else {})}
        if not ctx.judge(out)["within_budget"]:
            out, searched = _search(model, named, out, list(in_fp32), rows, ctx)
            fp32_layers += searched.pop("fp32_layers")
            params.update(searched)
        return PassResult(
            path=out,
            precision="fp16",
            # fused operators are ONNX Runtime's CPU and CUDA kernels: mobile and web builds may lack them
            targets=["gpu"] if "operators" in fusions else ["gpu", "edge"],
            params={**params, "fp32_layers": fp32_layers},
            notes=[
                "on CPU, FP16 halves the size but does not run faster (ONNX Runtime computes it in fp32); "
                "it is meant for GPU and mobile runtimes",
                *(
                    [
                        "its transformer blocks are fused into ONNX Runtime's own operators, so it is marked for "
                        "the gpu target only (--no-transformer-fusions writes one for edge and mobile too)"
                    ]
                    if "operators" in fusions
                    else []
                ),
            ],
        )


def _refuse_unchanged(converted: onnx.ModelProto, in_fp32: set[str]) -> None:
    """An InputError (exit 2) where the conversion left every operator in fp32: a tree ensemble's
    and the other ONNX-ML operators are on the converter's block list (no fp16 kernels), so their
    "fp16" model is the fp32 one with Casts around it, and an artifact labelled fp16 would hold none."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    kept = set(DEFAULT_OP_BLOCK_LIST) | QUANTIZED_OPS | {"Cast"}

    def converts(graph: onnx.GraphProto) -> bool:
        if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer):
            return True
        for node in graph.node:
            if node.op_type not in kept and node.name not in in_fp32:
                return True
            if any(converts(body) for body in bodies(node)):
                return True
        return False

    if converts(converted.graph):
        return
    raise InputError(
        f"FP16 has nothing to convert in this model: its operators ({operator_list(converted.graph, {'Cast'})}) "
        "stay in fp32 (ONNX Runtime's converter keeps operators without fp16 kernels, and those out of fp16's "
        "range, as they are)",
        "serve it as it is (its fp32 artifact is what runs)",
    )


def _convert(model: onnx.ModelProto, in_fp32: list[str], out: Path) -> Path:
    """``model`` in fp16 but for the nodes ``in_fp32`` (and the operators on quantized tensors)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    converted = onnx.ModelProto()
    converted.CopyFrom(model)  # the converter changes the model it is given, and the search converts it again
    try:
        converted = convert_float_to_float16(
            converted,
            keep_io_types=True,
            node_block_list=in_fp32,
            op_block_list=DEFAULT_OP_BLOCK_LIST + sorted(QUANTIZED_OPS),
        )
    except Exception as exc:
        raise ExportError(f"FP16 conversion failed: {first_line(exc)}") from exc
    _skip_fp16_round_trips(converted, set(in_fp32))
    onnx.save(converted, str(out))
    return out


def _search(
    model: onnx.ModelProto, source: Path, converted: Path, in_range: list[str], rows: Batch, ctx: PassContext
) -> tuple[Path, dict[str, Any]]:
    """Keep the layers that lose most to fp16 in fp32 until the model fits the budget."""
    ctx.say("FP16 is over the accuracy budget: ranking layers by their loss in half precision")
    try:
        with quiet():
            ranked = [
                (n, loss) for n, loss in rank_layers(source, converted, rows, ctx.workdir, None) if n not in in_range
            ]
    except Exception as exc:  # the search is an improvement; without it the guard judges the plain model
        ctx.say(f"sensitivity ranking skipped: {first_line(exc)}")
        return converted, {"fp32_layers": [], "search": skipped(first_line(exc))}
    result = search(
        [name for name, _ in ranked],
        lambda kept: _convert(model, in_range + kept, ctx.workdir / f"fp16-fp32x{len(kept)}.onnx"),
        ctx.judge,
        ctx.say,
        "FP16",
    )
    if result.path is None:
        return converted, {"fp32_layers": [], "search": skipped("one layer, nothing to search")}
    loss = dict(ranked)
    size = result.path.stat().st_size / source.stat().st_size
    judged = ctx.judge(converted)
    all_fp16 = judged["drop_points"]
    # where one validation row decided it, the search kept layers in fp32 for that row: say so
    single = one_row_decides(judged["outputs"][judged["deciding_output"]], "keeps layers in fp32")
    return result.path, {
        "fp32_layers": [
            {"node": n, "why": f"loses {loss[n]:.1f} dB of SQNR in fp16", "sqnr_loss_db": round(loss[n], 2)}
            for n in result.restored
        ],
        "search": search_record(
            len(ranked),
            "in fp32",
            result,
            size_ratio=round(size, 3),
            drop_points_all_fp16=all_fp16,
            cost=f"all layers in FP16 dropped {all_fp16:.2f} points{single}; with them in fp32, {size:.0%} of the fp32 size",
        ),
    }
