"""The MindIR -> ONNX operator table: one small function per MindSpore primitive.

Each function reads the call's arguments (tensors and constants, in MindSpore's argument order)
and the primitive's attributes, and emits ONNX nodes at opset 17. ``docs/mindir-operators.md`` is
generated from this table (``python -m unideploy.exporters.mindir.docs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
from onnx import TensorProto, helper

from unideploy.errors import ExportError
from unideploy.exporters.mindir.builder import OnnxBuilder, Tensor
from unideploy.exporters.mindir.reader import UNKNOWN_RANK, Call, short_name

OPSET = 17  # LayerNormalization needs 17; ReduceMean still takes axes as an attribute here

# MindSpore TypeId (Cast's dtype argument) -> ONNX
TYPE_IDS = {
    30: TensorProto.BOOL,
    32: TensorProto.INT8,
    33: TensorProto.INT16,
    34: TensorProto.INT32,
    35: TensorProto.INT64,
    37: TensorProto.UINT8,
    38: TensorProto.UINT16,
    39: TensorProto.UINT32,
    40: TensorProto.UINT64,
    42: TensorProto.FLOAT16,
    43: TensorProto.FLOAT,
    44: TensorProto.DOUBLE,
    45: TensorProto.BFLOAT16,
}
PAD_MODES = {0: "pad", 1: "same", 2: "valid"}  # MindSpore's enum for pad_mode arguments
FORMATS = {0: "NCHW", 1: "NHWC"}
INT64_MAX = np.iinfo(np.int64).max
# operators whose output rank is not their inputs' (Squeeze and ExpandDims say by how much)
RANK_CHANGING = {
    "Shape",
    "Reshape",
    "Flatten",
    "ReduceMean",
    "MeanExt",
    "ReduceSum",
    "SumExt",
    "ReduceMax",
    "ReduceMin",
    "Argmax",
    "Gather",
    "StridedSlice",
}


class Ctx:
    """One call being translated: its arguments, attributes and where its nodes go."""

    def __init__(self, builder: OnnxBuilder, call: Call, args: list[Any]) -> None:
        self.b, self.call, self.args = builder, call, args
        self.hint = short_name(call.output)

    @property
    def dtype(self) -> str:
        return self.call.out[0].dtype if self.call.out else "float32"

    @property
    def rank(self) -> int:
        """The output's rank: as MindSpore recorded it, or, where its shape inference lost it (after
        a pooling with argmax on a dynamic batch), from the first tensor argument's."""
        shape = self.call.out[0].shape if self.call.out else ()
        if shape != UNKNOWN_RANK:
            return len(shape)
        ranks = [self.b.rank(a) for a in self.args if isinstance(a, Tensor)]
        axes = _axes(self.arg(1, "axis")) if self.call.op in ("Squeeze", "ExpandDims") else []
        if not ranks or self.call.op in RANK_CHANGING or (self.call.op in ("Squeeze", "ExpandDims") and not axes):
            self.fail("MindSpore recorded no rank for its output, and it cannot be told from its inputs")
        return max(ranks) + (len(axes) if self.call.op == "ExpandDims" else -len(axes))

    def x(self, i: int) -> Tensor:
        """Argument ``i`` as an ONNX value (constants take the output's dtype)."""
        return self.b.tensor(self.args[i], self.dtype, f"{self.hint}_arg{i}")

    def arg(self, i: int, attr: str | None = None, default: Any = None) -> Any:
        """A constant argument: the i-th input (PRIMITIVE_FUNCTION) or the attribute (PRIMITIVE)."""
        if i < len(self.args):
            value = self.args[i]
            if isinstance(value, Tensor):
                self.fail(f"argument {i} must be a constant, not a computed tensor")
            return value
        if attr is not None and attr in self.call.attrs:
            return self.call.attrs[attr]
        return default

    def emit(self, op_type: str, inputs: Sequence[str], rank: int | None = None, **attrs: Any) -> Tensor:
        return self.b.op(op_type, inputs, self.hint, self.rank if rank is None else rank, **attrs)

    def fail(self, why: str) -> NoReturn:
        raise ExportError(
            f"MindIR operator {self.call.op} ('{self.hint}'): {why}",
            "re-run with --keep-native-only to package the MindIR artifact alone",
        )


@dataclass(frozen=True)
class Op:
    name: str
    onnx: str  # the ONNX operators it becomes, for the docs
    translate: Callable[[Ctx], Any]
    notes: str = ""


OPS: dict[str, Op] = {}


