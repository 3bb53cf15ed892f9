from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def torch_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """Every test model saved as TorchScript: name -> (path, input shapes)."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    from models import save_models

    return save_models(tmp_path_factory.mktemp("torchscript"))


@pytest.fixture(scope="session")
def cnn_package_session(torch_models, tmp_path_factory) -> Path:
    import unideploy

    path, shapes = torch_models["cnn_scripted"]
    out = tmp_path_factory.mktemp("pkg") / "cnn.udp"
    unideploy.export(path, out, input_shapes=shapes).close()
    return out


@pytest.fixture
def cnn_package(cnn_package_session: Path, tmp_path: Path) -> Path:
    """A fresh copy of a verified CNN package, free to tamper with."""
    copy = tmp_path / "cnn.udp"
    shutil.copytree(cnn_package_session, copy)
    return copy


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> dict[str, Path]:
    """A CNN trained on real digits, exported with real example inputs, and labelled data."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    import numpy as np
    import torch

    import unideploy
    from models import train_digits_cnn

    root = tmp_path_factory.mktemp("digits")
    model, images, labels = train_digits_cnn()
    torch.jit.save(torch.jit.script(model), str(root / "digits.pt"))
    np.savez(root / "data.npz", x=images, labels=labels)  # 697 held-out rows
    unideploy.export(root / "digits.pt", root / "digits.udp", example_inputs={"x": images[:8]}).close()
    return {"model": root / "digits.pt", "package": root / "digits.udp", "data": root / "data.npz"}


@pytest.fixture
def digits_package(digits, tmp_path) -> Path:
    copy = tmp_path / "digits.udp"
    shutil.copytree(digits["package"], copy)
    return copy


@pytest.fixture(scope="module")
def repo(digits, tmp_path_factory) -> Path:
    """A model repository holding the digits package as version 1."""
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(digits["package"], root / "digits" / "1")
    return root
