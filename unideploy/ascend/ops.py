"""The ONNX -> MindSpore operator table: one small function per ONNX operator.

Each function reads the node's inputs (runtime tensors, or values known when the network is
generated) and attributes, and returns the Python expression (``mindspore.ops``) that computes
its outputs inside the generated Cell's ``construct``. ``docs/ascend-operators.md`` is generated
from this table (``python -m unideploy.ascend.docs``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from unideploy.errors import ExportError

# ONNX element type -> the MindSpore dtype spelt in generated code
MS_DTYPES = {
    TensorProto.FLOAT: "ms.float32",
    TensorProto.FLOAT16: "ms.float16",
    TensorProto.DOUBLE: "ms.float64",
    TensorProto.BFLOAT16: "ms.bfloat16",
    TensorProto.INT8: "ms.int8",
    TensorProto.INT16: "ms.int16",
    TensorProto.INT32: "ms.int32",
    TensorProto.INT64: "ms.int64",
    TensorProto.UINT8: "ms.uint8",
    TensorProto.BOOL: "ms.bool_",
}
INT64_MAX = np.iinfo(np.int64).max
LOWEST = float(np.finfo(np.float32).min)  # max pooling's padding value (generated code has no -inf)


@dataclass(frozen=True)
class Static:
    """A value known when the network is generated (initializers, constants, folded shapes)."""

    array: np.ndarray


class Ctx:
    """One ONNX node being translated. ``inputs`` holds, per input, the name of a tensor of the
    generated ``construct`` or a Static value (None: an omitted optional input)."""

    def __init__(self, network: Any, node: Any, inputs: list[str | Static | None]) -> None:
        self.net, self.node, self.inputs = network, node, inputs
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def is_static(self, i: int) -> bool:
        return isinstance(self.inputs[i], Static)

    def const(self, i: int, what: str = "") -> np.ndarray:
        value = self.inputs[i]
        if not isinstance(value, Static):
            self.fail(f"input {i}{f' ({what})' if what else ''} must be a constant, not a computed tensor")
        assert isinstance(value, Static)
        return value.array

    def ints(self, i: int, what: str = "") -> list[int]:
        return [int(v) for v in np.asarray(self.const(i, what)).reshape(-1)]

    def t(self, i: int) -> str:
        """Input ``i`` as an expression for a tensor (a constant becomes a frozen Parameter)."""
        value = self.inputs[i]
        if isinstance(value, Static):
            return self.net.parameter(value.array, self.node.input[i])
        assert value is not None
        return value

    def shape(self, i: int) -> tuple[int | None, ...] | None:
        """Input ``i``'s shape as ONNX shape inference knows it (None: a dynamic dim)."""
        value = self.inputs[i]
        if isinstance(value, Static):
            return tuple(value.array.shape)
        return self.net.shapes.get(self.node.input[i])

    def static_dims(self, i: int, what: str) -> list[int]:
        """Input ``i``'s shape where every dim must be known (kernels, normalized axes)."""
        shape = self.shape(i)
        if shape is None or any(d is None for d in shape):
            self.fail(f"the {what} must have a known, fixed shape")
        return [int(d) for d in shape or () if d is not None]

    def rank(self, i: int = 0) -> int:
        shape = self.shape(i)
        if shape is None:
            self.fail(f"the rank of input {i} is unknown (run ONNX shape inference on the model)")
        assert shape is not None
        return len(shape)

    def out_dtype(self, k: int = 0) -> str:
        elem = self.net.elem_types.get(self.node.output[k])
        if elem not in MS_DTYPES:
            self.fail(f"the type of output {k} is unknown or unsupported ({elem})")
        return MS_DTYPES[elem]

    def fail(self, why: str) -> None:
        raise ExportError(
            f"ONNX operator {self.node.op_type} ('{self.node.name or self.node.output[0]}') cannot be rebuilt in "
            f"MindSpore: {why}",
            "export with --target cpu or edge; the ONNX artifact runs everywhere ONNX Runtime does",
        )


Emit = Callable[[Ctx], "str | list[str]"]

# Functions the generated module defines beside the network (MindSpore compiles calls to them too).
SUPPORT = """
def lstm_direction(x, h0, c0, weights, input_size, hidden, reverse):
    if reverse:
        x = ops.ReverseV2((0,))(x)
    y, h, c, _, _ = ops.LSTM(input_size, hidden, 1, True, False, 0.0)(x, h0, c0, weights)
    if reverse:
        y = ops.ReverseV2((0,))(y)
    return ops.expand_dims(y, 1), h, c


def lstm_states(x, hidden, directions):
    return ops.tile(ops.zeros_like(x[0:1, :, 0:1]), (directions, 1, hidden))


def lstm(x, h0, c0, weights, input_size, hidden, reverse):
    return lstm_direction(x, h0, c0, weights, input_size, hidden, reverse)


def lstm_bidirectional(x, h0, c0, forward, backward, input_size, hidden):
    y1, h1, c1 = lstm_direction(x, h0[0:1], c0[0:1], forward, input_size, hidden, False)
    y2, h2, c2 = lstm_direction(x, h0[1:2], c0[1:2], backward, input_size, hidden, True)
    return ops.cat((y1, y2), 1), ops.cat((h1, h2), 0), ops.cat((c1, c2), 0)
"""


@dataclass(frozen=True)
class MsOp:
    name: str
    mindspore: str  # what it becomes, for the docs
    emit: Emit
    notes: str = ""


OPS: dict[str, MsOp] = {}