def op(*names: str, onnx: str, notes: str = "") -> Callable[[Callable[[Ctx], Any]], Callable[[Ctx], Any]]:
    def register(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
        for name in names:
            OPS[name] = Op(name, onnx, fn, notes)
        return fn

    return register


def _pair(values: Any) -> list[int]:
    """MindSpore spatial tuples come as (h, w) or NCHW-ordered (1, 1, h, w)."""
    values = [values, values] if isinstance(values, int) else list(values)
    return [int(v) for v in values[-2:]]


def _pad_mode(value: Any) -> str:
    return PAD_MODES.get(value, "") if isinstance(value, int) else str(value).lower()


def _require_nchw(ctx: Ctx, value: Any) -> None:
    layout = FORMATS.get(value, "") if isinstance(value, int) else str(value or "NCHW")
    if layout.upper() != "NCHW":
        ctx.fail(f"data format {layout} is not supported (only NCHW)")


# -- convolution and pooling -------------------------------------------------------------------
def _conv_geometry(ctx: Ctx) -> tuple[list[int], list[int], list[int], int]:
    """A convolution's padding (top, bottom, left, right), strides, dilations and groups (NCHW)."""
    a = ctx.call.attrs
    _require_nchw(ctx, a.get("format"))
    pads = [int(p) for p in (list(a.get("pad_list") or a.get("pad") or (0, 0, 0, 0)) * 4)[:4]]
    return pads, _pair(a.get("stride", 1)), _pair(a.get("dilation", 1)), int(a.get("group", a.get("groups", 1)))


@op("Conv2D", onnx="Conv", notes="pad modes same/valid/pad, groups, dilation; NCHW")
def conv2d(ctx: Ctx) -> Tensor:
    (top, bottom, left, right), strides, dilations, group = _conv_geometry(ctx)
    mode = _pad_mode(ctx.call.attrs.get("pad_mode", "valid"))
    weights = ctx.b.constant(ctx.x(1))
    if mode == "same" and set(strides) == {1} and weights is not None:
        # at stride 1 "same" padding does not depend on the input size: explicit pads, which
        # optimizers and converters read, instead of auto_pad
        total = [d * (k - 1) for d, k in zip(dilations, weights.shape[2:])]
        top, left, bottom, right = total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2
        mode = "pad"
    return ctx.emit(
        "Conv",
        [ctx.x(0), ctx.x(1)],
        strides=strides,
        dilations=dilations,
        group=group,
        auto_pad="SAME_UPPER" if mode == "same" else None,
        pads=[top, left, bottom, right] if mode == "pad" else None,
    )


@op(
    "Conv2DTranspose",
    onnx="ConvTranspose",
    notes="pad modes same/valid/pad, groups, dilation; NCHW (the output size argument follows from them)",
)
def conv2d_transpose(ctx: Ctx) -> Tensor:
    """MindSpore's transposed convolution (Conv2DBackpropInput) with the forward convolution's
    padding, which ONNX's ConvTranspose removes from its output the same way. 'same' makes the
    output ``input x stride``: where the kernel is shorter than the stride, padding cannot make up
    the difference and ``output_padding`` does."""
    (top, bottom, left, right), strides, dilations, group = _conv_geometry(ctx)
    weights = ctx.b.constant(ctx.x(1))
    if weights is None:
        ctx.fail("the kernel must be a weight, not a computed tensor")
    extra = [0, 0]
    if _pad_mode(ctx.call.attrs.get("pad_mode", "valid")) == "same":
        spans = [d * (k - 1) + 1 for d, k in zip(dilations, weights.shape[2:])]
        extra = [max(s - span, 0) for s, span in zip(strides, spans)]
    return ctx.emit(
        "ConvTranspose",
        [ctx.x(0), ctx.x(1)],
        strides=strides,
        dilations=dilations,
        group=group,
        pads=[top, left, bottom, right],
        output_padding=extra if any(extra) else None,
    )


@op("Shape", onnx="Shape, Gather per axis", notes="a tuple of scalars, as MindSpore uses it")
def shape(ctx: Ctx) -> tuple[Tensor, ...]:
    rank = ctx.b.rank(ctx.x(0))
    whole = ctx.emit("Shape", [ctx.x(0)], rank=1)
    return tuple(
        ctx.emit("Gather", [whole, ctx.b.initializer(np.array(axis, np.int64), f"{ctx.hint}_axis")], rank=0, axis=0)
        for axis in range(rank)
    )


def _pool(ctx: Ctx, onnx_op: str) -> Tensor:
    kernel = _pair(ctx.arg(1, "kernel_size"))
    strides = _pair(ctx.arg(2, "strides", kernel))
    mode = _pad_mode(ctx.arg(3, "pad_mode", "valid"))
    _require_nchw(ctx, ctx.arg(4, "format", "NCHW") if "format" in ctx.call.attrs else ctx.arg(4, None, 0))
    if mode not in ("same", "valid"):
        ctx.fail(f"pad mode '{mode}' is not supported for pooling")
    return ctx.emit(
        onnx_op, [ctx.x(0)], kernel_shape=kernel, strides=strides, auto_pad="SAME_UPPER" if mode == "same" else "VALID"
    )


@op("MaxPool", onnx="MaxPool", notes="pad modes same/valid; NCHW")
def max_pool(ctx: Ctx) -> Tensor:
    return _pool(ctx, "MaxPool")


@op(
    "MaxPool3DWithArgmax",
    onnx="MaxPool (2-D where the depth is one, else 3-D)",
    notes="what nn.MaxPool2d(ceil_mode=True) and padded max pooling export as (between ExpandDims and Squeeze); "
    "ceil mode, pads, dilation; the argmax output is not translated",
)
def max_pool_with_argmax(ctx: Ctx) -> tuple[Tensor, None]:
    a = ctx.call.attrs
    if str(a.get("format", "NCDHW")).upper() != "NCDHW":
        ctx.fail(f"data format {a.get('format')} is not supported (only NCDHW)")

    def triple(name: str, default: int) -> list[int]:
        values = a.get(name, default)
        values = [values] * 3 if isinstance(values, int) else list(values)
        return [int(v) for v in values[-3:]]

    kernel, strides, dilations, pads = (
        triple("ksize", 1),
        triple("strides", 1),
        triple("dilation", 1),
        triple("pads", 0),
    )
    ceil_mode = int(bool(a.get("ceil_mode", False)))
    if (kernel[0], strides[0], dilations[0], pads[0]) != (1, 1, 1, 0):
        y = ctx.emit(
            "MaxPool",
            [ctx.x(0)],
            kernel_shape=kernel,
            strides=strides,
            dilations=dilations,
            pads=pads + pads,
            ceil_mode=ceil_mode,
        )
        return (y, None)
    # a 2-D pooling MindSpore wrote as 3-D with a depth of one: pooled in 2-D, which every converter
    # and mobile runtime has (TFLite has no 3-D max pooling: MTCNN's P-Net from MindIR had no TFLite)
    depth = ctx.b.ints([2])
    flat = ctx.emit("Squeeze", [ctx.x(0), depth], rank=4)
    pooled = ctx.emit(
        "MaxPool",
        [flat],
        rank=4,
        kernel_shape=kernel[1:],
        strides=strides[1:],
        dilations=dilations[1:],
        pads=pads[1:] + pads[1:],
        ceil_mode=ceil_mode,
    )
    return (ctx.emit("Unsqueeze", [pooled, depth], rank=5), None)


@op("AvgPool", onnx="AveragePool", notes="pad modes same/valid (padding excluded from the average); NCHW")
def avg_pool(ctx: Ctx) -> Tensor:
    return _pool(ctx, "AveragePool")


@op("BatchNorm", onnx="BatchNormalization", notes="inference only (is_training=False)")
def batch_norm(ctx: Ctx) -> tuple[Any, ...]:
    if ctx.arg(5, "is_training", False):
        ctx.fail("training-mode BatchNorm cannot be exported; export the Cell after set_train(False)")
    _require_nchw(ctx, ctx.arg(8, "format", 0))
    y = ctx.emit("BatchNormalization", [ctx.x(i) for i in range(5)], epsilon=float(ctx.arg(6, "epsilon", 1e-5)))
    return (y, None, None, None, None)


def _per_channel(ctx: Ctx, values: Tensor) -> Tensor:
    """``values`` of shape (C,) as (C, 1, ..., 1): one per channel of an NCHW output of this rank."""
    return ctx.b.op("Reshape", [values, ctx.b.ints([-1] + [1] * (ctx.rank - 2))], ctx.hint, ctx.rank - 1)


@op(
    "GroupNorm",
    onnx="Reshape, InstanceNormalization, Reshape, Mul, Add",
    notes="ONNX's GroupNormalization needs opset 18: groups normalized as instances of [N, groups, -1]",
)
def group_norm(ctx: Ctx) -> tuple[Any, ...]:
    x, groups, eps = ctx.x(0), int(ctx.arg(1, "num_groups")), float(ctx.arg(4, "eps", 1e-5))
    grouped = ctx.emit("Reshape", [x, ctx.b.ints([0, groups, -1], f"{ctx.hint}_groups")], rank=3)
    ones = ctx.b.initializer(np.ones(groups, np.float32), f"{ctx.hint}_ones")
    zeros = ctx.b.initializer(np.zeros(groups, np.float32), f"{ctx.hint}_zeros")
    normed = ctx.emit("InstanceNormalization", [grouped, ones, zeros], rank=3, epsilon=eps)
    y = ctx.emit("Reshape", [normed, ctx.emit("Shape", [x], rank=1)])
    return (
        ctx.emit("Add", [ctx.emit("Mul", [y, _per_channel(ctx, ctx.x(2))]), _per_channel(ctx, ctx.x(3))]),
        None,
        None,
    )


@op("BiasAdd", onnx="Conv with bias (after a Conv) or Add (bias reshaped to the channel axis)")
def bias_add(ctx: Ctx) -> Tensor:
    x, bias = ctx.x(0), ctx.x(1)
    layout = FORMATS.get(ctx.arg(2, "data_format", 0), "NCHW")
    conv = ctx.b.producer(x)
    if conv is not None and conv.op_type == "Conv" and len(conv.input) == 2 and ctx.b.is_initializer(bias):
        # the Conv-with-bias every exporter writes, which converters (onnx2tf) expect; the bias-less
        # Conv is pruned when nothing else reads it
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        return ctx.emit("Conv", [*conv.input, bias], **attrs)
    if ctx.rank > 2 and layout == "NCHW":
        bias = _per_channel(ctx, bias)
    return ctx.emit("Add", [x, bias])


# -- activations -------------------------------------------------------------------------------
def _unary(onnx_op: str) -> Callable[[Ctx], Tensor]:
    return lambda ctx: ctx.emit(onnx_op, [ctx.x(0)])


for _ms, _onnx in {
    "ReLU": "Relu",
    "Sigmoid": "Sigmoid",
    "Tanh": "Tanh",
    "Erf": "Erf",
    "Sqrt": "Sqrt",
    "Abs": "Abs",
    "Exp": "Exp",
    "Log": "Log",
    "Neg": "Neg",
    "Reciprocal": "Reciprocal",
    "HSwish": "HardSwish",
    "Softplus": "Softplus",
    "Softsign": "Softsign",
    "Floor": "Floor",
    "Sin": "Sin",
    "Cos": "Cos",
}.items():
    op(_ms, onnx=_onnx)(_unary(_onnx))


@op("HSigmoid", onnx="HardSigmoid(1/6, 1/2)", notes="MobileNetV3's hard sigmoid: relu6(x + 3) / 6")
def hsigmoid(ctx: Ctx) -> Tensor:
    return ctx.emit("HardSigmoid", [ctx.x(0)], alpha=1.0 / 6.0, beta=0.5)


@op("Elu", onnx="Elu")
def elu(ctx: Ctx) -> Tensor:
    return ctx.emit("Elu", [ctx.x(0)], alpha=float(ctx.arg(1, "alpha", 1.0)))


@op("Mish", onnx="Mul(x, Tanh(Softplus(x)))", notes="ONNX's Mish needs opset 18")
def mish(ctx: Ctx) -> Tensor:
    x = ctx.x(0)
    return ctx.emit("Mul", [x, ctx.emit("Tanh", [ctx.emit("Softplus", [x])])])


@op("Rsqrt", onnx="Reciprocal(Sqrt(x))")
def rsqrt(ctx: Ctx) -> Tensor:
    return ctx.emit("Reciprocal", [ctx.emit("Sqrt", [ctx.x(0)])])


@op("Square", onnx="Mul(x, x)")
def square(ctx: Ctx) -> Tensor:
    x = ctx.x(0)
    return ctx.emit("Mul", [x, x])


@op("PReLU", onnx="PRelu", notes="one slope per channel (channel axis 1) or one for all")
def prelu(ctx: Ctx) -> Tensor:
    slope = ctx.x(1)
    weights = ctx.b.constant(slope)
    if ctx.rank > 2 and (weights is None or weights.size > 1):
        # a slope per channel, shaped (C,), broadcasts over NCHW's trailing axes as (C, 1, 1)
        slope = _per_channel(ctx, slope)
    return ctx.emit("PRelu", [ctx.x(0), slope])


@op("ReLU6", onnx="Clip(0, 6)")
def relu6(ctx: Ctx) -> Tensor:
    return ctx.emit("Clip", [ctx.x(0), ctx.b.tensor(0.0, ctx.dtype, "zero"), ctx.b.tensor(6.0, ctx.dtype, "six")])


@op("SiLU", onnx="Mul(x, Sigmoid(x))")
def silu(ctx: Ctx) -> Tensor:
    x = ctx.x(0)
    return ctx.emit("Mul", [x, ctx.emit("Sigmoid", [x])])


@op("GeLU", onnx="Tanh, Pow, Mul, Add", notes="the tanh approximation (exact GELU arrives as Erf arithmetic)")
def gelu(ctx: Ctx) -> Tensor:
    x, c = ctx.x(0), lambda v, n: ctx.b.tensor(v, ctx.dtype, n)
    cube = ctx.emit("Mul", [ctx.emit("Pow", [x, c(3.0, "three")]), c(0.044715, "gelu_k")])
    inner = ctx.emit("Tanh", [ctx.emit("Mul", [ctx.emit("Add", [x, cube]), c(math.sqrt(2 / math.pi), "gelu_s")])])
    half = ctx.emit("Mul", [x, c(0.5, "half")])
    return ctx.emit("Mul", [half, ctx.emit("Add", [inner, c(1.0, "one")])])


@op("Softmax", onnx="Softmax")
def softmax(ctx: Ctx) -> Tensor:
    axis = ctx.arg(1, "axis", -1)
    axes = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    if len(axes) != 1:
        ctx.fail(f"softmax over several axes {axes} is not supported")
    return ctx.emit("Softmax", [ctx.x(0)], axis=int(axes[0]))


@op("LogSoftmax", onnx="LogSoftmax")
def log_softmax(ctx: Ctx) -> Tensor:
    return ctx.emit("LogSoftmax", [ctx.x(0)], axis=int(ctx.arg(1, "axis", -1)))


@op("LRN", onnx="LRN", notes="across channels; ONNX's alpha is scaled by the window (MindSpore's is not)")
def lrn(ctx: Ctx) -> Tensor:
    a = ctx.call.attrs
    if str(a.get("norm_region", "ACROSS_CHANNELS")) != "ACROSS_CHANNELS":
        ctx.fail(f"norm_region {a.get('norm_region')} is not supported")
    size = 2 * int(a.get("depth_radius", 5)) + 1
    return ctx.emit(
        "LRN",
        [ctx.x(0)],
        size=size,
        alpha=float(a.get("alpha", 1.0)) * size,
        beta=float(a.get("beta", 0.5)),
        bias=float(a.get("bias", 1.0)),
    )


@op("LayerNorm", onnx="LayerNormalization")
def layer_norm(ctx: Ctx) -> tuple[Any, ...]:
    begin_norm, begin_params = int(ctx.arg(3, "begin_norm_axis", -1)), int(ctx.arg(4, "begin_params_axis", -1))
    rank = ctx.rank
    if begin_norm % rank != begin_params % rank:
        ctx.fail(f"begin_norm_axis {begin_norm} differs from begin_params_axis {begin_params}")
    y = ctx.emit(
        "LayerNormalization",
        [ctx.x(0), ctx.x(1), ctx.x(2)],
        axis=begin_norm,
        epsilon=float(ctx.arg(5, "epsilon", 1e-7)),
    )
    return (y, None, None)


# -- matrix products -------------------------------------------------------------------------------
def _swap_last(ctx: Ctx, value: Tensor) -> Tensor:
    weights = ctx.b.constant(value)
    if weights is not None:  # a Dense weight: stored transposed, so optimizers see a plain MatMul weight
        return ctx.b.initializer(np.ascontiguousarray(np.swapaxes(weights, -1, -2)), ctx.hint)
    rank = ctx.b.rank(value)
    perm = [*list(range(rank - 2)), rank - 1, rank - 2]
    return ctx.b.op("Transpose", [value], ctx.hint, rank, perm=perm)


def _matmul(ctx: Ctx, transpose_a: bool, transpose_b: bool) -> Tensor:
    a, b = ctx.x(0), ctx.x(1)
    return ctx.emit("MatMul", [_swap_last(ctx, a) if transpose_a else a, _swap_last(ctx, b) if transpose_b else b])


@op("MatMul", "BatchMatMul", onnx="MatMul (Transpose for transpose_a/transpose_b)")
def matmul(ctx: Ctx) -> Tensor:
    return _matmul(ctx, bool(ctx.arg(2, "transpose_a", False)), bool(ctx.arg(3, "transpose_b", False)))


@op("MatMulExt", onnx="MatMul")
def matmul_ext(ctx: Ctx) -> Tensor:
    return _matmul(ctx, False, False)


@op("Dense", onnx="MatMul, Add", notes="x @ w.T + b")
def dense(ctx: Ctx) -> Tensor:
    y = _matmul(ctx, False, True)
    has_bias = len(ctx.args) > 2 and ctx.args[2] is not None
    return ctx.emit("Add", [y, ctx.x(2)]) if has_bias else y


# -- elementwise arithmetic -------------------------------------------------------------------------
def _binary(onnx_op: str) -> Callable[[Ctx], Tensor]:
    return lambda ctx: ctx.emit(onnx_op, [ctx.x(0), ctx.x(1)])


for _ms, _onnx in {
    "Add": "Add",
    "Sub": "Sub",
    "Mul": "Mul",
    "Div": "Div",
    "Pow": "Pow",
    "Muls": "Mul",
    "Divs": "Div",
    "Maximum": "Max",
    "Minimum": "Min",
}.items():
    op(_ms, onnx=_onnx, notes="scalar second operand" if _ms in ("Muls", "Divs") else "")(_binary(_onnx))


def _compare(onnx_op: str) -> Callable[[Ctx], Tensor]:
    """A comparison: its output is bool, so a constant operand takes the other operand's dtype."""

    def translate(ctx: Ctx) -> Tensor:
        known = (ctx.b.dtypes.get(v) for v in ctx.args[:2] if isinstance(v, Tensor))
        dtype = next((d for d in known if d), "float32")
        operands = [ctx.b.tensor(v, dtype, f"{ctx.hint}_arg{i}") for i, v in enumerate(ctx.args[:2])]
        return ctx.emit(onnx_op, operands)

    return translate


for _ms, _onnx in {
    "Greater": "Greater",
    "GreaterEqual": "GreaterOrEqual",
    "Less": "Less",
    "LessEqual": "LessOrEqual",
    "Equal": "Equal",
}.items():
    op(_ms, onnx=_onnx)(_compare(_onnx))


@op("Select", onnx="Where")
def select(ctx: Ctx) -> Tensor:
    return ctx.emit("Where", [ctx.b.tensor(ctx.args[0], "bool", f"{ctx.hint}_cond"), ctx.x(1), ctx.x(2)])


@op("AddExt", "AddScalar", onnx="Add (Mul for alpha != 1)", notes="x + alpha * y")
def add_ext(ctx: Ctx) -> Tensor:
    other = ctx.x(1)
    alpha = ctx.arg(2, None, 1)
    if alpha not in (1, 1.0, None):
        other = ctx.emit("Mul", [other, ctx.b.tensor(alpha, ctx.dtype, "alpha")])
    return ctx.emit("Add", [ctx.x(0), other])


@op("Cast", onnx="Cast")
def cast(ctx: Ctx) -> Tensor:
    type_id = ctx.arg(1, "dst_type")
    if type_id not in TYPE_IDS:
        ctx.fail(f"cast to MindSpore type id {type_id} is not supported")
    return ctx.emit("Cast", [ctx.x(0)], to=TYPE_IDS[type_id])


# -- reductions ---------------------------------------------------------------------------------------
def _axes(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (tuple, list)) else [value])]


