"""ONNX graph helpers for the optimizer passes: every activation of a model, and, for pruning,
linear layers as matrices and their reconstruction.

No maintained library prunes ONNX graphs (nncf and torch-pruning work on nn.Modules), so the
passes edit initializers directly. Without retraining, accuracy is recovered the way OBC/SparseGPT
do it: each pruned layer's remaining weights are re-fitted by least squares so that, on
calibration data, the layer reproduces the *original* model's layer output from the *pruned*
model's activations. Layers are re-fitted in graph order, so each one also absorbs the error of
those before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from unideploy.guard.measure import timing_session
from unideploy.onnx.graph import cut, upstream
from unideploy.onnx.interface import rename_values
from unideploy.onnx.precision import rounded_like
from unideploy.optimizers.base import Batch
from unideploy.optimizers.layer_inputs import LayerInputs

DAMPINGS = (1e-3, 1e-2, 1e-1, 1.0)  # pulls toward the pruned weights tried, relative to the mean diagonal
HOLDOUT_EVERY = 5  # every 5th row of a layer's re-fit data is held out to choose the damping
TIE_RELATIVE = 1e-3  # a weaker pull is chosen only if its held-out error is lower by more than this share
TIE_OF_SIGNAL = 1e-9  # ... and by more than this share of the held-out outputs' energy (rounding, input noise)
CHOICE_ROWS = 32  # output rows the damping is chosen on (each distinct mask costs a solve)
REFIT_ROWS = 512  # calibration rows used for re-fitting (more costs time, rarely accuracy)
# A layer's re-fit reads at most this many rows of its input per input it has (and at least
# REFIT_MIN_POSITIONS): a convolution gives a row per output position, and a full-resolution layer
# of a 640x640 text detector gave 3.3 million rows over 8 images for 97 inputs, where 65,536 rows
# sampled over the stream determine the same least squares (docs/optimizers.md).
REFIT_ROWS_PER_INPUT = 64
REFIT_MIN_POSITIONS = 65536
_SPREAD = 2654435761  # Knuth's multiplicative hash: which rows are sampled, whatever the batching
SHARED_MASKS = 4  # rows per distinct mask from which rows are solved per mask, not each on its own
# The widest layer re-fitted, in inputs (a convolution's channels x kernel taps, and its bias): its
# least-squares systems are inputs x inputs float64, about six alive at once (8,193: 0.5 GB each,
# two minutes on 2 cores, mostly one inversion per damping tried). CREPE's 1,024-channel 64-tap
# convolution (65,537) would need 32 GB each; wider layers keep their pruned weights, and the pass
# records which.
REFIT_MAX_INPUTS = 8193
TOO_WIDE = f"more than {REFIT_MAX_INPUTS:,} inputs each, their pruned weights kept as they are (REFIT_MAX_INPUTS)"


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {init.name: init for init in model.graph.initializer}


def get_array(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(initializers(model)[name])


def set_array(model: onnx.ModelProto, name: str, array: np.ndarray) -> None:
    initializers(model)[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), name))


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every node a unique name, so nodes can be selected and matched across copies."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    return model


def plain_tensor_names(model: onnx.ModelProto) -> None:
    """Name every tensor inside the graph ``t<N>_`` (its inputs and outputs keep their names).

    ONNX Runtime's quantizer names what it writes after the tensors it quantizes, with suffixes
    and counters appended; tf2onnx's names end in counters of their own, and on Basic Pitch's
    graph a Conv's output (its bias's name plus "2") met one of the quantizer's names: the
    quantized model read the 36-value bias where the Conv's output had been, and did not load.
    Names ending in '_' cannot be made from one another by appending digits."""
    kept = {v.name for v in (*model.graph.input, *model.graph.output)}
    inner = dict.fromkeys(
        name
        for name in (*(i.name for i in model.graph.initializer), *(o for n in model.graph.node for o in n.output))
        if name and name not in kept
    )
    rename_values(model, {name: f"t{i}_" for i, name in enumerate(inner)})


def gemm_to_matmul(model: onnx.ModelProto) -> int:
    """Rewrite plain Gemm nodes (weight initializer, no transA, alpha = beta = 1) as MatMul + Add.

    onnxruntime's dynamic quantizer handles MatMul but not Gemm, which is how exporters write a 2-D
    Linear layer; without this, dynamic INT8 of a classifier head quantizes nothing. Returns how
    many nodes were rewritten.
    """
    inits = initializers(model)
    rewritten, nodes = 0, []
    for node in model.graph.node:
        a = attributes(node)
        if (
            node.op_type != "Gemm"
            or len(node.input) < 2
            or node.input[1] not in inits
            or a.get("transA", 0)
            or a.get("alpha", 1.0) != 1.0
            or a.get("beta", 1.0) != 1.0
        ):
            nodes.append(node)
            continue
        weight = node.input[1]
        if a.get("transB", 0):
            transposed = f"{weight}_transposed"
            model.graph.initializer.append(
                numpy_helper.from_array(np.ascontiguousarray(get_array(model, weight).T), transposed)
            )
            weight = transposed
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}_matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{node.name}_matmul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}_bias"))
        rewritten += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return rewritten


def load_for_pruning(path: Path) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The model to edit and an untouched copy to re-fit against, with every node uniquely named
    (layers are matched by name across the two)."""
    model = name_nodes(onnx.load(str(path)))
    original = onnx.ModelProto()
    original.CopyFrom(model)
    return model, original


