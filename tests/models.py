"""Small real models the tests build, script or trace, and save as TorchScript files.

Tests load the saved files without these classes (that is what a user's .pt is).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(torch.relu(self.bn(self.conv(x)))), 1))


class AttentionBlock(nn.Module):
    """Hand-written single-head attention with residual and LayerNorm."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) * self.scale, dim=-1)
        return self.norm(x + weights @ self.v(x))


class TokenClassifier(nn.Module):
    """Two inputs, one of them int64 token ids: embedding + masked mean pooling + two heads."""

    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = AttentionBlock(dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.block(self.embed(input_ids))
        pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        return self.head(pooled), pooled


class SentenceEncoder(nn.Module):
    """A BERT-style sentence encoder written the way MiniLM's exporter writes one: the attention
    mask widened to [batch, 1, 1, seq] and turned into -10000 biases, scores scaled by a constant,
    GELU through erf, post-LayerNorm, and mean pooling over the real tokens."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2, seq: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.words, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {
                    "qkv": nn.Linear(dim, 3 * dim),
                    "out": nn.Linear(dim, dim),
                    "norm1": nn.LayerNorm(dim),
                    "up": nn.Linear(dim, 4 * dim),
                    "down": nn.Linear(4 * dim, dim),
                    "norm2": nn.LayerNorm(dim),
                }
            )
            for _ in range(layers)
        )

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0)
        x = self.norm(self.words(input_ids) + self.positions(positions))
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            q, k, v = layer["qkv"](x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
            scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5) + bias
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, -1)
            x = layer["norm1"](x + layer["out"](context))
            x = layer["norm2"](x + layer["down"](nn.functional.gelu(layer["up"](x))))
        mask = attention_mask.unsqueeze(-1).to(x.dtype)
        return (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)


class DataDependentLoop(nn.Module):
    """Branch on the data and loop a data-dependent number of times (needs torch.jit.script)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if bool(x.mean() > 0):  # noqa: SIM108 (a scripted branch: the control flow under test)
            y = y * 2.0
        else:
            y = y - 1.0
        steps = 0
        while bool(y.abs().max() > 1.0) and steps < 20:  # iteration count depends on the values
            y = y * 0.5
            steps += 1
        return y + float(steps)


class MultiHeadAttentionModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x)[0]


class Histogram(nn.Module):
    """aten::histc has no ONNX conversion on either exporter path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x, bins=4)


def save_models(directory: Path) -> dict[str, tuple[Path, list[str]]]:
    """Build every test model; return name -> (file, --input-shape specs)."""
    torch.manual_seed(0)
    cnn = SmallCNN().eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, as after training
        cnn.bn.running_mean.uniform_(-0.5, 0.5)
        cnn.bn.running_var.uniform_(0.5, 2.0)
    x_img, x_seq = torch.randn(2, 1, 8, 8), torch.randn(2, 5, 16)
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6)
    built = {
        "cnn_scripted": (torch.jit.script(cnn), ["x:2x1x8x8"]),
        "cnn_traced": (torch.jit.trace(cnn, (x_img,)), ["x:2x1x8x8"]),
        "attention_scripted": (torch.jit.script(AttentionBlock().eval()), ["x:2x5x16"]),
        "attention_traced": (torch.jit.trace(AttentionBlock().eval(), (x_seq,)), ["x:2x5x16"]),
        "tokens_traced": (
            torch.jit.trace(TokenClassifier().eval(), (ids, mask)),
            ["input_ids:2,seq=6:int64", "mask:2,seq=6:float32"],
        ),
        "control_flow_scripted": (torch.jit.script(DataDependentLoop()), ["x:2x3"]),
        "mha_traced": (torch.jit.trace(MultiHeadAttentionModel().eval(), (x_seq,), check_trace=False), ["x:2x5x16"]),
        "histc_traced": (torch.jit.trace(Histogram(), (torch.randn(2, 4),)), ["x:2x4"]),
    }
    out = {}
    for name, (module, shapes) in built.items():
        path = directory / f"{name}.pt"
        torch.jit.save(module, str(path))
        out[name] = (path, shapes)
    return out


class DigitsCNN(nn.Module):
    """Wide enough to be over-parameterised, as real CNNs are (pruning has room to work)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, added to its input."""

    def __init__(self, channels: int, expand: int = 3) -> None:
        super().__init__()
        hidden = channels * expand
        self.block = nn.Sequential(
            nn.Conv2d(channels, hidden, 1),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, channels, 1),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class ResidualDigitsNet(nn.Module):
    """The layouts that couple channels across layers: a residual stream through two inverted
    residual blocks (depthwise inside), then two branches concatenated before the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(32), InvertedResidual(32))
        self.wide = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        self.narrow = nn.Sequential(nn.Conv2d(32, 32, 1), nn.ReLU())
        self.classifier = nn.Sequential(nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.classifier(torch.cat([self.wide(x), self.narrow(x)], dim=1))


def train_digits_cnn(epochs: int = 6, network: type[nn.Module] = DigitsCNN) -> tuple[nn.Module, np.ndarray, np.ndarray]:
    """Train on scikit-learn's digits (real 8x8 images); return the model and held-out data."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    order = np.random.default_rng(0).permutation(len(images))
    train, held_out = order[:1100], order[1100:]
    torch.manual_seed(0)
    model = network()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    x, y = torch.from_numpy(images[train]), torch.from_numpy(digits.target[train]).long()
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
    return model.eval(), images[held_out], digits.target[held_out]


class Framer(torch.nn.Module):
    """A voice-activity front end whose forward() takes the sample rate as an int (as Silero's VAD
    does): it picks the frame length and the branch from it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 2)

    def forward(self, audio: torch.Tensor, sample_rate: int) -> torch.Tensor:
        frame = 8 if sample_rate == 8000 else 16
        frames = audio.reshape(audio.shape[0], -1, frame)[..., :8]
        if sample_rate > 8000:
            frames = frames * 0.5
        return self.proj(frames).softmax(-1)


def check_framer_package(path: Path, audio: np.ndarray, expected: np.ndarray) -> None:
    """A Framer exported with --constant sample_rate=16000: the value in the manifest, the audio its
    only input, and the 16 kHz branch's answers (frames of 16 samples, not 8 kHz's 8)."""
    import unideploy

    with unideploy.open_package(path) as package:
        assert package.manifest.source["constants"] == {"sample_rate": 16000}
        assert [s.name for s in package.manifest.signature.inputs] == ["audio"]
        assert package.manifest.validation["onnx-fp32"]["passed"]
        got = unideploy.run(package, {"audio": audio})["output"]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert got.shape == (len(audio), audio.shape[1] // 16, 2)