def _reduce(ctx: Ctx, onnx_op: str) -> Tensor:
    """A reduction whose axes are an attribute at opset 17 (ReduceMean, ReduceMax, ReduceMin)."""
    axes = _axes(ctx.arg(1, "axis"))
    return ctx.emit(onnx_op, [ctx.x(0)], axes=axes or None, keepdims=int(bool(ctx.arg(2, "keep_dims", False))))


@op("ReduceMean", "MeanExt", onnx="ReduceMean", notes="global pooling when over the spatial axes")
def reduce_mean(ctx: Ctx) -> Tensor:
    if ctx.call.op == "MeanExt" and ctx.arg(3) is not None:
        ctx.fail("a mean with a dtype argument is not supported")
    return _reduce(ctx, "ReduceMean")


@op("ReduceSum", "SumExt", onnx="ReduceSum")
def reduce_sum(ctx: Ctx) -> Tensor:
    axes = _axes(ctx.arg(1, "axis"))
    if ctx.call.op == "SumExt" and ctx.arg(3) is not None:
        ctx.fail("a sum with a dtype argument is not supported")
    inputs = [ctx.x(0)] + ([ctx.b.ints(axes, f"{ctx.hint}_axes")] if axes else [])
    return ctx.emit("ReduceSum", inputs, keepdims=int(bool(ctx.arg(2, "keep_dims", False))))