@dataclass
class Layer:
    """A Conv, ConvTranspose, Gemm or MatMul whose weight is an initializer, seen as a [out, K]
    matrix: a convolution's K is its input channels x kernel taps, a transposed convolution's the
    same taps of the convolution it equals (below)."""

    node: onnx.NodeProto
    kind: str  # "conv", "conv_transpose", "gemm" or "matmul"
    weight: str
    bias: str | None
    trans_b: bool = False

    @property
    def convolution(self) -> bool:
        """Whether the layer slides a kernel over positions (its input features are channels on axis 1)."""
        return self.kind in ("conv", "conv_transpose")

    def matrix(self, model: onnx.ModelProto) -> np.ndarray:
        w = get_array(model, self.weight)
        if self.kind == "conv_transpose":  # [in, out, taps...] -> the equal convolution's [out, in, taps reversed]
            w = np.flip(w, axis=tuple(range(2, w.ndim))).swapaxes(0, 1)
        if self.convolution:
            return w.reshape(w.shape[0], -1)
        return w if self.trans_b else w.T

    def store(self, model: onnx.ModelProto, matrix: np.ndarray, bias: np.ndarray | None) -> None:
        replaced = get_array(model, self.weight)
        shape = replaced.shape
        if self.kind == "conv_transpose":
            w = matrix.reshape(shape[1], shape[0], *shape[2:]).swapaxes(0, 1)
            w = np.flip(w, axis=tuple(range(2, w.ndim)))
        elif self.kind == "conv":
            w = matrix.reshape(shape)
        else:
            w = matrix if self.trans_b else matrix.T
        # in the precision of the weights they replace (rounded_like): an fp16 model's stay fp16-precise
        set_array(model, self.weight, rounded_like(w, replaced))
        if bias is not None and self.bias:
            set_array(model, self.bias, rounded_like(bias, get_array(model, self.bias)))

    def columns(self, x: np.ndarray, model: onnx.ModelProto) -> Columns:
        """The layer's input as rows of K features, not yet copied: for a convolution of any
        dimension, each output position's window of taps (im2col), dilated and padded as the node
        computes it.

        A transposed convolution is the convolution, stride 1, of its input spread out by its
        stride (stride - 1 zeros between values) and padded by the dilated kernel's reach less its
        own pads (``output_padding`` at the end), with the kernel reversed and its channel axes
        swapped (``matrix``)."""
        if not self.convolution:
            return Columns(x, x.ndim - 1)
        kernel = get_array(model, self.weight).shape[2:]
        dims, a = len(kernel), attributes(self.node)
        strides, dilations = a.get("strides", [1] * dims), a.get("dilations", [1] * dims)
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]  # the input a dilated window covers
        if self.kind == "conv_transpose":
            spread = np.zeros((*x.shape[:2], *((n - 1) * s + 1 for n, s in zip(x.shape[2:], strides))), x.dtype)
            spread[_every(strides)] = x
            own = a.get("pads", [0] * 2 * dims)
            extra = a.get("output_padding", [0] * dims)
            pads = [span - 1 - p for span, p in zip(spans, own[:dims])]
            pads += [span - 1 - p + e for span, p, e in zip(spans, own[dims:], extra)]
            x, strides = spread, [1] * dims
        else:
            pads = conv_pads(a, x.shape[2:], spans, strides)
        padded = _padded(x, pads[:dims], pads[dims:])
        windows = np.lib.stride_tricks.sliding_window_view(padded, spans, axis=tuple(range(2, 2 + dims)))
        windows = windows[_every([*strides, *dilations])]  # positions a stride apart, taps a dilation apart
        # rows: image, then position; columns: channel, then tap (the weight's own order)
        return Columns(windows.transpose(0, *range(2, 2 + dims), 1, *range(2 + dims, 2 + 2 * dims)), 1 + dims)