def op(*names: str, mindspore: str, notes: str = "") -> Callable[[Emit], Emit]:
    def register(fn: Emit) -> Emit:
        for name in names:
            OPS[name] = MsOp(name, mindspore, fn, notes)
        return fn

    return register


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _tuple(values: Sequence[int]) -> str:
    return "(" + "".join(f"{int(v)}, " for v in values).rstrip(" ") + ")"


# -- convolution, pooling, normalization -------------------------------------------------------
def _explicit_pads(
    ctx: Ctx, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> list[int] | None:
    """ONNX pads [begin..., end...] for the two spatial axes, auto_pad resolved; None for
    SAME_UPPER on a dynamic size, where they depend on the size: MindSpore's own "same" mode
    (TensorFlow's, the same rule) pads at run time then."""
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        return list(ctx.attr("pads", [0, 0, 0, 0])) if auto == "NOTSET" else [0, 0, 0, 0]
    shape = ctx.shape(0) or (None,) * 4
    dynamic = any(d is None for d in shape[2:])
    if dynamic and any(s != 1 for s in strides):
        if auto == "SAME_UPPER":
            return None
        ctx.fail(f"auto_pad {auto} with strides on a dynamic spatial size (give --input-shape, or pads in the model)")
    begin, end = [], []
    for size, k, s, d in zip(shape[2:], kernel, strides, dilations):
        # at stride 1 the padding does not depend on the size
        total = (k - 1) * d if s == 1 else max((-(-int(size or 0) // s) - 1) * s + (k - 1) * d + 1 - int(size or 0), 0)
        small, large = total // 2, total - total // 2
        begin.append(large if auto == "SAME_LOWER" else small)
        end.append(small if auto == "SAME_LOWER" else large)
    return begin + end


def _padded(ctx: Ctx, x: str, pads: list[int], value: float = 0.0) -> tuple[str, tuple[int, int] | None]:
    """Symmetric pads go to the operator; others through ops.pad first."""
    top, left, bottom, right = pads
    if top == bottom and left == right:
        return x, (top, left)
    return f"ops.pad({x}, {_tuple((left, right, top, bottom))}, value={value})", None


def _spatial2d(ctx: Ctx) -> None:
    if ctx.rank(0) != 4:
        ctx.fail(f"only 2-D (NCHW) is supported, not rank {ctx.rank(0)}")


@op(
    "Conv",
    mindspore="ops.Conv2D (+ ops.bias_add)",
    notes="2-D; groups (depthwise), dilation, pads and auto_pad. 1-D (NCL, audio) as 2-D of height 1, explicit pads",
)
def conv(ctx: Ctx) -> str:
    # the Conv2D primitive, not ops.conv2d: the functional form compiles shape checks that a
    # MindIR with a dynamic batch cannot infer once loaded, and it takes symmetric pads only
    if ctx.rank(0) == 3:
        return _conv1d(ctx)
    _spatial2d(ctx)
    weight = ctx.static_dims(1, "kernel")
    kernel = weight[2:]
    strides, dilations = ctx.attr("strides", [1, 1]), ctx.attr("dilations", [1, 1])
    pads = _explicit_pads(ctx, kernel, strides, dilations)
    padding = "pad_mode='same'"
    if pads is not None:
        top, left, bottom, right = pads
        padding = f"pad_mode='pad', pad={_tuple((top, bottom, left, right))}"
    expr = (
        f"ops.Conv2D({weight[0]}, {_tuple(kernel)}, {padding}, stride={_tuple(strides)}, "
        f"dilation={_tuple(dilations)}, group={ctx.attr('group', 1)})({ctx.t(0)}, {ctx.t(1)})"
    )
    return f"ops.bias_add({expr}, {ctx.t(2)})" if ctx.has(2) else expr


def _conv1d(ctx: Ctx) -> str:
    """A 1-D convolution (Silero VAD's, over audio) as a 2-D one of height 1: MindSpore's Conv1D
    has no CPU kernel, its Conv2D runs everywhere the 2-D models do."""
    if ctx.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        ctx.fail("a 1-D convolution's pads must be explicit (no auto_pad SAME_*)")
    weight = ctx.const(1, "kernel")
    begin, end = ctx.attr("pads", [0, 0]) if ctx.attr("auto_pad", "NOTSET") == "NOTSET" else (0, 0)
    stride, dilation = ctx.attr("strides", [1])[0], ctx.attr("dilations", [1])[0]
    kernel = ctx.net.parameter(weight[:, :, None, :], f"{ctx.node.input[1]}_2d")
    expr = (
        f"ops.Conv2D({weight.shape[0]}, (1, {weight.shape[2]}), pad_mode='pad', pad={_tuple((0, 0, begin, end))}, "
        f"stride=(1, {stride}), dilation=(1, {dilation}), group={ctx.attr('group', 1)})"
        f"(ops.expand_dims({ctx.t(0)}, 2), {kernel})"
    )
    squeezed = f"ops.squeeze({expr}, 2)"
    return f"ops.bias_add({squeezed}, {ctx.t(2)})" if ctx.has(2) else squeezed


@op(
    "ConvTranspose",
    mindspore="ops.Conv2DBackpropInput (+ ops.bias_add)",
    notes="2-D; pads, groups, dilation, output_padding",
)
def conv_transpose(ctx: Ctx) -> str:
    # the backward-input primitive has a CPU kernel (ops.conv_transpose2d has none); it takes the
    # output size, computed here from the input's run-time shape so any spatial size works
    _spatial2d(ctx)
    weight = ctx.static_dims(1, "kernel")
    if ctx.attr("auto_pad", "NOTSET") != "NOTSET" or ctx.attr("output_shape"):
        ctx.fail("pads must be explicit (no auto_pad or output_shape)")
    kernel = weight[2:]
    group = int(ctx.attr("group", 1))
    strides, dilations = ctx.attr("strides", [1, 1]), ctx.attr("dilations", [1, 1])
    top, left, bottom, right = ctx.attr("pads", [0, 0, 0, 0])
    extra = ctx.attr("output_padding", [0, 0])
    x = ctx.t(0)
    shape = f"ops.dyn_shape({x})"
    channels = ctx.net.parameter(np.array([weight[1] * group], np.int64), f"{ctx.node.output[0]}_channels")
    sizes = [
        f"({shape}[{axis}:{axis + 1}] - 1) * {s} + {d * (k - 1) + 1 + e - lo - hi}"
        for axis, s, d, k, e, lo, hi in zip((2, 3), strides, dilations, kernel, extra, (top, left), (bottom, right))
    ]
    size = f"ops.cat(({shape}[0:1], {channels}, {sizes[0]}, {sizes[1]}), 0)"
    expr = (
        f"ops.Conv2DBackpropInput({weight[1] * group}, {_tuple(kernel)}, pad_mode='pad', "
        f"pad={_tuple((top, bottom, left, right))}, stride={_tuple(strides)}, dilation={_tuple(dilations)}, "
        f"group={group})({x}, {ctx.t(1)}, {size})"
    )
    return f"ops.bias_add({expr}, {ctx.t(2)})" if ctx.has(2) else expr


@op("MaxPool", mindspore="ops.max_pool2d", notes="2-D; pads, auto_pad, ceil_mode, dilation")
def max_pool(ctx: Ctx) -> str:
    _spatial2d(ctx)
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        ctx.fail("the Indices output is not supported")
    kernel, strides = ctx.attr("kernel_shape"), ctx.attr("strides", [1, 1])
    dilations = ctx.attr("dilations", [1, 1])
    pads = _explicit_pads(ctx, kernel, strides, dilations)
    if pads is None:
        if dilations != [1, 1] or ctx.attr("ceil_mode", 0):
            ctx.fail("SAME_UPPER with dilation or ceil_mode on a dynamic spatial size is not supported")
        return f"ops.MaxPool({_tuple(kernel)}, {_tuple(strides)}, 'SAME')({ctx.t(0)})"
    x, sym = _padded(ctx, ctx.t(0), pads, value=LOWEST)
    return (
        f"ops.max_pool2d({x}, {_tuple(kernel)}, {_tuple(strides)}, padding={_tuple(sym or (0, 0))}, "
        f"dilation={_tuple(dilations)}, ceil_mode={bool(ctx.attr('ceil_mode', 0))})"
    )


@op("AveragePool", mindspore="ops.avg_pool2d", notes="2-D; pads, auto_pad, count_include_pad, ceil_mode")
def average_pool(ctx: Ctx) -> str:
    _spatial2d(ctx)
    kernel, strides = ctx.attr("kernel_shape"), ctx.attr("strides", [1, 1])
    pads = _explicit_pads(ctx, kernel, strides, [1, 1])
    if pads is None:
        if ctx.attr("count_include_pad", 0) or ctx.attr("ceil_mode", 0):
            ctx.fail("SAME_UPPER with count_include_pad or ceil_mode on a dynamic spatial size is not supported")
        return f"ops.AvgPool({_tuple(kernel)}, {_tuple(strides)}, 'SAME')({ctx.t(0)})"
    top, left, bottom, right = pads
    return (
        f"ops.avg_pool2d({ctx.t(0)}, {_tuple(kernel)}, {_tuple(strides)}, padding={_tuple((top, bottom, left, right))}, "
        f"ceil_mode={bool(ctx.attr('ceil_mode', 0))}, count_include_pad={bool(ctx.attr('count_include_pad', 0))})"
    )


@op("GlobalAveragePool", mindspore="ops.mean over the spatial axes")
def global_average_pool(ctx: Ctx) -> str:
    return f"ops.mean({ctx.t(0)}, {_tuple(range(2, ctx.rank(0)))}, True)"


@op("GlobalMaxPool", mindspore="ops.amax over the spatial axes")
def global_max_pool(ctx: Ctx) -> str:
    return f"ops.amax({ctx.t(0)}, {_tuple(range(2, ctx.rank(0)))}, True)"


@op("BatchNormalization", mindspore="ops.batch_norm", notes="inference (running statistics)")
def batch_norm(ctx: Ctx) -> str:
    if ctx.attr("training_mode", 0):
        ctx.fail("training-mode BatchNormalization cannot be exported")
    scale, bias, mean, var = (ctx.t(i) for i in range(1, 5))
    return (
        f"ops.batch_norm({ctx.t(0)}, {mean}, {var}, {scale}, {bias}, False, eps={float(ctx.attr('epsilon', 1e-5))!r})"
    )


@op("LayerNormalization", mindspore="ops.LayerNorm", notes="the normalized output (Mean/InvStdDev outputs unused)")
def layer_norm(ctx: Ctx) -> str:
    if any(ctx.node.output[1:]):
        ctx.fail("the Mean and InvStdDev outputs are not supported")
    rank = ctx.rank(0)
    axis = _axis(ctx.attr("axis", -1), rank)
    normalized = ctx.static_dims(1, "scale (the normalized axes)")
    eps = float(ctx.attr("epsilon", 1e-5))
    zeros = np.zeros(normalized, np.float32)  # the primitive takes a bias always
    bias = ctx.t(2) if ctx.has(2) else ctx.net.parameter(zeros, f"{ctx.node.name}_zero_bias")
    # the LayerNorm primitive: ops.layer_norm becomes LayerNormExt, which has no CPU kernel
    return f"ops.LayerNorm({axis}, {axis}, {eps!r})({ctx.t(0)}, {ctx.t(1)}, {bias})[0]"


# -- matrix products -----------------------------------------------------------------------------
@op("MatMul", mindspore="ops.matmul", notes="batched, broadcasting")
def matmul(ctx: Ctx) -> str:
    return f"ops.matmul({ctx.t(0)}, {ctx.t(1)})"


@op("Gemm", mindspore="ops.matmul (+ bias)", notes="transA/transB, alpha/beta")
def gemm(ctx: Ctx) -> str:
    a, b = ctx.t(0), ctx.t(1)
    if ctx.attr("transA", 0):
        a = f"ops.transpose({a}, (1, 0))"
    if ctx.attr("transB", 0):
        if ctx.is_static(1):  # transposed once, now: the Parameter holds the matrix MatMul reads
            b = ctx.net.parameter(np.ascontiguousarray(ctx.const(1).T), ctx.node.input[1])
        else:
            b = f"ops.transpose({b}, (1, 0))"
    expr = f"ops.matmul({a}, {b})"
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        expr = f"{expr} * {alpha!r}"
    if ctx.has(2):
        expr = f"{expr} + {ctx.t(2)}" + (f" * {beta!r}" if beta != 1.0 else "")
    return expr


# -- elementwise -------------------------------------------------------------------------------
UNARY = {
    "Relu": "ops.relu",
    "Sigmoid": "ops.sigmoid",
    "Tanh": "ops.tanh",
    "Erf": "ops.erf",
    "Exp": "ops.exp",
    "Log": "ops.log",
    "Sqrt": "ops.sqrt",
    "Reciprocal": "ops.reciprocal",
    "Neg": "ops.neg",
    "Abs": "ops.abs",
    "Floor": "ops.floor",
    "Ceil": "ops.ceil",
    "Not": "ops.logical_not",
    "Sin": "ops.sin",
    "Cos": "ops.cos",
    "Softplus": "ops.softplus",
    "HardSwish": "ops.hardswish",
    "Identity": "",
    "Dropout": "",
}


def _unary(fn: str) -> Emit:
    return lambda ctx: ctx.t(0) if not fn else f"{fn}({ctx.t(0)})"


for _onnx, _ms in UNARY.items():
    OPS[_onnx] = MsOp(
        _onnx, _ms or "(the input itself)", _unary(_ms), "inference: no dropout" if _onnx == "Dropout" else ""
    )

BINARY = {
    "Add": "ops.add",
    "Sub": "ops.sub",
    "Mul": "ops.mul",
    "Pow": "ops.pow",
    "Equal": "ops.equal",
    "Less": "ops.less",
    "LessOrEqual": "ops.less_equal",
    "Greater": "ops.greater",
    "GreaterOrEqual": "ops.greater_equal",
    "And": "ops.logical_and",
    "Or": "ops.logical_or",
}


def _binary(fn: str) -> Emit:
    return lambda ctx: f"{fn}({ctx.t(0)}, {ctx.t(1)})"


for _onnx, _ms in BINARY.items():
    OPS[_onnx] = MsOp(_onnx, _ms, _binary(_ms), "broadcasting")


@op("Div", mindspore="ops.div", notes="integers: rounded toward zero, as ONNX")
def div(ctx: Ctx) -> str:
    mode = ", rounding_mode='trunc'" if "int" in ctx.out_dtype() else ""
    return f"ops.div({ctx.t(0)}, {ctx.t(1)}{mode})"


@op(
    "LSTM",
    mindspore="ops.LSTM (per direction)",
    notes="forward, reverse, bidirectional; default activations, no clip or peepholes, full-length sequences",
)
def lstm(ctx: Ctx) -> str:
    hidden = int(ctx.attr("hidden_size"))
    direction = ctx.attr("direction", "forward")
    if ctx.attr("activations") not in (
        None,
        [b"Sigmoid", b"Tanh", b"Tanh"] * (2 if direction == "bidirectional" else 1),
    ):
        ctx.fail("only the default activations (Sigmoid, Tanh, Tanh) are supported")
    if ctx.attr("clip") is not None or ctx.attr("input_forget", 0) or ctx.has(7):
        ctx.fail("clip, input_forget and peepholes are not supported")
    if ctx.has(4):
        ctx.fail("sequence_lens is not supported (sequences must be full length)")
    if ctx.attr("layout", 0):
        ctx.fail("layout=1 (batch first) is not supported")
    w, r = ctx.const(1, "W"), ctx.const(2, "R")
    b = ctx.const(3, "B") if ctx.has(3) else np.zeros((w.shape[0], 8 * hidden), w.dtype)
    gates = np.array([0, 2, 3, 1])  # ONNX orders the gates i, o, f, c; MindSpore i, f, c, o
    weights = []
    for d in range(w.shape[0]):

        def order(m: np.ndarray) -> np.ndarray:
            return m.reshape(4, hidden, *m.shape[1:])[gates].reshape(m.shape)

        flat = [order(w[d]).ravel(), order(r[d]).ravel(), order(b[d, : 4 * hidden] + b[d, 4 * hidden :]).ravel()]
        weights.append(ctx.net.parameter(np.concatenate(flat).reshape(-1, 1, 1), f"{ctx.node.output[0]}_lstm{d}"))
    x = ctx.t(0)
    states = f"lstm_states({x}, {hidden}, {w.shape[0]})"
    h0 = ctx.t(5) if ctx.has(5) else states
    c0 = ctx.t(6) if ctx.has(6) else states
    size = w.shape[2]
    if direction == "bidirectional":
        call = f"lstm_bidirectional({x}, {h0}, {c0}, {weights[0]}, {weights[1]}, {size}, {hidden})"
    else:
        call = f"lstm({x}, {h0}, {c0}, {weights[0]}, {size}, {hidden}, {direction == 'reverse'})"
    outputs = len(ctx.node.output)  # Y, Y_h, Y_c: a node lists the first one, two or three
    return f"{call}[0]" if outputs == 1 else call if outputs == 3 else f"{call}[:2]"


@op("Max", "Min", mindspore="ops.maximum / ops.minimum", notes="any number of inputs")
def max_min(ctx: Ctx) -> str:
    fn = "ops.maximum" if ctx.node.op_type == "Max" else "ops.minimum"
    expr = ctx.t(0)
    for i in range(1, len(ctx.inputs)):
        expr = f"{fn}({expr}, {ctx.t(i)})"
    return expr


@op("Where", mindspore="ops.where", notes="attention masks")
def where(ctx: Ctx) -> str:
    return f"ops.where({ctx.t(0)}, {ctx.t(1)}, {ctx.t(2)})"


@op("Clip", mindspore="ops.clamp", notes="ReLU6 and friends; constant bounds")
def clip(ctx: Ctx) -> str:
    low = float(ctx.const(1, "min")) if ctx.has(1) else None
    high = float(ctx.const(2, "max")) if ctx.has(2) else None
    return f"ops.clamp({ctx.t(0)}, {low!r}, {high!r})"


@op("LeakyRelu", mindspore="ops.leaky_relu")
def leaky_relu(ctx: Ctx) -> str:
    return f"ops.leaky_relu({ctx.t(0)}, {float(ctx.attr('alpha', 0.01))!r})"


@op("PRelu", mindspore="ops.maximum / ops.minimum", notes="slope broadcast as ONNX")
def prelu(ctx: Ctx) -> str:
    x = ctx.t(0)
    return f"ops.maximum({x}, 0.0) + {ctx.t(1)} * ops.minimum({x}, 0.0)"


@op("HardSigmoid", mindspore="ops.clamp(alpha * x + beta, 0, 1)")
def hard_sigmoid(ctx: Ctx) -> str:
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    return f"ops.clamp({ctx.t(0)} * {alpha!r} + {beta!r}, 0.0, 1.0)"


@op("Gelu", mindspore="ops.gelu", notes="exact or tanh approximation")
def gelu(ctx: Ctx) -> str:
    return f"ops.gelu({ctx.t(0)}, approximate='{ctx.attr('approximate', 'none')}')"


@op("Cast", mindspore="ops.cast")
def cast(ctx: Ctx) -> str:
    return f"ops.cast({ctx.t(0)}, {ctx.out_dtype()})"


@op("Softmax", "LogSoftmax", mindspore="ops.softmax / ops.log_softmax", notes="one axis (before opset 13: the last)")
def softmax(ctx: Ctx) -> str:
    axis = ctx.attr("axis", -1 if ctx.net.opset >= 13 else 1)
    if ctx.net.opset < 13 and _axis(axis, ctx.rank(0)) != ctx.rank(0) - 1:
        ctx.fail("before opset 13 Softmax flattens the axes from 'axis' on; only the last axis is supported")
    fn = "ops.softmax" if ctx.node.op_type == "Softmax" else "ops.log_softmax"
    return f"{fn}({ctx.t(0)}, {axis})"


# -- reductions ----------------------------------------------------------------------------------
def _reduce_axes(ctx: Ctx) -> str:
    axes = ctx.ints(1, "axes") if ctx.has(1) else list(ctx.attr("axes", []))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            ctx.fail("noop_with_empty_axes is not supported")
        return "None"  # every axis
    return _tuple([_axis(a, ctx.rank(0)) if a < 0 else a for a in axes])


REDUCE = {
    "ReduceMean": "ops.mean({x}, {axes}, {keep})",
    "ReduceSum": "ops.sum({x}, {axes}, {keep})",
    "ReduceMax": "ops.amax({x}, {axes}, {keep})",
    "ReduceMin": "ops.amin({x}, {axes}, {keep})",
    "ReduceL2": "ops.sqrt(ops.sum({x} * {x}, {axes}, {keep}))",
    "ReduceL1": "ops.sum(ops.abs({x}), {axes}, {keep})",
    "ReduceSumSquare": "ops.sum({x} * {x}, {axes}, {keep})",
}


def _reduce(template: str) -> Emit:
    def emit(ctx: Ctx) -> str:
        return template.format(x=ctx.t(0), axes=_reduce_axes(ctx), keep=bool(ctx.attr("keepdims", 1)))

    return emit


for _onnx, _template in REDUCE.items():
    OPS[_onnx] = MsOp(
        _onnx,
        _template.format(x="x", axes="axes", keep="keepdims"),
        _reduce(_template),
        "axes as attribute or constant input",
    )


@op("ArgMax", "ArgMin", mindspore="ops.argmax / ops.argmin", notes="select_last_index=0")
def argmax(ctx: Ctx) -> str:
    if ctx.attr("select_last_index", 0):
        ctx.fail("select_last_index=1 is not supported")
    fn = "ops.argmax" if ctx.node.op_type == "ArgMax" else "ops.argmin"
    return f"ops.cast({fn}({ctx.t(0)}, {ctx.attr('axis', 0)}, {bool(ctx.attr('keepdims', 1))}), ms.int64)"


# -- shapes and indexing -----------------------------------------------------------------------
@op("Shape", mindspore="ops.dyn_shape", notes="folded to a constant where the shape is static")
def shape(ctx: Ctx) -> str:
    rank = ctx.rank(0)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    expr = f"ops.dyn_shape({ctx.t(0)})"
    return expr if (start, end) in ((0, rank), (0, None)) else f"{expr}[{start}:{end}]"


@op("Size", mindspore="ops.prod of ops.dyn_shape", notes="folded to a constant where the shape is static")
def size(ctx: Ctx) -> str:
    return f"ops.prod(ops.dyn_shape({ctx.t(0)}))"


def _reshape_target(ctx: Ctx, target: list[int]) -> str | None:
    """A constant Reshape target as a tuple, ONNX's 0 (copy that dim) resolved against the input's
    shape; None where a copied dim is dynamic beside a -1 (then it is resolved at run time)."""
    shape = ctx.shape(0) or ()
    if ctx.attr("allowzero", 0) or 0 not in target:
        return _tuple(target)
    resolved = [shape[i] if v == 0 and i < len(shape) else v for i, v in enumerate(target)]
    if any(v is None for v in resolved):
        if -1 in target or sum(v is None for v in resolved) > 1:
            return None
        resolved = [-1 if v is None else v for v in resolved]
    return _tuple([int(v) for v in resolved if v is not None])


@op("Reshape", mindspore="ops.reshape", notes="constant or computed target shape; 0 copies a dim")
def reshape(ctx: Ctx) -> str:
    x = ctx.t(0)
    if ctx.is_static(1):
        resolved = _reshape_target(ctx, ctx.ints(1))
        if resolved is not None:
            return f"ops.reshape({x}, {resolved})"
    target = ctx.t(1)
    if not ctx.attr("allowzero", 0):  # a computed 0 copies the input's dim at that position
        length, rank = (ctx.shape(1) or (None,))[0], ctx.rank(0)
        if length is None:
            ctx.fail("a computed target shape of unknown length")
        assert length is not None
        dims = f"ops.dyn_shape({x})[:{length}]"
        if length > rank:
            dims = f"ops.cat(({dims}, {ctx.net.parameter(np.ones(length - rank, np.int64), 'reshape_ones')}), 0)"
        target = f"ops.where(ops.equal({target}, 0), {dims}, {target})"
    return f"ops.reshape({x}, {target})"


@op("Flatten", mindspore="ops.reshape / ops.flatten")
def flatten(ctx: Ctx) -> str:
    shape = ctx.shape(0)
    rank = ctx.rank(0)
    axis = _axis(ctx.attr("axis", 1), rank)
    assert shape is not None
    tail = shape[axis:]
    if axis >= 1 and all(d is not None for d in tail):
        return f"ops.reshape({ctx.t(0)}, (-1, {int(np.prod(tail))}))"  # type: ignore[arg-type]
    if axis == 1:
        return f"ops.flatten({ctx.t(0)}, start_dim=1)"
    ctx.fail("Flatten with a dynamic tail at an axis other than 1 is not supported")
    return ""


@op("Transpose", mindspore="ops.transpose")
def transpose(ctx: Ctx) -> str:
    perm = ctx.attr("perm") or list(reversed(range(ctx.rank(0))))
    return f"ops.transpose({ctx.t(0)}, {_tuple(perm)})"


def _fixed_image(ctx: Ctx, what: str) -> tuple[int, int, int]:
    """Channels, height and width of a 4-D input, which must be known (the batch may vary)."""
    shape = ctx.shape(0)
    if shape is None or len(shape) != 4 or any(d is None for d in shape[1:]):
        ctx.fail(f"{what} needs a 4-D input whose channels and spatial sizes are fixed (give --input-shape)")
    assert shape is not None
    return int(shape[1] or 0), int(shape[2] or 0), int(shape[3] or 0)


@op("DepthToSpace", mindspore="ops.reshape + ops.transpose", notes="DCR and CRD modes; fixed C, H, W")
def depth_to_space(ctx: Ctx) -> str:
    channels, height, width = _fixed_image(ctx, "DepthToSpace")
    b = int(ctx.attr("blocksize"))
    c = channels // (b * b)
    if ctx.attr("mode", "DCR") == "CRD":  # channel, then row and column within the block
        split, perm = (-1, c, b, b, height, width), (0, 1, 4, 2, 5, 3)
    else:  # DCR: the block's row and column, then the channel (TensorFlow's order)
        split, perm = (-1, b, b, c, height, width), (0, 3, 4, 1, 5, 2)
    moved = f"ops.transpose(ops.reshape({ctx.t(0)}, {_tuple(split)}), {_tuple(perm)})"
    return f"ops.reshape({moved}, {_tuple([-1, c, height * b, width * b])})"


@op("SpaceToDepth", mindspore="ops.reshape + ops.transpose", notes="fixed C, H, W")
def space_to_depth(ctx: Ctx) -> str:
    channels, height, width = _fixed_image(ctx, "SpaceToDepth")
    b = int(ctx.attr("blocksize"))
    split = (-1, channels, height // b, b, width // b, b)
    moved = f"ops.transpose(ops.reshape({ctx.t(0)}, {_tuple(split)}), (0, 3, 5, 1, 2, 4))"
    return f"ops.reshape({moved}, {_tuple([-1, channels * b * b, height // b, width // b])})"


@op("Concat", mindspore="ops.cat")
def concat(ctx: Ctx) -> str:
    parts = ", ".join(ctx.t(i) for i in range(len(ctx.inputs)) if ctx.has(i))
    return f"ops.cat(({parts},), {ctx.attr('axis')})"


@op("Unsqueeze", mindspore="ops.expand_dims", notes="axes as attribute or constant input")
def unsqueeze(ctx: Ctx) -> str:
    axes = ctx.ints(1, "axes") if ctx.has(1) else list(ctx.attr("axes"))
    rank = ctx.rank(0) + len(axes)
    expr = ctx.t(0)
    for axis in sorted(_axis(a, rank) for a in axes):
        expr = f"ops.expand_dims({expr}, {axis})"
    return expr


@op("Squeeze", mindspore="ops.squeeze", notes="axes as attribute or constant input")
def squeeze(ctx: Ctx) -> str:
    axes = ctx.ints(1, "axes") if ctx.has(1) else list(ctx.attr("axes", []))
    if not axes:
        shape = ctx.shape(0) or ()
        if any(d is None for d in shape):
            ctx.fail("Squeeze without axes on a dynamic shape")
        axes = [i for i, d in enumerate(shape) if d == 1]
    return f"ops.squeeze({ctx.t(0)}, {_tuple([_axis(a, ctx.rank(0)) for a in axes])})"


@op("Gather", mindspore="ops.gather", notes="embeddings, shape indexing; negative constant indices")
def gather(ctx: Ctx) -> str:
    rank = ctx.rank(0)
    axis = _axis(ctx.attr("axis", 0), rank)
    if ctx.is_static(1):
        indices = np.asarray(ctx.const(1)).astype(np.int64)
        if (indices < 0).any():
            size = (ctx.shape(0) or ())[axis] if axis < rank else None
            if size is None:
                ctx.fail("negative indices into a dynamic axis")
            indices = np.where(indices < 0, indices + int(size or 0), indices)
        # a scalar index goes in as [1], and its axis is squeezed after (below)
        index = ctx.net.parameter(indices.reshape(-1) if indices.ndim == 0 else indices, ctx.node.input[1])
    else:
        index = ctx.t(1)
    expr = f"ops.gather({ctx.t(0)}, {index}, {axis})"
    if ctx.shape(1) == ():  # a scalar index drops the axis in ONNX
        return f"ops.squeeze({expr}, {axis})"
    return expr


@op("Split", mindspore="tensor slicing", notes="sizes as attribute, constant input or num_outputs")
def split(ctx: Ctx) -> list[str]:
    axis = ctx.attr("axis", 0)
    if ctx.has(1):
        sizes = ctx.ints(1, "split")
    elif ctx.attr("split"):
        sizes = list(ctx.attr("split"))
    else:
        size = (ctx.shape(0) or ())[_axis(axis, ctx.rank(0))]
        parts = len(ctx.node.output)
        if size is None:
            ctx.fail("an even Split of a dynamic axis is not supported")
        assert size is not None
        sizes = [-(-size // parts)] * (parts - 1)
        sizes.append(size - sum(sizes))
    # slices rather than ops.split: on a tensor whose shape MindSpore only learns at run time,
    # ops.split compiles a size check that the loaded MindIR cannot infer
    x, rank = ctx.t(0), ctx.rank(0)
    lead = ":, " * _axis(axis, rank)
    starts = np.cumsum([0, *sizes])
    return [f"{x}[{lead}{start}:{end}]" for start, end in itertools.pairwise(starts)]


@op("Slice", mindspore="tensor slicing, or ops.gather over ops.arange for computed bounds", notes="any steps")
def slice_(ctx: Ctx) -> str:
    rank = ctx.rank(0)
    if not all(ctx.is_static(i) for i in range(1, len(ctx.inputs)) if ctx.has(i)):
        return _dynamic_slice(ctx, rank)
    starts, ends = ctx.ints(1), ctx.ints(2)
    axes = ctx.ints(3) if ctx.has(3) else list(range(len(starts)))
    steps = ctx.ints(4) if ctx.has(4) else [1] * len(starts)
    index = [":"] * rank
    expr = ctx.t(0)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step < 0:  # backwards: the positions, picked now from the fixed size of that axis
            size = (ctx.shape(0) or (None,) * rank)[_axis(axis, rank)]
            if size is None:
                ctx.fail("a negative step on a dynamic axis")
            picked = np.arange(int(size or 0))[slice(max(start, -(1 << 62)), max(end, -(1 << 62)), step)]
            where = ctx.net.parameter(picked.astype(np.int64), f"{ctx.node.output[0]}_axis{axis}")
            expr = f"ops.gather({expr}, {where}, {_axis(axis, rank)})"
            continue
        lo = "" if start == 0 else str(start)
        hi = "" if abs(end) >= INT64_MAX // 2 or (end >= (1 << 31) - 1 and step > 0) else str(end)
        index[_axis(axis, rank)] = f"{lo}:{hi}" + (f":{step}" if step != 1 else "")
    while index and index[-1] == ":":
        index.pop()
    return f"{expr}[{', '.join(index)}]" if index else expr


def _dynamic_slice(ctx: Ctx, rank: int) -> str:
    """Bounds computed from shapes (a position table cut to the sequence length): one axis, step 1,
    as a gather over the index range, which MindSpore compiles for any size."""
    axes = ctx.ints(3) if ctx.has(3) else [0]
    steps = ctx.ints(4) if ctx.has(4) else [1]
    if len(axes) != 1 or steps != [1]:
        ctx.fail("computed Slice bounds are supported on one axis with step 1")
    axis = _axis(axes[0], rank)
    x = ctx.t(0)
    start = f"ops.reshape({ctx.t(1)}, ())"
    end = f"ops.minimum(ops.reshape({ctx.t(2)}, ()), ops.dyn_shape({x})[{axis}])"
    return f"ops.gather({x}, ops.arange({start}, {end}, dtype=ms.int64), {axis})"


@op("Expand", mindspore="ops.broadcast_to / multiply by ones", notes="bidirectional broadcast, as ONNX")
def expand(ctx: Ctx) -> str:
    if ctx.is_static(1):
        return f"{ctx.t(0)} * ops.ones({_tuple(ctx.ints(1))}, {ctx.out_dtype()})"
    return f"{ctx.t(0)} * ops.ones({ctx.t(1)}, {ctx.out_dtype()})"


@op("ConstantOfShape", mindspore="ops.fill", notes="computed shapes")
def constant_of_shape(ctx: Ctx) -> str:
    value = ctx.attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1)[0].item() if value is not None else 0.0
    return f"ops.fill({ctx.out_dtype()}, {ctx.t(0)}, {fill!r})"


@op("Range", mindspore="ops.arange", notes="computed bounds")
def range_(ctx: Ctx) -> str:
    scalar = [f"ops.reshape({ctx.t(i)}, ())" for i in range(3)]
    return f"ops.arange({scalar[0]}, {scalar[1]}, {scalar[2]}, dtype={ctx.out_dtype()})"


@op("Tile", mindspore="ops.tile", notes="constant repeats")
def tile(ctx: Ctx) -> str:
    return f"ops.tile({ctx.t(0)}, {_tuple(ctx.ints(1, 'repeats'))})"


@op("Pad", mindspore="ops.pad", notes="constant pads; constant, reflect and edge modes")
def pad(ctx: Ctx) -> str:
    pads = ctx.ints(1, "pads") if ctx.has(1) else list(ctx.attr("pads"))
    if ctx.has(3):
        ctx.fail("the axes input is not supported")
    rank = len(pads) // 2
    pairs: list[int] = []
    for axis in reversed(range(rank)):  # ops.pad: last axis first, (begin, end) each
        pairs += [pads[axis], pads[axis + rank]]
    while len(pairs) > 2 and pairs[-2:] == [0, 0]:
        pairs = pairs[:-2]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}.get(ctx.attr("mode", "constant"))
    if mode is None:
        ctx.fail(f"mode '{ctx.attr('mode')}' is not supported")
    value = float(np.asarray(ctx.const(2)).reshape(-1)[0]) if ctx.has(2) else 0.0
    extra = f", value={value!r}" if mode == "constant" else ""
    return f"ops.pad({ctx.t(0)}, {_tuple(pairs)}, mode='{mode}'{extra})"


def _repeats(transform: str, rounding: str, scale: float) -> bool:
    """Whether nearest upsampling by an integer ``scale`` picks each input pixel ``scale`` times:
    with half-pixel centres the source position never lies half-way, so either rounding works;
    with asymmetric coordinates, floor does, and round-half-down does at 2x."""
    if transform in ("half_pixel", "pytorch_half_pixel"):
        return rounding in ("round_prefer_floor", "round_prefer_ceil")
    return transform == "asymmetric" and (rounding == "floor" or (rounding == "round_prefer_floor" and scale <= 2))


@op(
    "Resize",
    "Upsample",
    mindspore="ops.repeat_interleave / ops.ResizeNearestNeighborV2 / ops.ResizeBilinearV2",
    notes="4-D; nearest (asymmetric, floor; integer scales on any size), linear (half_pixel, align_corners)",
)
def resize(ctx: Ctx) -> str:
    _spatial2d(ctx)
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        ctx.fail(f"mode '{mode}' is not supported")
    upsample = ctx.node.op_type == "Upsample"  # before opset 10: asymmetric coordinates, floor
    transform = "asymmetric" if upsample else ctx.attr("coordinate_transformation_mode", "half_pixel")
    rounding = "floor" if upsample else ctx.attr("nearest_mode", "round_prefer_floor")
    if mode == "linear" and transform not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        ctx.fail(f"linear resize with {transform} coordinates is not supported")
    scales_at = 1 if ctx.node.op_type == "Upsample" else 2
    x, shape = ctx.t(0), ctx.shape(0) or (None,) * 4
    axes = [_axis(a, 4) for a in ctx.attr("axes", [0, 1, 2, 3])]
    if axes not in ([0, 1, 2, 3], [2, 3]):
        ctx.fail(f"resizing axes {axes} is not supported (only the spatial ones)")
    lead = [1.0, 1.0] if axes == [2, 3] else []
    if ctx.has(scales_at) and ctx.is_static(scales_at) and ctx.const(scales_at).size:
        scales = lead + [float(s) for s in ctx.const(scales_at).reshape(-1)]
        if scales[:2] != [1.0, 1.0]:
            ctx.fail("only the spatial axes may be resized")
        if mode == "nearest" and all(s.is_integer() for s in scales[2:]):
            if not _repeats(transform, rounding, max(scales[2:])):
                ctx.fail(f"nearest resize with {transform} coordinates and {rounding} rounding is not supported")
            # integer nearest upsampling (YOLO and FPN necks) repeats rows and columns: exact, and
            # valid for any input size (ops.interpolate takes no scale_factor for nearest)
            for axis, scale in ((2, int(scales[2])), (3, int(scales[3]))):
                x = x if scale == 1 else f"ops.repeat_interleave({x}, {scale}, {axis})"
            return x
        if any(d is None for d in shape[2:]):
            ctx.fail("a fractional or linear scale on a dynamic spatial size is not supported")
        size = _tuple([int(d * s) for d, s in zip(shape[2:], scales[2:])])  # type: ignore[operator]
    elif ctx.has(3) and ctx.is_static(3):
        size = _tuple(ctx.ints(3)[-2:])
    else:
        ctx.fail("computed resize sizes are not supported")
    # the resize primitives: ops.interpolate compiles checks a MindIR with a dynamic batch cannot run
    if mode == "nearest":
        if (transform, rounding) != ("asymmetric", "floor"):
            ctx.fail(f"nearest resize to a fractional size needs asymmetric/floor, not {transform}/{rounding}")
        return f"ops.ResizeNearestNeighborV2(False, False)({x}, {size})"
    corners = transform == "align_corners"
    return f"ops.ResizeBilinearV2({corners}, {not corners})({x}, {size})"