# -- shape and indexing ---------------------------------------------------------------------------------
for _ms in ("ReduceMax", "ReduceMin"):
    op(_ms, onnx=_ms, notes="global max pooling when over the spatial axes" if _ms == "ReduceMax" else "")(
        lambda ctx: _reduce(ctx, ctx.call.op)
    )


@op("Argmax", onnx="ArgMax (+ Cast to MindSpore's int32)")
def argmax(ctx: Ctx) -> Tensor:
    type_id = int(ctx.arg(2, "output_type", 34))
    if type_id not in TYPE_IDS:
        ctx.fail(f"argmax to MindSpore type id {type_id} is not supported")
    index = ctx.emit("ArgMax", [ctx.x(0)], axis=int(ctx.arg(1, "axis", -1)), keepdims=0)
    return ctx.emit("Cast", [index], to=TYPE_IDS[type_id])


@op("TopK", onnx="TopK (+ Cast of the indices to int32)", notes="sorted, along the last axis")
def top_k(ctx: Ctx) -> tuple[Tensor, Tensor]:
    if not ctx.call.attrs.get("sorted", True):
        ctx.fail("unsorted TopK is not supported")
    k = ctx.b.ints([int(ctx.arg(1))], f"{ctx.hint}_k")
    values, indices = ctx.b.multi_op("TopK", [ctx.x(0), k], ctx.hint, 2, ctx.rank, axis=-1)
    return values, ctx.b.op("Cast", [indices], ctx.hint, ctx.rank, to=TensorProto.INT32)


