"""MindSpore Cells the MindIR tests export: a CNN, a transformer block with exact GELU, a wide
operator mix, a face-detector stem (PReLU, ceil-mode pooling), a mobile network's head, a detector's
neck and its decoding, and one with an operator outside the translator's table (CumSum)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def build_cells() -> dict[str, tuple[object, list[object]]]:
    import mindspore as ms
    from mindspore import Parameter, Tensor, mint, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    rng = np.random.default_rng(0)

    class CNN(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, pad_mode="same", has_bias=True)
            self.bn = nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(2, 2)
            self.conv2 = nn.Conv2d(8, 16, 3, stride=2, pad_mode="pad", padding=1, group=8, dilation=1)
            self.conv3 = nn.Conv2d(16, 16, 3, pad_mode="valid", dilation=2, has_bias=True)
            self.avg = nn.AvgPool2d(2, 1, pad_mode="same")
            self.fc = nn.Dense(16, 10)
            self.relu = nn.ReLU()

        def construct(self, x):
            x = self.pool(self.relu(self.bn(self.conv1(x))))
            x = ops.relu6(self.conv2(x))
            x = self.avg(ops.pad(x, (2, 2, 2, 2)))
            x = ops.sigmoid(self.conv3(x))
            return self.fc(x.mean(axis=(2, 3)))

    class Encoder(nn.Cell):
        """A transformer encoder block: multi-head self-attention, LayerNorm, exact-GELU MLP."""

        def __init__(self, d: int = 16, heads: int = 2) -> None:
            super().__init__()
            self.qkv = nn.Dense(d, 3 * d)
            self.out = nn.Dense(d, d)
            self.ln1, self.ln2 = nn.LayerNorm((d,)), nn.LayerNorm((d,))
            self.ff1, self.ff2 = nn.Dense(d, 4 * d), nn.Dense(4 * d, d)
            self.gelu = nn.GELU(approximate=False)
            self.heads, self.d = heads, d

        def construct(self, x):
            b, s, _ = x.shape
            q, k, v = ops.split(self.qkv(x), self.d, axis=-1)

            def heads(t):
                return t.reshape(b, s, self.heads, self.d // self.heads).transpose(0, 2, 1, 3)

            scores = ops.matmul(heads(q), heads(k).transpose(0, 1, 3, 2)) / float(np.sqrt(self.d // self.heads))
            attn = ops.matmul(ops.softmax(scores, axis=-1), heads(v)).transpose(0, 2, 1, 3).reshape(b, s, self.d)
            x = self.ln1(x + self.out(attn))
            return self.ln2(x + self.ff2(self.gelu(self.ff1(x))))

    class Mix(nn.Cell):
        """Operators the other two do not reach: Gather, Concat, StridedSlice, Squeeze/ExpandDims,
        Tile, BatchMatMul, ReduceSum, Cast, Pow/Sqrt/Abs, SiLU/Tanh, tanh-GELU, Flatten, Muls."""

        def __init__(self) -> None:
            super().__init__()
            self.emb = Parameter(Tensor(rng.standard_normal((10, 4)).astype(np.float32)), name="emb")
            self.w = Parameter(Tensor(rng.standard_normal((2, 8, 8)).astype(np.float32)), name="w")
            self.dense = nn.Dense(16, 8, activation="relu")
            self.flat = nn.Flatten()
            self.gelu = nn.GELU()

        def construct(self, x, ids):
            a = (ops.tanh(x) - ops.sigmoid(x)) * ops.silu(x)
            a = ops.pow(a, 2.0) + ops.sqrt(ops.abs(a)) * 3.0
            g = self.gelu(self.dense(self.flat(a)))
            c = ops.concat((ops.squeeze(ops.expand_dims(g, 1), 1), g), 1)[:, 2:10:2]
            e = ops.ReduceSum(keep_dims=True)(ops.gather(self.emb, ids, 0), 1) + c
            e = ops.cast(ops.cast(e, ms.float16), ms.float32)
            t = ops.bmm(ops.tile(ops.expand_dims(g, 0), (2, 1, 1)), self.w)
            return e, ops.reduce_mean(t, 0), ops.softmax(e, axis=1)

    class Elementwise(nn.Cell):
        """The mint/functional spellings: Dense, AddScalar (alpha), MeanExt, MatMulExt, and
        Exp/Log/Neg/Reciprocal/Maximum/Minimum."""

        def __init__(self) -> None:
            super().__init__()
            self.w = Parameter(Tensor(rng.standard_normal((5, 6)).astype(np.float32)), name="w")
            self.b = Parameter(Tensor(rng.standard_normal(5).astype(np.float32)), name="b")

        def construct(self, x):
            y = ops.maximum(ops.exp(x * 0.1), ops.minimum(ops.neg(x), ops.reciprocal(ops.abs(x) + 1.0)))
            y = ops.log(ops.abs(y) + 1.0) - x.mean(axis=1, keep_dims=True)
            z = mint.add(ops.dense(y, self.w, self.b), 1.0, alpha=2.0)
            z = mint.matmul(z.reshape(-1, 1, 5), z.reshape(-1, 5, 1))
            return z, mint.mean(y, dim=1)

    class FaceStem(nn.Cell):
        """MTCNN's and RetinaFace's stem: PReLU per channel and max pooling in ceil mode (which
        MindSpore exports as MaxPool3DWithArgmax between ExpandDims and Squeeze)."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True)
            self.prelu = nn.PReLU(8, w=0.25)
            self.pool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="pad", padding=0, ceil_mode=True)
            self.conv2 = nn.Conv2d(8, 4, 3, pad_mode="same", has_bias=True)
            self.prelu2 = nn.PReLU()  # one slope for every channel

        def construct(self, x):
            return self.prelu2(self.conv2(self.pool(self.prelu(self.conv(x)))))

    class MobileHead(nn.Cell):
        """MobileNetV3's and YOLO's activations and a squeeze-excite gate: HSwish, HSigmoid,
        LeakyReLU, Mish, ELU, global average and max pooling, GroupNorm."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, pad_mode="same", has_bias=True)
            self.norm = nn.GroupNorm(2, 8)
            self.hswish, self.hsigmoid = nn.HSwish(), nn.HSigmoid()
            self.leaky, self.mish, self.elu = nn.LeakyReLU(0.1), nn.Mish(), nn.ELU()
            self.avg, self.max = nn.AdaptiveAvgPool2d(1), nn.AdaptiveMaxPool2d(1)

        def construct(self, x):
            y = self.hswish(self.norm(self.conv(x)))
            gate = self.hsigmoid(self.avg(y))  # squeeze-excite
            y = self.leaky(y * gate) + self.mish(y) - self.elu(y)
            return y, self.max(y)

    class DetectorNeck(nn.Cell):
        """A feature pyramid's upsampling (transposed convolution, and resizing to a fixed size,
        which is how MindSpore writes nn.Upsample for static shapes) and a local response norm."""

        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Conv2dTranspose(4, 6, 4, stride=2, pad_mode="same", has_bias=True)
            self.odd = nn.Conv2dTranspose(4, 2, 1, stride=2, pad_mode="same")  # kernel < stride
            self.lrn = nn.LRN(depth_radius=2, bias=1.0, alpha=0.5, beta=0.75)
            self.nearest = ops.ResizeNearestNeighborV2()
            self.bilinear = ops.ResizeBilinearV2(align_corners=True)

        def construct(self, x):
            up = ops.concat((self.up(x), self.odd(x), self.nearest(x, (16, 16))), 1)
            return self.lrn(up), self.bilinear(x, (11, 13))

    class Decoding(nn.Cell):
        """What classification and detection heads do with their scores: LogSoftmax, Argmax, TopK,
        ReduceMax/Min, Greater and Select, Slice, Stack, and the element-wise Rsqrt, Square, Floor,
        Sin, Cos, Softplus and Softsign."""

        def construct(self, x):
            probs = nn.LogSoftmax(axis=-1)(x)
            values, _ = ops.TopK()(x, 3)
            kept = ops.select(x > 0.5, ops.Rsqrt()(ops.Square()(x) + 1.0), ops.Floor()(x))
            waves = ops.Sin()(x) * ops.Cos()(x) + ops.Softplus()(x) - ops.Softsign()(x)
            extremes = ops.stack((ops.ReduceMax()(x, 1), ops.ReduceMin()(x, 1)), 1)
            return probs, ops.Argmax(axis=1)(x), values, ops.Slice()(kept + waves, (0, 1), (-1, 4)), extremes

    class Unsupported(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Dense(6, 6)

        def construct(self, x):
            return ops.cumsum(self.fc(x), 1)

    cnn = CNN()
    face = FaceStem()
    face.prelu.w.set_data(Tensor(rng.uniform(0.05, 0.5, 8).astype(np.float32)))  # a slope per channel
    for param in (cnn.bn.gamma, cnn.bn.beta, cnn.bn.moving_mean, cnn.bn.moving_variance):  # not the identity
        param.set_data(Tensor(rng.uniform(0.5, 1.5, param.shape).astype(np.float32)))
    f32 = ms.float32
    return {
        "cnn": (cnn, [Tensor(shape=[None, 1, 16, 16], dtype=f32)]),
        "encoder": (Encoder(), [Tensor(shape=[None, 6, 16], dtype=f32)]),
        "mix": (Mix(), [Tensor(shape=[None, 4, 4], dtype=f32), Tensor(shape=[None], dtype=ms.int32)]),
        "elementwise": (Elementwise(), [Tensor(shape=[None, 6], dtype=f32)]),
        "face": (face, [Tensor(shape=[None, 3, 24, 24], dtype=f32)]),
        "mobile": (MobileHead(), [Tensor(shape=[None, 4, 8, 8], dtype=f32)]),
        "neck": (DetectorNeck(), [Tensor(shape=[None, 4, 8, 8], dtype=f32)]),
        "decoding": (Decoding(), [Tensor(shape=[None, 10], dtype=f32)]),
        # with a dynamic batch, nn.Upsample keeps a branch on whether a dim is known: nested graphs
        "upsample": (
            nn.Upsample(scale_factor=2.0, mode="nearest", recompute_scale_factor=True),
            [Tensor(shape=[None, 4, 8, 8], dtype=f32)],
        ),
        "unsupported": (Unsupported(), [Tensor(shape=[None, 6], dtype=f32)]),
    }


def save_mindir_models(directory: Path) -> dict[str, Path]:
    import mindspore as ms

    paths = {}
    for name, (cell, inputs) in build_cells().items():
        cell.set_train(False)
        ms.export(cell, *inputs, file_name=str(directory / name), file_format="MINDIR")
        paths[name] = directory / f"{name}.mindir"
    return paths
