"""Untrusted source models: a model that reaches outside itself when run (files, Python code) is
refused before anything runs, naming what it holds, unless the user passes --trust-source."""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np
import pytest
from console import assert_one_line_error, deploy

import unideploy

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
torch = pytest.importorskip("torch", reason="the torch extra is not installed")


class _MapsAFile(torch.nn.Module):
    """forward() maps a file into a tensor, creating it (shared=True) where it does not exist."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x):
        return x + torch.from_file(self.path, shared=True, size=4).reshape(1, 4)


def test_torchscript_that_touches_files_is_refused_before_it_runs(tmp_path):
    target = tmp_path / "created-by-the-model"
    torch.jit.save(torch.jit.script(_MapsAFile(str(target))), str(tmp_path / "model.pt"))
    result = deploy("export", tmp_path / "model.pt", "-o", tmp_path / "pkg", "--input-shape", "x:2x4")
    assert_one_line_error(result, 2, r"aten::from_file \(maps or reads a file\) in forward\(\).*--trust-source")
    assert not target.exists() and not (tmp_path / "pkg").exists()  # nothing ran, nothing written

    trusted = deploy(
        "export", tmp_path / "model.pt", "-o", tmp_path / "pkg", "--input-shape", "x:2x4", "--trust-source"
    )
    assert trusted.returncode == 0, trusted.stderr
    assert target.exists()  # the user vouched for it, and it did what it does


def test_a_trusted_model_runs_in_a_process_of_its_own_with_a_private_working_directory(tmp_path):
    """What a trusted model writes by relative path lands in a private folder that is removed, not
    in the user's working directory; the export still proves the package."""
    torch.jit.save(torch.jit.script(_MapsAFile("relative-file")), str(tmp_path / "model.pt"))
    result = deploy(
        "export",
        tmp_path / "model.pt",
        "-o",
        tmp_path / "pkg",
        "--input-shape",
        "x:2x4",
        "--trust-source",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "relative-file").exists()
    with unideploy.open_package(tmp_path / "pkg") as pkg:
        assert pkg.manifest.validation["onnx-fp32"]["passed"]


def test_errors_in_the_source_process_reach_the_user_as_they_would_in_process(tmp_path):
    torch.jit.save(torch.jit.script(_WithSamples()), str(tmp_path / "model.pt"))
    np.savez(tmp_path / "example.npz", x=np.ones((2, 5), np.float32))  # not the declared 2x4
    args = ("export", tmp_path / "model.pt", "-o", tmp_path / "pkg", "--input-shape", "x:2x4")
    args += ("--example-input", tmp_path / "example.npz")
    in_process, isolated = deploy(*args), deploy(*args, "--trust-source")
    assert_one_line_error(isolated, 2, r"'x'")
    assert (isolated.returncode, isolated.stderr) == (in_process.returncode, in_process.stderr)  # type and hint kept


def test_a_trusted_model_that_ends_its_process_leaves_no_package(tmp_path):
    keras = pytest.importorskip("keras", reason="the tensorflow extra is not installed")
    x = keras.Input((4,), name="x")
    # symbolic when the model is built and traced; a concrete tensor when the exporter runs it
    quits = lambda t: (__import__("os")._exit(7), t)[1] if type(t).__name__ == "EagerTensor" else t  # noqa: E731
    y = keras.layers.Lambda(quits, name="quits")(x)
    keras.Model(x, y).save(tmp_path / "quits.keras")
    result = deploy("export", tmp_path / "quits.keras", "-o", tmp_path / "pkg", "--trust-source")
    assert_one_line_error(result, 1, r"the process running 'quits.keras' ended \(exit 7\) before it finished")
    assert not (tmp_path / "pkg").exists() and not list(tmp_path.glob(".pkg.*"))


class _WithSamples(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


class _Marker:
    """A pickle that creates a folder when unpickled, as a hostile one would run a command."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.makedirs, (self.path,)


def test_pt2_whose_pickles_would_run_code_on_load_is_refused_before_loading(tmp_path):
    """torch.export.load unpickles a .pt2's sample inputs without restriction when torch's
    weights-only unpickler refuses them: a hostile archive runs code just by being loaded."""
    clean = tmp_path / "clean.pt2"
    torch.export.save(torch.export.export(_WithSamples().eval(), (torch.randn(2, 4),)), str(clean))
    marker = tmp_path / "ran"
    hostile = tmp_path / "hostile.pt2"
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(hostile, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if "/data/sample_inputs/" in item.filename:
                buffer = io.BytesIO()
                torch.save(_Marker(str(marker)), buffer)
                data = buffer.getvalue()
            dst.writestr(item, data)
    result = deploy("export", hostile, "-o", tmp_path / "pkg")
    assert_one_line_error(
        result,
        2,
        r"pickle '.*sample_inputs.*' \(imports .*makedirs\), which loading the program "
        r"would run",
    )
    assert not marker.exists() and not (tmp_path / "pkg").exists()
    with unideploy.export(clean, tmp_path / "clean-pkg") as pkg:  # its own sample inputs are plain tensors
        assert pkg.manifest.validation["onnx-fp32"]["passed"]


def test_savedmodel_that_writes_files_is_refused_before_it_runs(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="the tensorflow extra is not installed")
    target = tmp_path / "written-by-the-model"

    class Writer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            tf.io.write_file(str(target), tf.strings.as_string(tf.reduce_sum(x)))
            return {"y": x * 2.0}

    module = Writer()
    tf.saved_model.save(module, str(tmp_path / "saved"), signatures={"serving_default": module.serve})
    result = deploy("export", tmp_path / "saved", "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, r"WriteFile \(writes a file\) in function .*--trust-source")
    assert not target.exists() and not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("suffix", [".keras", ".h5"])  # the legacy HDF5 file stores the bytecode too
def test_keras_lambda_layer_is_refused_unless_trusted(suffix, tmp_path):
    keras = pytest.importorskip("keras", reason="the tensorflow extra is not installed")
    x = keras.Input((4,), name="x")
    y = keras.layers.Lambda(lambda t: t * 2.0, name="doubler")(keras.layers.Dense(3, name="dense")(x))
    source = tmp_path / f"lambda{suffix}"
    keras.Model(x, y).save(source)
    result = deploy("export", source, "-o", tmp_path / "pkg")
    assert_one_line_error(result, 2, r"Lambda \(runs Python bytecode stored in the file\) in layer 'doubler'")
    assert not (tmp_path / "pkg").exists()
    with unideploy.export(source, tmp_path / "pkg", trust_source=True) as pkg:
        assert pkg.manifest.validation["onnx-fp32"]["passed"]
        x_rows = np.ones((2, 4), np.float32)
        expected = keras.saving.load_model(source, safe_mode=False)(x_rows).numpy()
        np.testing.assert_allclose(unideploy.run(pkg, {"x": x_rows})["doubler"], expected, atol=1e-5)