@op("AdaptiveAvgPool2D", "AdaptiveMaxPool2D", onnx="GlobalAveragePool, GlobalMaxPool", notes="output size 1x1")
def adaptive_pool(ctx: Ctx) -> Any:
    size = ctx.arg(1, "output_size")
    if size is None or _pair(size) != [1, 1]:
        ctx.fail(f"output size {size} is not supported (only 1x1, global pooling)")
    if ctx.call.op == "AdaptiveAvgPool2D":
        return ctx.emit("GlobalAveragePool", [ctx.x(0)])
    return (ctx.emit("GlobalMaxPool", [ctx.x(0)], rank=4), None)  # the argmax output is not translated


@op(
    "ResizeNearestNeighborV2",
    "ResizeBilinearV2",
    onnx="Resize (sizes from the input's batch and channels and the given height and width)",
    notes="a fixed output size (nn.Upsample and ops.interpolate with static input shapes); align_corners; "
    "half_pixel_centers for bilinear",
)
def resize(ctx: Ctx) -> Tensor:
    size = _axes(ctx.arg(1, "size"))
    align, half = bool(ctx.arg(2, "align_corners", False)), bool(ctx.arg(3, "half_pixel_centers", False))
    nearest = ctx.call.op == "ResizeNearestNeighborV2"
    if len(size) != 2 or any(d < 1 for d in size):
        ctx.fail(f"output size {size} is not supported (a fixed height and width)")
    if nearest and half:
        ctx.fail("nearest-neighbour resizing with half_pixel_centers is not supported")
    x = ctx.x(0)
    leading = ctx.emit(
        "Slice", [ctx.emit("Shape", [x], rank=1), ctx.b.ints([0], "starts"), ctx.b.ints([2], "ends")], rank=1
    )
    sizes = ctx.emit("Concat", [leading, ctx.b.ints(size, f"{ctx.hint}_size")], rank=1, axis=0)
    return ctx.emit(
        "Resize",
        [x, "", "", sizes],
        mode="nearest" if nearest else "linear",
        coordinate_transformation_mode="align_corners" if align else "half_pixel" if half else "asymmetric",
        # TensorFlow's (and MindSpore's) nearest neighbour rounds with align_corners, else floors
        nearest_mode=("round_prefer_ceil" if align else "floor") if nearest else None,
    )


