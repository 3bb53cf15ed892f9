"""Accuracy-driven optimization: leave the layers an optimization hurts most as they were, until
the accuracy budget holds. INT8 and FP16 keep them in fp32; pruning leaves them dense.

The error an optimization adds to a real network rarely comes from one place; it builds up layer
by layer, and a few layers (a projection without an activation after it, the stem convolution,
the layer before a detector's head) add much more of it than the rest. ONNX Runtime's QDQ
debugging tools run the original and the optimized model side by side on calibration rows and
give, for every tensor, its signal-to-noise ratio (SQNR) against the original. A node's
*sensitivity* is the SQNR it loses: the worst SQNR of its inputs minus the SQNR of its output
(after the Relu/Clip it feeds, which QDQ folds into it). INT8 layers lose it to their int8
weights, and a Concat or an Add of inputs with different ranges when its output is requantized to
the widest of them; FP16 layers lose it to half precision's rounding; pruned layers lose it to
the weights they no longer have.

The guard's search (``guard/search.py``) then restores the most sensitive layers, 1, 2, 4, 8, ...
of them, each candidate judged by the same accuracy guard as the final model, and narrows the
count down by bisection, so the fewest layers give the optimization up (at most half of them: an
"INT8" model mostly in fp32, a "pruned" model mostly dense, is refused).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from unideploy.guard.measure import timing_session
from unideploy.guard.search import SearchResult, search
from unideploy.onnx.graph import consumers
from unideploy.optimizers.base import Batch, PassContext
from unideploy.optimizers.graph import intermediate_tensors
from unideploy.samples import take_rows

FOLDED_ACTIVATIONS = ("Relu", "Clip")  # QDQ removes them into the layer before
SENSITIVITY_ROWS = 2  # rows the two models are compared on, with every tensor kept in memory
PRUNING_TRIALS = 6  # each pruning candidate may need a re-fit
SEARCH_REFIT_SECONDS = 480.0  # the re-fits of a pruning search's candidates, together, at most this long
MIN_REFIT_TRIALS = 3  # fewer re-fitted candidates than this: candidates are judged without one
EXACT_DB = 80.0  # an SQNR above this is as good as exact (float rounding), not worth telling apart
TINY = 1e-30


def comparison_rows(ctx: PassContext) -> Batch:
    """The first calibration rows, as few as the model's batch size allows, cut along each input's
    batch axis (a recurrent state ``[layers, batch, hidden]`` has its rows on axis 1)."""
    rows = ctx.calibration[0]
    return rows if ctx.fixed_batch is not None else take_rows(rows, 0, SENSITIVITY_ROWS, ctx.signature.batch_axes)


def sqnr_db(expected: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Signal-to-noise ratio of ``got`` against ``expected`` in dB, at most ``EXACT_DB``. In float64:
    an fp16 tensor's norm overflows half precision; a value that became inf or NaN is all noise."""
    want = np.concatenate([np.asarray(a, np.float64).ravel() for a in expected])
    have = np.concatenate([np.asarray(a, np.float64).ravel() for a in got])
    noise = float(np.linalg.norm(want - have))
    if not np.isfinite(noise):
        return -EXACT_DB
    signal = float(np.linalg.norm(want))
    if noise <= TINY * max(signal, 1.0):
        return EXACT_DB
    return min(20 * math.log10(max(signal, TINY) / noise), EXACT_DB)


def rank_layers(
    original: Path, optimized: Path, rows: Batch, workdir: Path, op_types: list[str] | tuple[str, ...] | None
) -> list[tuple[str, float]]:
    """Nodes of ``original`` of the optimized ``op_types`` (None: all), most sensitive first, with
    the SQNR (dB) each loses in ``optimized``."""
    from onnxruntime.quantization import qdq_loss_debug as debug

    after, before = intermediate_tensors(optimized, rows, workdir), intermediate_tensors(original, rows, workdir)
    # a QDQ model's tensors are matched to the original's through their Q/DQ pairs; others by name
    errors = debug.compute_activation_error(debug.create_activation_matching(after, before), err_func=sqnr_db)
    sqnr = {name: e["xmodel_err"] for name, e in errors.items() if e.get("xmodel_err") is not None}
    for name in (before.keys() & after.keys()) - sqnr.keys():
        sqnr[name] = sqnr_db(before[name], after[name])

    graph = onnx.load(str(original), load_external_data=False).graph
    readers = consumers(graph)
    ranked = []
    for node in graph.node:
        if (op_types is not None and node.op_type not in op_types) or not node.output:
            continue
        output = node.output[0]
        while len(readers.get(output, [])) == 1 and readers[output][0].op_type in FOLDED_ACTIVATIONS:
            output = readers[output][0].output[0]
        inputs = [sqnr[t] for t in node.input if t in sqnr]
        if output in sqnr and inputs:
            ranked.append((node.name, min(inputs) - sqnr[output]))
    return sorted(ranked, key=lambda item: -item[1])


def rank_alone(
    original: Path, units: list[str], build_alone: Callable[[str], Path], rows: Batch, workdir: Path
) -> list[tuple[str, float]]:
    """``units`` most sensitive first, each with the output SQNR (dB) the model loses when only
    that unit is optimized. For optimizations that change tensor shapes (removing channels), whose
    tensors cannot be matched to the original's one by one."""
    expected = timing_session(Path(original)).run(None, rows)
    losses = []
    for unit in units:
        path = build_alone(unit)
        got = timing_session(path).run(None, rows)
        path.unlink()
        worst = min(sqnr_db([e], [g]) for e, g in zip(expected, got))
        losses.append((unit, EXACT_DB - worst))
    return sorted(losses, key=lambda item: -item[1])


def search_refitted(
    ranked: list[str],
    build: Callable[[list[str], bool], Path],
    refitted: bool,
    refit_seconds: float,
    ctx: PassContext,
    what: str,
) -> SearchResult:
    """``search`` for pruning, where each candidate should be re-fitted (``build(restored, refit)``).

    A re-fit makes up for the pruned layers before it, so a candidate judged without one looks far
    worse than it is (EfficientNet-Lite0 at 30 %: 25 points lost against 9-12 re-fitted). Each
    candidate is re-fitted from the original, as many candidates as ``SEARCH_REFIT_SECONDS`` pays
    for (at most ``PRUNING_TRIALS``). Where that is fewer than ``MIN_REFIT_TRIALS``, candidates are
    judged without it and the one chosen (the first within budget, else the closest) is re-fitted
    and judged again: kept if it fits, or if none did and it comes closer, so that a refusal gives
    the numbers of what a re-fit reaches. Where one re-fit alone takes longer than that, the
    candidate stays as judged, without one."""
    affordable = int(SEARCH_REFIT_SECONDS // max(refit_seconds, 1e-3)) if refitted else 0
    refit_each = affordable >= MIN_REFIT_TRIALS
    trials = min(PRUNING_TRIALS, affordable) if refit_each else PRUNING_TRIALS
    result = search(ranked, lambda restored: build(restored, refit_each), ctx.judge, ctx.say, what, trials)
    if result.path is not None and refitted and not refit_each and refit_seconds <= SEARCH_REFIT_SECONDS:
        ctx.say(f"re-fitting the chosen candidate ({len(result.restored)} left as they were)")
        path = build(result.restored, True)
        judged = ctx.judge(path)
        chosen = next(t["drop_points"] for t in result.trials if t["restored"] == len(result.restored))
        if judged["within_budget"] or (not result.within_budget and judged["drop_points"] < chosen):
            result.path, result.within_budget = path, bool(judged["within_budget"])
    return result
