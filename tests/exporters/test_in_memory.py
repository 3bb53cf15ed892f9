"""unideploy.export on models in memory: a torch module (scripted where TorchScript compiles it,
traced otherwise) and a Keras model, exported as the file they are saved to would be."""

from __future__ import annotations

import numpy as np
import pytest

import unideploy
from unideploy.errors import InputError


def test_a_trained_module_in_memory_is_scripted_and_matches(digits, tmp_path):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    import torch
    from models import train_digits_cnn

    model, images, _ = train_digits_cnn(epochs=1)
    with unideploy.export(model, tmp_path / "pkg", example_inputs={"x": images[:8]}) as package:
        assert package.manifest.source["path"].endswith("DigitsCNN.pt")
        assert package.manifest.validation["onnx-fp32"]["passed"]
        assert package.manifest.signature.inputs[0].shape[0] == "batch"
    expected = model(torch.from_numpy(images[:5])).detach().numpy()
    np.testing.assert_allclose(unideploy.run(tmp_path / "pkg", {"x": images[:5]})["output"], expected, atol=1e-4)


def test_a_module_torchscript_cannot_compile_is_traced_on_the_example(tmp_path):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, features):
            return self.linear(features) * float(np.float32(2.0))  # numpy: TorchScript refuses it

    rows = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    with unideploy.export(Scaled(), tmp_path / "pkg", example_inputs={"features": rows}) as package:
        assert package.manifest.validation["onnx-fp32"]["passed"]
    with pytest.raises(InputError, match=r"cannot be scripted .*tracing it needs a value for 'features'"):
        unideploy.export(Scaled(), tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_a_keras_model_in_memory_exports(tmp_path):
    keras = pytest.importorskip("keras", reason="the tensorflow extra is not installed")
    inputs = keras.Input((6,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.Dense(8)(inputs)))
    rows = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    with unideploy.export(model, tmp_path / "pkg", name="tiny") as package:
        assert package.manifest.source["framework"] == "keras"
        assert package.manifest.validation["onnx-fp32"]["passed"]
        (output,) = package.manifest.signature.output_names
    found = unideploy.run(tmp_path / "pkg", {"features": rows})[output]
    np.testing.assert_allclose(found, model.predict(rows, verbose=0), atol=1e-5)


def test_an_object_that_is_no_model_is_refused_naming_what_is_taken(tmp_path):
    with pytest.raises(
        InputError, match=r"cannot export a builtins.dict object.*torch.nn.Module, a keras.Model or a mindspore.nn.Cell"
    ):
        unideploy.export({"weights": [1, 2]}, tmp_path / "pkg")
