"""End-to-end demo on the embedded default runtime (ONNX Runtime, CPU).

Trains a small CNN on scikit-learn's digits (1797 real 8x8 images, no download), saves it as
TorchScript, then drives the real ``deploy`` CLI: export -> inspect -> run -> optimize -> verify ->
bench. Everything lands in ``examples/out/``.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

OUT = Path(__file__).parent / "out"
DEPLOY = shutil.which("deploy", path=str(Path(sys.executable).parent)) or "deploy"


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def train() -> tuple[Path, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # [N, 1, 8, 8] in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.25, random_state=0)
    torch.manual_seed(0)
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train).long()
    for _ in range(8):
        for idx in torch.randperm(len(xt)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean()
    print(f"trained DigitsCNN in PyTorch: test accuracy {accuracy:.3f} on {len(y_test)} held-out digits")
    path = OUT / "digits_cnn.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    return path, x_train, y_train, x_test, y_test


def deploy(*args: object, may_refuse: bool = False) -> None:
    """Run one ``deploy`` command as a user would; ``may_refuse``: a refusal (exit 1, with its
    reason, the package unchanged) is one of the outcomes shown, not a failed demo."""
    cmd = [DEPLOY, *map(str, args)]
    print(f"\n$ deploy {shlex.join(cmd[1:])}", flush=True)
    returncode = subprocess.run(cmd).returncode
    if returncode == 1 and may_refuse:
        print("(refused: the package is as it was)")
    elif returncode:
        raise subprocess.CalledProcessError(returncode, cmd)


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    model_path, x_train, y_train, x_test, y_test = train()
    np.savez(OUT / "examples.npz", x=x_train[:8])  # real images become the reference samples
    np.savez(OUT / "calibration.npz", x=x_train[:600], labels=y_train[:600])
    np.savez(OUT / "test_images.npz", x=x_test)
    package = OUT / "digits.udp"

    deploy("export", model_path, "-o", package, "--example-input", OUT / "examples.npz", "--name", "digits-cnn")
    deploy("inspect", package)
    deploy("run", package, "--input", OUT / "test_images.npz", "-o", OUT / "predictions.npz")
    with np.load(OUT / "predictions.npz") as predictions:
        accuracy = (predictions["output"].argmax(1) == y_test).mean()
    print(f"accuracy of the packaged model on ONNX Runtime: {accuracy:.3f}")
    # INT8 is kept only where it runs faster than fp32: this small CNN is about even, so on some CPUs it is refused
    deploy("optimize", package, "--quantize", "int8", "--calibration", OUT / "calibration.npz", may_refuse=True)
    deploy(
        "optimize", package, "--prune", "0.5", "--prune-method", "channels", "--calibration", OUT / "calibration.npz"
    )
    deploy("verify", package)
    deploy("bench", package, "--batch-size", "64", "--iterations", "200")
    deploy("bench", package, "--batch-size", "64", "--iterations", "200", "--artifact", "onnx-slim50")
    deploy(
        "export",
        model_path,
        "-o",
        OUT / "digits.zip",
        "--input-shape",
        "x:1x1x8x8",
        "--name",
        "digits-cnn",
        "--quantize",
        "fp16",
        "--calibration",
        OUT / "calibration.npz",
    )
    deploy("verify", OUT / "digits.zip")
    print(f"\ndone: packages in {OUT}")


if __name__ == "__main__":
    main()
