"""ONNX Runtime's transformer fusions, ahead of FP16: attention, skip + LayerNorm, bias + GELU and
the embedding's LayerNorm each become one fused operator.

Measured on an H200 (docs/gpu.md): a MiniLM-sized encoder in plain fp16 ran 1.96x exact fp32 at
batch 32 on the CUDA provider, and 3.47x once fused: in half precision an unfused encoder spends
its time in the many small operators between its matrix products, which the fused kernels remove.
The fused model is still an ordinary ONNX graph (``com.microsoft`` operators that every ONNX Runtime
provider we run has), judged by the same accuracy guard as any other artifact.

ONNX Runtime's attention fusion must be told the number of heads and the hidden size, and cannot
read them from the graphs PyTorch writes (the reshapes take their shape from ``Shape`` nodes). The
model is run once instead: the reshape that splits a projection into heads is followed by the
transpose that brings heads forward, and its output's shape on a real row is ``[batch, seq, heads,
head size]``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from unideploy.onnx.graph import consumers
from unideploy.optimizers.base import Batch
from unideploy.optimizers.graph import attributes, computing

HEADS_FORWARD = ([0, 2, 1, 3], [0, 2, 3, 1])  # [b, s, h, d] -> [b, h, s, d] (queries, values) or [b, h, d, s] (keys)


@dataclass(frozen=True)
class Fused:
    path: Path
    heads: int
    hidden_size: int
    operators: dict[str, int]  # fused operator -> how many


def attention_shape(model: onnx.ModelProto, rows: Batch) -> tuple[int, int] | None:
    """(heads, hidden size) of the model's attention, measured on one row; None without attention."""
    readers = consumers(model.graph)
    splits = [
        node.output[0]
        for node in model.graph.node
        if node.op_type == "Reshape"
        and any(
            r.op_type == "Transpose" and attributes(r).get("perm") in HEADS_FORWARD
            for r in readers.get(node.output[0], [])
        )
    ]
    if not splits:
        return None
    one_row = {name: values[:1] for name, values in rows.items()}
    shapes = Counter(
        (int(shape[2]), int(shape[2] * shape[3]))
        for shape in (np.shape(v) for v in computing(model, splits).run(splits, one_row))
        if len(shape) == 4
    )
    return shapes.most_common(1)[0][0] if shapes else None


def fuse(model_path: Path, rows: Batch, out: Path) -> Fused | None:
    """``model_path`` with its transformer blocks fused, written to ``out``; None where the model has
    no attention, or nothing was fused, or the fused graph would not take and give what the model does."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = onnx.load(str(model_path))
    found = attention_shape(model, rows)
    if found is None:
        return None
    heads, hidden = found
    before = _interface(model.graph)  # the optimizer rewrites the model it is given
    # opt_level 0: only the Python fusions, the same on every machine (higher levels run ONNX
    # Runtime's own graph optimizer for the provider of the machine the pass runs on)
    fused = optimize_model(model, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    operators = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    attention = operators.get("Attention") or operators.get("MultiHeadAttention")
    if not attention or _interface(fused.model.graph) != before:
        return None
    fused.save_model_to_file(str(out))
    return Fused(out, heads, hidden, operators)


def _interface(graph: onnx.GraphProto) -> list[tuple[str, int]]:
    """The names and element types a graph takes and gives."""
    return [(v.name, v.type.tensor_type.elem_type) for v in (*graph.input, *graph.output)]