@op("Reshape", onnx="Reshape", notes="-1 (dynamic batch) stays dynamic")
def reshape(ctx: Ctx) -> Tensor:
    shape = ctx.args[1]
    target = shape if isinstance(shape, Tensor) else ctx.b.ints(shape, f"{ctx.hint}_shape")
    return ctx.emit("Reshape", [ctx.x(0), target])


@op("Flatten", onnx="Flatten")
def flatten(ctx: Ctx) -> Tensor:
    return ctx.emit("Flatten", [ctx.x(0)], axis=1)


@op("Transpose", onnx="Transpose")
def transpose(ctx: Ctx) -> Tensor:
    return ctx.emit("Transpose", [ctx.x(0)], perm=_axes(ctx.arg(1, "perm")))


@op("Squeeze", onnx="Squeeze")
def squeeze(ctx: Ctx) -> Tensor:
    axes = _axes(ctx.arg(1, "axis"))
    return ctx.emit("Squeeze", [ctx.x(0)] + ([ctx.b.ints(axes, f"{ctx.hint}_axes")] if axes else []))


@op("ExpandDims", onnx="Unsqueeze")
def expand_dims(ctx: Ctx) -> Tensor:
    return ctx.emit("Unsqueeze", [ctx.x(0), ctx.b.ints(_axes(ctx.arg(1, "axis")), f"{ctx.hint}_axes")])


