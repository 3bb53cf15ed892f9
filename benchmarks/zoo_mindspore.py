"""The zoo's MindSpore models, saved as MindIR (none ships in a package). Runs in the MindSpore venv,
which has neither scikit-learn nor the mtcnn package: the zoo hands it their data as .npz.

    python zoo_mindspore.py digits DIR   # a LeNet-style CNN trained on DIR/digits-train.npz
    python zoo_mindspore.py pnet DIR     # MTCNN's P-Net with the weights in DIR/pnet-weights.npz
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def digits(out: Path) -> None:
    import mindspore as ms
    from mindspore import Tensor, nn

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(0)
    with np.load(out / "digits-train.npz") as data:
        train_x, train_y = data["x"], data["labels"].astype(np.int32)

    net = nn.SequentialCell(
        nn.Conv2d(1, 16, 3, pad_mode="same", has_bias=True),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(16, 32, 3, pad_mode="same", has_bias=True),
        nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(),
        nn.Dense(32 * 2 * 2, 64),
        nn.ReLU(),
        nn.Dense(64, 10),
    )
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.Adam(net.trainable_params(), learning_rate=3e-3))
    step.set_train()
    rng = np.random.default_rng(0)
    for _ in range(15):
        order = rng.permutation(len(train_x))
        for i in range(0, len(order), 64):
            idx = order[i : i + 64]
            step(Tensor(train_x[idx]), Tensor(train_y[idx]))
    net.set_train(False)
    ms.export(
        net, Tensor(shape=[None, 1, 8, 8], dtype=ms.float32), file_name=str(out / "digits_lenet"), file_format="MINDIR"
    )


def pnet(out: Path) -> None:
    """MTCNN's proposal network as a Cell: Keras' kernels (HWIO) as MindSpore's (OIHW), its PReLU
    slopes shared over height and width (one per channel), and its 2x2 'same' pooling as MindSpore
    writes it: ceil mode, which MindSpore exports as MaxPool3DWithArgmax."""
    import mindspore as ms
    from mindspore import Tensor, nn

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

    class PNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 10, 3, pad_mode="valid", has_bias=True)
            self.prelu1 = nn.PReLU(10)
            self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2, pad_mode="pad", padding=0, ceil_mode=True)
            self.conv2 = nn.Conv2d(10, 16, 3, pad_mode="valid", has_bias=True)
            self.prelu2 = nn.PReLU(16)
            self.conv3 = nn.Conv2d(16, 32, 3, pad_mode="valid", has_bias=True)
            self.prelu3 = nn.PReLU(32)
            self.boxes = nn.Conv2d(32, 4, 1, pad_mode="valid", has_bias=True)
            self.faces = nn.Conv2d(32, 2, 1, pad_mode="valid", has_bias=True)
            self.softmax = nn.Softmax(axis=1)

        def construct(self, x):
            x = self.pool1(self.prelu1(self.conv1(x)))
            x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
            return self.boxes(x), self.softmax(self.faces(x))

    net = PNet()
    with np.load(out / "pnet-weights.npz") as data:
        weights = [data[f"w{i}"] for i in range(len(data.files))]
    layers = [net.conv1, net.prelu1, net.conv2, net.prelu2, net.conv3, net.prelu3, net.boxes, net.faces]
    for layer in layers:  # in the Keras model's order: kernel and bias of a conv, the slopes of a PReLU
        if isinstance(layer, nn.PReLU):
            layer.w.set_data(Tensor(weights.pop(0).reshape(-1)))
        else:
            layer.weight.set_data(Tensor(np.ascontiguousarray(weights.pop(0).transpose(3, 2, 0, 1))))
            layer.bias.set_data(Tensor(weights.pop(0)))
    net.set_train(False)
    ms.export(
        net,
        Tensor(shape=[None, 3, None, None], dtype=ms.float32),
        file_name=str(out / "mtcnn_pnet"),
        file_format="MINDIR",
    )


if __name__ == "__main__":
    {"digits": digits, "pnet": pnet}[sys.argv[1]](Path(sys.argv[2]))
