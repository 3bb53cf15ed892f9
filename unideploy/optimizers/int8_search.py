"""Accuracy-driven INT8: keep the layers most hurt by quantization in fp32 until the budget holds.

Quantization noise on a real network rarely comes from one place; it builds up layer by layer,
and a few layers (a projection without an activation after it, the stem convolution, the layer
before a detector's head) add much more of it than the rest. ONNX Runtime's QDQ debugging tools
run the fp32 and the INT8 model side by side on calibration rows and give, for every tensor, its
signal-to-quantization-noise ratio (SQNR) against fp32. A layer's *sensitivity* is the SQNR it
loses: the worst SQNR of its inputs minus the SQNR of its output (after the Relu/Clip it feeds,
which QDQ folds into it).

The search then keeps the most sensitive layers in fp32, 1, 2, 4, 8, ... of them, each candidate
judged by the same accuracy guard as the final model, and narrows the count down by bisection, so
the fewest layers give up INT8. Every layer kept in fp32 costs speed (data crosses between int8
and fp32 around it); the optimize report gives that cost as the speedup with and without them.
Calibration runs once: every candidate reuses its ranges (ONNX Runtime's calibration cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import onnx

from unideploy.optimizers.base import Batch
from unideploy.optimizers.graph import intermediate_tensors

WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
FOLDED_ACTIVATIONS = ("Relu", "Clip")  # QDQ removes them into the layer before
SENSITIVITY_ROWS = 2  # rows the fp32 and INT8 models are compared on, all tensors kept in memory
MAX_TRIALS = 10


@dataclass
class SearchResult:
    path: Path | None  # the model within budget, else the candidate with the smallest drop (None: none tried)
    fp32_nodes: list[str]  # the layers kept in fp32
    within_budget: bool
    trials: list[dict[str, Any]] = field(default_factory=list)  # {"fp32_layers", "drop_points", "within_budget"}


def rank_layers(float_model: Path, int8_model: Path, rows: Batch, workdir: Path) -> list[tuple[str, float]]:
    """Weighted layers of ``float_model``, most sensitive first, with the SQNR (dB) each loses."""
    from onnxruntime.quantization import qdq_loss_debug as debug

    matching = debug.create_activation_matching(intermediate_tensors(int8_model, rows, workdir),
                                                intermediate_tensors(float_model, rows, workdir))
    errors = debug.compute_activation_error(matching)
    sqnr = {name: e["xmodel_err"] for name, e in errors.items() if e.get("xmodel_err") is not None}

    graph = onnx.load(str(float_model), load_external_data=False).graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for tensor in node.input:
            consumers.setdefault(tensor, []).append(node)
    ranked = []
    for node in graph.node:
        if node.op_type not in WEIGHTED_OPS:
            continue
        output = node.output[0]
        while len(consumers.get(output, [])) == 1 and consumers[output][0].op_type in FOLDED_ACTIVATIONS:
            output = consumers[output][0].output[0]
        inputs = [sqnr[t] for t in node.input if t in sqnr]
        if output in sqnr:
            # a layer fed only by the model's inputs or by weights starts from the inputs' own SQNR
            ranked.append((node.name, (min(inputs) if inputs else sqnr.get(node.input[0], 0.0)) - sqnr[output]))
    return sorted(ranked, key=lambda item: -item[1])


def search(ranked: list[str], build: Callable[[list[str]], Path], judge: Callable[[Path], dict[str, Any]],
           say: Callable[[str], None]) -> SearchResult:
    """The fewest leading layers of ``ranked`` to keep in fp32 for the model to fit the budget:
    doubling until it fits, then bisecting between the last count over budget and the first within.
    When nothing fits, the candidate with the smallest drop goes to the guard, which refuses it."""
    trials: list[dict[str, Any]] = []
    tried: dict[int, tuple[Path, float, bool]] = {}

    def fits(count: int) -> bool:
        say(f"INT8 with the {count} most sensitive layer(s) in fp32")
        path = build(ranked[:count])
        accuracy = judge(path)
        tried[count] = (path, float(accuracy["drop_points"]), bool(accuracy["within_budget"]))
        trials.append({"fp32_layers": count, "drop_points": accuracy["drop_points"],
                       "within_budget": bool(accuracy["within_budget"])})
        return tried[count][2]

    most = len(ranked) - 1  # at least one layer stays INT8, or there is nothing to quantize
    over, count = 0, 1
    while count < most and len(trials) < MAX_TRIALS - 1 and not fits(count):
        over, count = count, count * 2
    within = min((c for c, (_, _, ok) in tried.items() if ok), default=None)
    if within is None and most > over and fits(most):
        within = most
    if within is None:
        if not tried:
            return SearchResult(None, [], False, trials)
        best = min(tried, key=lambda c: tried[c][1])
        return SearchResult(tried[best][0], ranked[:best], False, trials)
    while within - over > max(1, within // 8) and len(trials) < MAX_TRIALS:
        middle = (over + within) // 2
        if fits(middle):
            within = middle
        else:
            over = middle
    return SearchResult(tried[within][0], ranked[:within], True, trials)