@op("Concat", onnx="Concat")
def concat(ctx: Ctx) -> Tensor:
    parts = ctx.args[0]
    if not isinstance(parts, tuple):
        ctx.fail("expected a tuple of tensors")
    return ctx.emit(
        "Concat", [ctx.b.tensor(p, ctx.dtype, f"{ctx.hint}_part") for p in parts], axis=int(ctx.arg(1, "axis", 0))
    )


@op("Stack", onnx="Unsqueeze each, Concat")
def stack(ctx: Ctx) -> Tensor:
    parts, axis = ctx.args[0], int(ctx.arg(1, "axis", 0))
    if not isinstance(parts, tuple):
        ctx.fail("expected a tuple of tensors")
    grown = ctx.b.ints([axis], f"{ctx.hint}_axis")
    return ctx.emit(
        "Concat",
        [ctx.emit("Unsqueeze", [ctx.b.tensor(p, ctx.dtype, f"{ctx.hint}_part"), grown]) for p in parts],
        axis=axis,
    )


@op("Tile", onnx="Tile")
def tile(ctx: Ctx) -> Tensor:
    reps = _axes(ctx.arg(1, "dims"))
    if len(reps) < ctx.rank:
        reps = [1] * (ctx.rank - len(reps)) + reps
    if len(reps) != ctx.b.rank(ctx.x(0)):
        ctx.fail("tiling that adds dimensions is not supported")
    return ctx.emit("Tile", [ctx.x(0), ctx.b.ints(reps, f"{ctx.hint}_reps")])