@dataclass(frozen=True)
class Columns:
    """A layer's input as rows of K features, a view: ``grid``'s first ``lead`` axes index the rows,
    its others the features, in order. Rows are copied (in float64, for the least squares) only
    when taken, and only those taken: a re-fit samples a full-resolution layer's rows."""

    grid: np.ndarray
    lead: int

    @property
    def count(self) -> int:
        return int(np.prod(self.grid.shape[: self.lead]))

    def rows(self, picked: np.ndarray | None = None) -> np.ndarray:
        """Every row, or those at the indices ``picked``, as a [rows, K] float64 matrix."""
        if picked is None:
            taken = self.grid.reshape(self.count, -1)
        else:
            taken = self.grid[np.unravel_index(picked, self.grid.shape[: self.lead])].reshape(len(picked), -1)
        return taken.astype(np.float64)


def _every(steps: list[int]) -> tuple[Any, ...]:
    """An index taking every ``steps[i]``-th value along each of the last ``len(steps)`` axes."""
    return (..., *(slice(None, None, step) for step in steps))


def _padded(x: np.ndarray, begins: list[int], ends: list[int]) -> np.ndarray:
    """``x`` padded with zeros along its spatial axes (after the first two); a negative pad crops
    (a transposed convolution's own pads beyond its kernel's reach)."""
    x = np.pad(x, ((0, 0), (0, 0), *((max(b, 0), max(e, 0)) for b, e in zip(begins, ends))))
    crop = (slice(max(-b, 0), n - max(-e, 0)) for b, e, n in zip(begins, ends, x.shape[2:]))
    return x[(slice(None), slice(None), *crop)]


