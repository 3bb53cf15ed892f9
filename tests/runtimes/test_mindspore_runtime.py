"""The MindSpore runtime plug-in: MindIR through MindSpore's GraphCell here, MindSpore Lite where
it is installed (Ascend and edge images; its only PyPI wheel is for Python 3.7)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from unideploy.errors import PackageError, RuntimeFailure
from unideploy.runtimes import RUNTIMES
from unideploy.signature import Signature, TensorSpec

pytestmark = pytest.mark.mindspore
HAS_LITE = importlib.util.find_spec("mindspore_lite") is not None
SIGNATURE = Signature((TensorSpec("x", "float32", ("batch", 6)),), (TensorSpec("output", "float32", ("batch", 6)),))


@pytest.fixture(scope="module")
def unsupported_mindir(tmp_path_factory) -> Path:
    pytest.importorskip("mindspore", reason="the mindspore extra is not installed in this venv")
    from mindspore_models import save_mindir_models

    return save_mindir_models(tmp_path_factory.mktemp("mindir"))["unsupported"]


def test_runs_mindir_at_any_batch_size_on_graph_cell(unsupported_mindir):
    import mindspore as ms

    cell = ms.nn.GraphCell(ms.load(str(unsupported_mindir)))
    with RUNTIMES.get("mindspore")(unsupported_mindir, SIGNATURE) as runtime:
        assert runtime.describe()["engine"] == ("mindspore-lite" if HAS_LITE else "mindspore")
        for batch in (1, 5):
            x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
            np.testing.assert_allclose(runtime.run({"x": x})["output"], cell(ms.Tensor(x)).asnumpy(), atol=1e-6)


def test_outputs_of_another_shape_than_the_signature_says_are_a_runtime_failure(unsupported_mindir):
    """Every output's shape is checked against the signature and the inputs, so an engine that
    answers with the shape of an earlier call fails loudly instead of serving it."""
    lying = Signature(SIGNATURE.inputs, (TensorSpec("output", "float32", ("batch", 7)),))
    stale = r"wrong shape.*'output' has shape \(2, 6\), expected \(2, 7\)"
    with RUNTIMES.get("mindspore")(unsupported_mindir, lying) as runtime, pytest.raises(RuntimeFailure, match=stale):
        runtime.run({"x": np.zeros((2, 6), np.float32)})


def test_corrupt_mindir_is_a_package_error(tmp_path):
    pytest.importorskip("mindspore", reason="the mindspore extra is not installed in this venv")
    bad = tmp_path / "model.mindir"
    bad.write_bytes(b"not a mindir file" * 10)
    with pytest.raises(PackageError, match="cannot load 'model.mindir'"):
        RUNTIMES.get("mindspore")(bad, SIGNATURE)


@pytest.mark.skipif(HAS_LITE, reason="mindspore_lite is installed here; this checks the message for when it is not")
def test_ms_files_need_mindspore_lite_and_say_so(tmp_path):
    model = tmp_path / "model.ms"
    model.write_bytes(b"\0" * 16)
    with pytest.raises(PackageError, match="mindspore_lite is not installed"):
        RUNTIMES.get("mindspore")(model, SIGNATURE)


@pytest.mark.skipif(
    not HAS_LITE,
    reason="mindspore_lite cannot be installed here (PyPI has only a Python 3.7 "
    "wheel); the Lite path runs on Ascend/edge images",
)
def test_mindspore_lite_runs_mindir(unsupported_mindir):
    with RUNTIMES.get("mindspore")(unsupported_mindir, SIGNATURE) as runtime:
        assert runtime.describe()["engine"] == "mindspore-lite"
        assert runtime.run({"x": np.ones((2, 6), np.float32)})["output"].shape == (2, 6)