@op("Split", onnx="Split", notes="equal parts along an axis of known size")
def split(ctx: Ctx) -> tuple[Tensor, ...]:
    axis, parts = int(ctx.arg(1, "axis", 0)), int(ctx.arg(2, "output_num", 1))
    size = ctx.call.out[0].shape[axis] if ctx.call.out else -1
    if size < 0:
        ctx.fail(f"splitting dynamic axis {axis} is not supported")
    return tuple(
        ctx.b.multi_op(
            "Split", [ctx.x(0), ctx.b.ints([size] * parts, f"{ctx.hint}_split")], ctx.hint, parts, ctx.rank, axis=axis
        )
    )


@op("PadV3", onnx="Pad", notes="constant, reflect and edge modes")
def pad(ctx: Ctx) -> Tensor:
    paddings, mode = [int(p) for p in ctx.arg(1)], str(ctx.call.attrs.get("mode", "constant"))
    if mode not in ("constant", "reflect", "edge") or not ctx.call.attrs.get("paddings_contiguous", True):
        ctx.fail(f"pad mode '{mode}' (or non-contiguous paddings) is not supported")
    begin, end = [0] * ctx.rank, [0] * ctx.rank
    for i in range(len(paddings) // 2):  # pairs run from the last axis backwards, as in torch's pad
        begin[ctx.rank - 1 - i], end[ctx.rank - 1 - i] = paddings[2 * i], paddings[2 * i + 1]
    inputs = [ctx.x(0), ctx.b.ints(begin + end, f"{ctx.hint}_pads")]
    if mode == "constant" and len(ctx.args) > 2 and ctx.args[2] is not None:
        inputs.append(ctx.b.tensor(np.asarray(ctx.args[2]).reshape(()), ctx.dtype, f"{ctx.hint}_value"))
    return ctx.emit("Pad", inputs, mode=mode)


@op("Gather", onnx="Gather", notes="batch_dims=0")
def gather(ctx: Ctx) -> Tensor:
    if int(ctx.arg(3, "batch_dims", 0) or 0):
        ctx.fail("batch_dims other than 0 is not supported")
    return ctx.emit("Gather", [ctx.x(0), ctx.x(1)], axis=int(ctx.arg(2, "axis", 0)))


@op("StridedSlice", onnx="Slice (+ Squeeze for shrink_axis_mask)", notes="no ellipsis or new-axis masks")
def strided_slice(ctx: Ctx) -> Tensor:
    begin, end, strides = (list(_axes(ctx.arg(i))) for i in (1, 2, 3))
    begin_mask, end_mask, ellipsis, new_axis, shrink = (int(ctx.arg(i, None, 0) or 0) for i in range(4, 9))
    if ellipsis or new_axis:
        ctx.fail("ellipsis and new-axis masks are not supported")
    for axis, step in enumerate(strides):
        if begin_mask >> axis & 1:
            begin[axis] = 0 if step > 0 else -1
        if end_mask >> axis & 1:
            end[axis] = INT64_MAX if step > 0 else -INT64_MAX
    x = ctx.x(0)
    rank = ctx.b.rank(x)
    axes = list(range(len(begin)))
    out = ctx.emit(
        "Slice",
        [
            x,
            ctx.b.ints(begin, "starts"),
            ctx.b.ints(end, "ends"),
            ctx.b.ints(axes, "axes"),
            ctx.b.ints(strides, "steps"),
        ],
        rank=rank,
    )
    squeezed = [axis for axis in axes if shrink >> axis & 1]
    return ctx.emit("Squeeze", [out, ctx.b.ints(squeezed, "shrink")]) if squeezed else out


@op("Slice", onnx="Slice", notes="begin and size (-1: to the end)")
def slice_(ctx: Ctx) -> Tensor:
    begin, size = _axes(ctx.arg(1)), _axes(ctx.arg(2))
    end = [INT64_MAX if n == -1 else b + n for b, n in zip(begin, size)]
    axes = list(range(len(begin)))
    return ctx.emit("Slice", [ctx.x(0), ctx.b.ints(begin, "starts"), ctx.b.ints(end, "ends"), ctx.b.ints(axes, "axes")])