def conv_pads(a: dict, sizes: tuple[int, ...], spans: list[int], strides: list[int]) -> list[int]:
    """A convolution's padding, beginnings then ends (ONNX's ``pads``), from ``auto_pad`` where it
    is set: SAME_* pads so that the output has ceil(size / stride) positions, the odd one at the end
    (UPPER) or the beginning (LOWER), as ONNX Runtime does."""
    mode = _auto_pad(a)
    if mode == "NOTSET":
        return list(a.get("pads", [0] * 2 * len(sizes)))
    if mode == "VALID":
        return [0] * 2 * len(sizes)
    totals = [max((-(-n // s) - 1) * s + span - n, 0) for n, s, span in zip(sizes, strides, spans)]
    small = [t // 2 for t in totals]
    begins = small if mode == "SAME_UPPER" else [t - h for t, h in zip(totals, small)]
    return begins + [t - b for t, b in zip(totals, begins)]


def _auto_pad(a: dict) -> str:
    mode = a.get("auto_pad", b"NOTSET")
    return mode.decode() if isinstance(mode, bytes) else mode


def linear_layers(model: onnx.ModelProto) -> list[Layer]:
    """Layers the pruning passes can edit and re-fit, in graph order.

    Taken: convolutions of any dimension (1-D audio, 2-D images, 3-D video), dilated or padded in any
    way, and transposed ones (a decoder's upsampling) padded explicitly. Skipped, left dense
    (``left_dense`` says why): grouped convolutions (a depthwise one's taps are not a matrix product
    across channels; channel pruning carries its channels through), transposed convolutions sized
    by ``output_shape`` or SAME padding, Gemm with transA/alpha/beta, MatMul whose weight is not a
    2-D initializer.
    """
    inits = initializers(model)
    layers = []
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in inits:
            continue
        a = attributes(node)
        bias = node.input[2] if len(node.input) > 2 and node.input[2] in inits else None
        dims = len(inits[node.input[1]].dims)
        if node.op_type == "Conv" and dims >= 3 and a.get("group", 1) == 1:
            layers.append(Layer(node, "conv", node.input[1], bias))
        elif node.op_type == "ConvTranspose" and dims >= 3 and a.get("group", 1) == 1 and _sized_by_pads(a):
            layers.append(Layer(node, "conv_transpose", node.input[1], bias))
        elif (
            node.op_type == "Gemm"
            and dims == 2
            and not a.get("transA", 0)
            and a.get("alpha", 1.0) == 1.0
            and a.get("beta", 1.0) == 1.0
        ):
            layers.append(Layer(node, "gemm", node.input[1], bias, bool(a.get("transB", 0))))
        elif node.op_type == "MatMul" and dims == 2:
            layers.append(Layer(node, "matmul", node.input[1], None))
    return layers


def _sized_by_pads(a: dict) -> bool:
    """Whether a transposed convolution's output size follows from its pads alone."""
    return "output_shape" not in a and _auto_pad(a) in ("NOTSET", "VALID")


WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # the operators whose weights pruning edits


RECURRENT = ("LSTM", "GRU", "RNN")  # their input (W) and recurrence (R) weights pruning does not edit


def _not_edited(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """Each layer whose float weights pruning leaves as they were, as (kind, weights): weighted
    layers (``WEIGHTED``) that ``linear_layers`` does not take, named by why ("grouped
    convolution"); recurrent layers (their W and R); embedding tables (a Gather of a float
    initializer's rows)."""
    inits, taken = initializers(model), {tuple(layer.node.output) for layer in linear_layers(model)}

    def size(name: str) -> int:
        return math.prod(inits[name].dims) if name in inits else 0

    found = []
    for node in model.graph.node:
        if node.op_type in RECURRENT and size(node.input[1]):
            found.append((node.op_type, size(node.input[1]) + size(node.input[2])))
        elif (
            node.op_type == "Gather"
            and node.input[0] in inits
            and inits[node.input[0]].data_type == onnx.TensorProto.FLOAT
        ):
            found.append(("embedding", size(node.input[0])))
        elif node.op_type in WEIGHTED and len(node.input) >= 2 and node.input[1] in inits:
            if tuple(node.output) in taken:
                continue
            if node.op_type == "Conv":
                kind = "grouped convolution"
            elif node.op_type == "ConvTranspose":
                grouped = attributes(node).get("group", 1) != 1
                kind = (
                    "grouped transposed convolution"
                    if grouped
                    else "transposed convolution sized by output_shape or SAME"
                )
            elif node.op_type == "Gemm":
                kind = "Gemm with transA, alpha or beta"
            else:
                kind = f"MatMul with a {len(inits[node.input[1]].dims)}-D weight"
            found.append((kind, size(node.input[1])))
    return found


def left_dense(model: onnx.ModelProto) -> list[str]:
    """Why each layer with float weights that pruning does not edit is left out, as a short kind
    ("grouped convolution", "LSTM", "embedding"), one per layer: what a refusal counts where none is left."""
    return [kind for kind, _ in _not_edited(model)]


def not_pruned(model: onnx.ModelProto) -> dict[str, dict[str, float]]:
    """The float weights pruning leaves as they were, by kind: layers, weights, and their share of
    all the model's float weights. A model whose weights are mostly in layers it does not edit (an
    LSTM language model, a transformer's embedding table) is pruned far less than the sparsity asked
    for suggests, and its record says so."""
    total = sum(math.prod(t.dims) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT)
    by_kind: dict[str, dict[str, float]] = {}
    for kind, weights in _not_edited(model):
        entry = by_kind.setdefault(kind, {"layers": 0, "weights": 0})
        entry["layers"] += 1
        entry["weights"] += weights
    for entry in by_kind.values():
        entry["share"] = round(entry["weights"] / max(total, 1), 4)
    return by_kind


def computing(model: onnx.ModelProto, tensors: list[str]) -> Any:
    """A session computing ``tensors`` of ``model``, and only the nodes they depend on. ONNX
    Runtime runs every node of a graph whatever outputs are asked for, and the re-fit asks for one
    layer's input at a time: cut there, an early layer costs a fraction of a whole pass."""
    return timing_session(cut(model, upstream(model.graph, tensors), model.graph.input, tensors).SerializeToString())


def input_statistics(
    model: onnx.ModelProto, layers: list[Layer], batches: list[Batch]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Mean and variance of every input feature of each layer on ``batches`` (per channel for a
    convolution, over the batch and positions; per last-axis feature for Gemm/MatMul): layer
    name -> (mean, variance)."""
    tensors = [layer.node.input[0] for layer in layers]
    spatial = {layer.node.input[0]: layer.convolution for layer in layers}
    session = computing(model, tensors)
    sums: dict[str, list] = {t: [0.0, 0.0, 0] for t in tensors}
    for batch in batches:
        for tensor, x in zip(tensors, session.run(tensors, batch)):
            x = x.astype(np.float64)
            features = np.moveaxis(x, 1, -1).reshape(-1, x.shape[1]) if spatial[tensor] else x.reshape(-1, x.shape[-1])
            total = sums[tensor]
            total[0], total[1], total[2] = (
                total[0] + features.sum(0),
                total[1] + (features**2).sum(0),
                total[2] + len(features),
            )
    out = {}
    for layer, tensor in zip(layers, tensors):
        first, second, count = sums[tensor]
        mean = first / max(count, 1)
        out[layer.node.name] = (mean, np.maximum(second / max(count, 1) - mean**2, 0.0))
    return out


def refit(
    original_inputs: LayerInputs,
    pruned_inputs: LayerInputs,
    layer_name: str,
    mask: np.ndarray,
    out_rows: np.ndarray | None = None,
) -> bool:
    """Re-fit one layer of ``pruned_inputs.model`` (weights outside ``mask`` stay zero) to reproduce
    ``original_inputs.model``'s layer output on the batches both compute; updates the pruned model in
    place (layers are re-fitted in graph order: ``LayerInputs``). ``out_rows`` says which
    original output channels the pruned layer still has (all, unless channels were removed).
    False, changing nothing, where the layer has more than ``REFIT_MAX_INPUTS`` inputs.

    The solution is pulled toward the layer's pruned weights by a damping chosen on held-out rows
    (``DAMPINGS``); where no damping beats the pruned weights on them, those stay. A layer fed by
    few calibration rows (a classifier on 32 images, a late 7x7 convolution) would otherwise fit
    them exactly and generalise worse than it started."""
    original, pruned = original_inputs.model, pruned_inputs.model
    layer_o = next(layer for layer in linear_layers(original) if layer.node.name == layer_name)
    layer_p = next(layer for layer in linear_layers(pruned) if layer.node.name == layer_name)
    w_orig = layer_o.matrix(original).astype(np.float64)
    prior = layer_p.matrix(pruned).astype(np.float64)
    with_bias = layer_p.bias is not None
    if layer_o.bias is not None and layer_p.bias is not None:
        w_orig = np.hstack([w_orig, get_array(original, layer_o.bias)[:, None]])
        prior = np.hstack([prior, get_array(pruned, layer_p.bias)[:, None]])
    if out_rows is not None:
        w_orig = w_orig[out_rows]
    if w_orig.shape[1] > REFIT_MAX_INPUTS:
        return False
    keep = np.hstack([mask, np.ones((mask.shape[0], 1), bool)]) if with_bias else mask
    sample = np.unique(np.linspace(0, len(keep) - 1, min(CHOICE_ROWS, len(keep))).astype(int))
    sums: dict[str, list[Any]] = {"fit": [0.0, 0.0], "held": [0.0, 0.0]}  # A_p^T A_p and A_p^T A_o of each part
    signal, seen = 0.0, 0  # ||Y_held||^2 on the sample's output rows; rows streamed so far
    every, offered = 0, 0  # sample one row in ``every`` (0: not known yet); rows offered so far
    for x_o, x_p in zip(original_inputs(layer_o.node.input[0]), pruned_inputs(layer_p.node.input[0])):
        columns_o, columns_p = layer_o.columns(x_o, original), layer_p.columns(x_p, pruned)
        every = every or _sampling(columns_o.count, pruned_inputs.batches, w_orig.shape[1])
        picked = _sampled(offered, columns_o.count, every)
        offered += columns_o.count
        a_o, a_p = columns_o.rows(picked), columns_p.rows(picked)
        if with_bias:
            a_o, a_p = (np.hstack([a, np.ones((a.shape[0], 1))]) for a in (a_o, a_p))
        # counted over the whole stream: a batch-1 model's pooled or final layer gets one row a batch,
        # and counted per batch every such row was held out, leaving nothing to fit
        held = (seen + np.arange(len(a_p))) % HOLDOUT_EVERY == 0
        seen += len(a_p)
        for part, rows in (("fit", ~held), ("held", held)):
            taken = a_p[rows]  # one copy, whose product with itself NumPy computes as symmetric (half the work)
            sums[part][0] = sums[part][0] + taken.T @ taken
            sums[part][1] = sums[part][1] + taken.T @ a_o[rows]
        signal += float(np.square(a_o[held] @ w_orig[sample].T).sum())
    (gram_fit, cross_fit), (gram_held, cross_held) = sums["fit"], sums["held"]
    target_fit, target_held = cross_fit @ w_orig.T, cross_held @ w_orig.T  # A_p^T Y, every output row at once

    def held_error(w: np.ndarray, rows: np.ndarray) -> float:  # ||A_held w^T - Y_held||^2
        return signal + float(((w @ gram_held) * w).sum() - 2 * np.einsum("rk,kr->", w, target_held[:, rows]))

    errors: dict[float | None, float] = {None: held_error(prior[sample], sample)}  # the strongest pull first
    for damping in sorted(DAMPINGS, reverse=True):
        errors[damping] = held_error(_solve(gram_fit, target_fit, prior, keep, damping, sample), sample)
    best = _strongest_within_noise(errors, signal)
    if best is None:
        return True  # no re-fit generalises better than the pruned weights
    solved = _solve(gram_fit + gram_held, target_fit + target_held, prior, keep, best, np.arange(len(keep)))
    layer_p.store(pruned, solved[:, :-1] if with_bias else solved, solved[:, -1] if with_bias else None)
    return True


def _sampling(first_rows: int, batches: list[Batch], inputs: int) -> int:
    """One row in how many the re-fit reads (1: all), from the first batch's rows scaled to the
    whole stream's calibration rows (so that any batching of the same rows samples alike) and the
    rows the layer's ``inputs`` need (``REFIT_ROWS_PER_INPUT``, ``REFIT_MIN_POSITIONS``)."""
    samples = [len(next(iter(batch.values()))) for batch in batches]
    total = first_rows * sum(samples) // max(samples[0], 1)
    return max(1, total // max(REFIT_ROWS_PER_INPUT * inputs, REFIT_MIN_POSITIONS))


def _sampled(offered: int, count: int, every: int) -> np.ndarray | None:
    """Which of the next ``count`` rows of the stream (``offered`` before them) the re-fit reads:
    one in ``every``, spread by a hash of their place in the stream (a stride would pick the same
    columns of every image row where it divides the width); None: all of them."""
    if every == 1:
        return None
    places = (np.arange(offered, offered + count, dtype=np.uint64) * np.uint64(_SPREAD)) % np.uint64(2**32)
    return np.flatnonzero(places < np.uint64(2**32 // every))


def _strongest_within_noise(errors: dict[float | None, float], signal: float) -> float | None:
    """The strongest pull (``errors`` is ordered strongest first, None: the pruned weights kept)
    whose held-out error is within ``TIE_RELATIVE`` of the least, or within what rounding and
    float32 noise in the layer's input move it by (``TIE_OF_SIGNAL`` of the outputs' energy).

    Held-out rows cannot tell apart errors closer than that, and picking the lowest among them
    picked at random: two runs whose inputs differed by 5e-8 (ONNX Runtime fusing a segment's nodes
    otherwise than the whole model's) chose other dampings, and every layer after followed."""
    least = min(errors.values())
    return next(d for d, e in errors.items() if e <= least + TIE_RELATIVE * abs(least) + TIE_OF_SIGNAL * signal)


def too_wide(name: str, say: Callable[[str], None]) -> str:
    """Say that layer ``name`` keeps its pruned weights for want of memory; its name, to record."""
    say(f"layer {name} is not re-fitted: {TOO_WIDE}")
    return name


def not_refitted(layers: list[str]) -> dict[str, Any]:
    """The pass's record of the layers too wide to re-fit (none: empty)."""
    return {"not_refitted": {"layers": layers, "why": TOO_WIDE}} if layers else {}


def _solve(
    gram: np.ndarray, target: np.ndarray, prior: np.ndarray, keep: np.ndarray, damping: float, rows: np.ndarray
) -> np.ndarray:
    """Least-squares weights for output ``rows`` (zero outside ``keep``), pulled toward ``prior``.

    Row r's kept weights solve (G_SS + pI) w_S = b_S over its kept inputs S. Rows sharing a mask
    (structured pruning) share one solve. An unstructured mask gives every row its own S: there
    the system is inverted once for all inputs, H = (G + pI)^-1, and each row's solution is pulled
    back to zero on its pruned inputs P by the Lagrange multipliers of w_P = 0:
    w = Hb - H[:, P] (H_PP)^-1 (Hb)_P. Where fewer inputs are pruned than kept (sparsity under
    50 %) that solves a |P|-sized system per row instead of |S| (at 30 %, 12x fewer operations).
    Each row's system is taken out of H (or G + pI) on its own and solved by Cholesky (both are
    symmetric positive definite): gathering every row's block in one indexing operation, and H's
    rows for the correction, moved gigabytes (MiniLM's 1,536-input layer: 2.2 GB, 5 s a solve);
    the corrections of all rows are then one product with H."""
    pull = damping * max(float(np.mean(np.diag(gram))), 1e-12)
    system = gram + np.eye(len(gram)) * pull
    rhs = target[:, rows] + pull * prior[rows].T  # [K, rows]: b of every row
    masks = keep[rows]
    patterns, rows_of = np.unique(masks, axis=0, return_inverse=True)
    solved = np.zeros((len(rows), keep.shape[1]))
    if len(patterns) * SHARED_MASKS <= len(rows):
        for p, pattern in enumerate(patterns):
            mine = np.flatnonzero(rows_of.ravel() == p)
            if pattern.any():
                solved[np.ix_(mine, pattern)] = np.linalg.solve(
                    system[np.ix_(pattern, pattern)], rhs[np.ix_(pattern, mine)]
                ).T
        return solved
    pruned_counts = (~masks).sum(1)
    by_pruned = 2 * pruned_counts <= masks.shape[1]  # rows solved through the inverse
    inverse = np.linalg.inv(system) if by_pruned.any() else np.empty((0, 0))
    free = rhs.T @ inverse if by_pruned.any() else np.empty((0, 0))  # unconstrained solutions (H is symmetric)
    multipliers = np.zeros_like(solved)
    for r in range(len(rows)):
        if by_pruned[r] and pruned_counts[r]:
            pruned = np.flatnonzero(~masks[r])
            multipliers[r, pruned] = _positive_definite_solve(inverse.take(pruned, 0).take(pruned, 1), free[r, pruned])
        elif not by_pruned[r] and masks[r].any():
            kept = np.flatnonzero(masks[r])
            solved[r, kept] = _positive_definite_solve(system.take(kept, 0).take(kept, 1), rhs[kept, r])
    if by_pruned.any():
        solved[by_pruned] = free[by_pruned] - multipliers[by_pruned] @ inverse
    return solved * masks


def _positive_definite_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x with a x = b, for a symmetric positive definite (Cholesky: half the work of a general
    solve). A damped Gram matrix and its inverse's principal blocks are, short of NaNs."""
    from scipy.linalg import lapack

    _, x, info = lapack.dposv(a, b, lower=True, overwrite_a=True)
    if info != 0:
        raise np.linalg.LinAlgError(f"a re-fit's system is not positive definite (LAPACK posv: {info})")
    return x


# A layer's re-fitted weights (None: too wide to re-fit) by the masked layers up to it, in order
Refits = dict[tuple[str, ...], list[onnx.TensorProto] | None]


def refit_all(
    original: onnx.ModelProto,
    pruned: onnx.ModelProto,
    masks: dict[str, np.ndarray],
    batches: list[Batch],
    say: Callable[[str], None],
    memo: Refits | None = None,
) -> list[str]:
    """Re-fit every masked layer in graph order (see the module docstring), on ``batches`` (the
    first ``REFIT_ROWS`` calibration rows: ``PassContext.first_batches``); the layers too wide to
    re-fit (``REFIT_MAX_INPUTS``), which keep their pruned weights.

    ``memo``, one per pass (the same ``masks`` and ``batches``), keeps each layer's re-fit by the
    masked layers up to it: which layers before a layer are pruned decides its re-fit, so a search
    candidate that leaves only later layers dense takes it from there instead of solving it again
    (CREPE's 8,193-input convolution took two minutes a candidate)."""
    layers = {layer.node.name: layer for layer in linear_layers(pruned) if layer.node.name in masks}
    order, stored, kept = list(layers), initializers(pruned), []
    inputs_o, inputs_p = LayerInputs(original, batches), LayerInputs(pruned, batches)
    for i, name in enumerate(order, 1):
        key, layer = tuple(order[:i]), layers[name]
        tensors = [layer.weight] + ([layer.bias] if layer.bias else [])
        if memo is not None and key in memo:
            if (refitted := memo[key]) is None:
                kept.append(name)
            for tensor in refitted or ():
                stored[tensor.name].CopyFrom(tensor)
            continue
        say(f"re-fitting layer {i}/{len(order)} ({name})")
        done = refit(inputs_o, inputs_p, name, masks[name])
        if not done:
            kept.append(too_wide(name, say))
        if memo is not None:
            memo[key] = [_copy(stored[t]) for t in tensors] if done else None
    return kept


def _copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    return out


def intermediate_tensors(model_path: Path, rows: Batch, workdir: Path) -> dict[str, list[np.ndarray]]:
    """Every float tensor the model computes on ``rows`` (name -> [values]), through ONNX Runtime's
    QDQ debugging tools, whose names the quantization debugger matches between models."""
    from onnxruntime.quantization import qdq_loss_debug

    augmented = workdir / f"{model_path.stem}-all-tensors.onnx"
    qdq_loss_debug.modify_model_output_intermediate_tensors(str(model_path), str(augmented))
    try:
        return qdq_loss_debug.collect_activations(str(augmented), [rows])
    finally:
        augmented.unlink(missing_ok=True)
