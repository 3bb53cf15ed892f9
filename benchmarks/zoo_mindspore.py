"""Train a LeNet-style CNN on scikit-learn's digits with MindSpore and save it as MindIR (the zoo's
MindSpore model: none ships in a package). Runs in the MindSpore venv, which has no scikit-learn:
the zoo hands it the digits as DIR/digits-train.npz. python zoo_mindspore.py DIR"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def main(out: Path) -> None:
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


if __name__ == "__main__":
    main(Path(sys.argv[1]))
