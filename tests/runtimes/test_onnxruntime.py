"""The ONNX Runtime plug-in: input validation before the engine, provider choice, load failures."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from console import deploy

from unideploy.errors import InputError, MissingDependencyError, PackageError
from unideploy.package import Package
from unideploy.runtimes import RUNTIMES, RuntimeOptions
from unideploy.runtimes.base import usable_cores
from unideploy.runtimes.onnxruntime_runtime import OnnxRuntime
from unideploy.runtimes.ort_providers import onnx_providers
from unideploy.runtimes.selection import open_runtime


@pytest.fixture
def engine(cnn_package):
    with Package.open(cnn_package) as pkg:
        _, runtime = open_runtime(pkg)
        yield runtime
        runtime.close()


def test_runs_and_describes_itself(engine):
    out = engine.run({"x": np.zeros((2, 1, 8, 8), np.float32)})
    assert out["output"].shape == (2, 10)
    assert engine.describe()["providers"] == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    "spin, entries",
    [
        ("always", {}),
        ("run", {"session.force_spinning_stop": "1"}),  # spin within a run, sleep between runs
        ("never", {"session.intra_op.allow_spinning": "0"}),
    ],
)
def test_spin_policy_reaches_the_session(cnn_package, spin, entries):
    with Package.open(cnn_package) as pkg:
        _, runtime = open_runtime(pkg, options=RuntimeOptions(spin=spin, threads=1))
        options = runtime.session.get_session_options()
        assert options.intra_op_num_threads == 1
        for key in ("session.force_spinning_stop", "session.intra_op.allow_spinning"):
            if key in entries:
                assert options.get_session_config_entry(key) == entries[key]
            else:  # left at ONNX Runtime's default (spinning allowed, not stopped after a run)
                with pytest.raises(RuntimeError, match="does not have configuration"):
                    options.get_session_config_entry(key)
        assert runtime.run({"x": np.zeros((1, 1, 8, 8), np.float32)})["output"].shape == (1, 10)
        runtime.close()


def test_worker_threads_are_not_pinned_to_cores(cnn_package):
    """Left to choose its thread count, ONNX Runtime pins each worker to one core, and a caller
    that is not the main thread (the server's) then shares that core with it."""
    allowed = os.sched_getaffinity(0)
    before = {task.name for task in Path("/proc/self/task").iterdir()}
    with Package.open(cnn_package) as pkg:
        _, runtime = open_runtime(pkg)
        assert runtime.session.get_session_options().intra_op_num_threads == usable_cores() <= len(allowed)
        runtime.run({"x": np.zeros((1, 1, 8, 8), np.float32)})
        started = [int(task.name) for task in Path("/proc/self/task").iterdir() if task.name not in before]
        assert all(os.sched_getaffinity(tid) == allowed for tid in started)
        runtime.close()


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"y": np.zeros((1, 1, 8, 8), np.float32)}, "unknown input\\(s\\) 'y'.*expects: x"),
        ({}, "missing input\\(s\\) 'x'"),
        ({"x": np.zeros((1, 1, 8, 8), np.float64)}, "dtype float64, expected float32"),
        ({"x": np.zeros((1, 8, 8), np.float32)}, "rank 3 .*expected rank 4"),
        ({"x": np.zeros((1, 3, 8, 8), np.float32)}, "size 3 on axis 1, expected 1"),
        ({"x": np.zeros((0, 1, 8, 8), np.float32)}, "is empty"),
        ({"x": [[[["a"]]]]}, "dtype string, expected float32"),
    ],
)
def test_bad_inputs_are_refused_before_the_engine(engine, inputs, message):
    with pytest.raises(InputError, match=message):
        engine.run(inputs)


def test_shared_dynamic_dim_must_agree(torch_models, tmp_path):
    import unideploy

    path, shapes = torch_models["tokens_traced"]
    with (
        unideploy.export(path, tmp_path / "pkg", input_shapes=shapes) as pkg,
        pytest.raises(InputError, match="dimension 'seq' is 4 in input 'mask' but 6 in input 'input_ids'"),
    ):
        unideploy.run(pkg, {"input_ids": np.ones((1, 6), np.int64), "mask": np.ones((1, 4), np.float32)})


def test_a_token_id_past_the_vocabulary_is_refused_naming_the_input_before_any_engine(torch_models, tmp_path):
    """Ids of the right dtype and shape can still be wrong in value. The export reads which inputs a
    Gather looks up straight in a table of the model's (the token classifier's ids, 50 rows; not its
    float mask) and records the rows in the signature, which refuses ids past them naming the input
    (``RefusedValues``: an input error, 400 served, exit 2 from the CLI), on every engine: ONNX
    Runtime's CUDA kernel answers zeros for them without a word. ONNX's negative ids count from the end."""
    import unideploy
    from unideploy.errors import RefusedValues, RuntimeFailure
    from unideploy.server.errors import grpc_code, http_status

    path, shapes = torch_models["tokens_traced"]
    ids = np.ones((2, 6), np.int64)
    mask = np.ones((2, 6), np.float32)
    with unideploy.export(path, tmp_path / "pkg", input_shapes=shapes) as pkg:
        assert [t.table_rows for t in pkg.manifest.signature.inputs] == [50, None]
        ids[1, 2] = -50
        assert unideploy.run(pkg, {"input_ids": ids, "mask": mask})["output_0"].shape == (2, 3)
        ids[1, 2] = 50
        with pytest.raises(RefusedValues) as refused:
            unideploy.run(pkg, {"input_ids": ids, "mask": mask})
    error = refused.value
    assert isinstance(error, InputError) and isinstance(error, RuntimeFailure)
    assert (http_status(error), grpc_code(error), error.exit_code) == (400, "INVALID_ARGUMENT", 2)
    assert error.message == (
        "input 'input_ids' holds 50, past the 50 rows of the table the model looks it up in "
        "(it takes 0 to 49; ONNX counts -50 to -1 from the end)"
    )
    shown = deploy("inspect", tmp_path / "pkg")
    assert shown.returncode == 0 and "values: input_ids from 0 to 49" in shown.stdout, shown.stdout


def test_values_onnx_runtime_refuses_are_the_inputs_fault_in_its_words(tmp_path, capfd):
    """Where the export cannot see the table (the ids pass an Identity first), ONNX Runtime's Gather
    refuses an id past it with INVALID_ARGUMENT: that is the request's to fix too (``RefusedValues``),
    worded with ONNX Runtime's own message, which it no longer also prints as a log line of its own."""
    from onnx_models import embedding_package

    import unideploy
    from unideploy.errors import RefusedValues

    with unideploy.open_package(embedding_package(tmp_path / "src", tmp_path / "pkg", through="Identity")) as pkg:
        assert pkg.manifest.signature.inputs[0].table_rows is None
        capfd.readouterr()
        with pytest.raises(RefusedValues) as refused:
            unideploy.run(pkg, {"ids": np.array([[1, 2, 10, 3]], np.int64)})
    assert refused.value.message.startswith("the model refused the input values: ")
    assert "Gather" in refused.value.message and "idx=10 must be within the inclusive range [-10,9]" in str(
        refused.value
    )
    assert "onnxruntime" not in capfd.readouterr().err  # its "[E:onnxruntime:...] ExecuteKernel" line


def test_provider_choice():
    every = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert onnx_providers("cpu", every, "fp32", False) == ["CPUExecutionProvider"]
    # plain ONNX never asks for TensorRT (a package reaches it through its recipe), and fp32 stays fp32
    assert onnx_providers("auto", every, "fp32", False) == [
        ("CUDAExecutionProvider", {"use_tf32": "0"}),
        "CPUExecutionProvider",
    ]
    assert onnx_providers("gpu", every, "fp32", True)[0] == ("CUDAExecutionProvider", {"use_tf32": "1"})
    assert onnx_providers("gpu", every, "fp16", True)[0] == ("CUDAExecutionProvider", {"use_tf32": "0"})
    assert onnx_providers("auto", ["CPUExecutionProvider"], "fp32", False) == ["CPUExecutionProvider"]
    with pytest.raises(MissingDependencyError, match="onnxruntime-gpu"):
        onnx_providers("gpu", ["CPUExecutionProvider"], "fp32", False)


def test_corrupt_model_bytes_fail_to_load_cleanly(tmp_path):
    from unideploy.signature import Signature, TensorSpec

    bad = tmp_path / "m.onnx"
    bad.write_bytes(b"\x00\x01 not onnx")
    sig = Signature((TensorSpec("x", "float32", (1,)),), (TensorSpec("y", "float32", (1,)),))
    with pytest.raises(PackageError, match="ONNX Runtime cannot load 'm.onnx'"):
        OnnxRuntime(bad, sig, RuntimeOptions())


def test_unknown_runtime_name_lists_the_known_ones(cnn_package):
    with Package.open(cnn_package) as pkg, pytest.raises(InputError, match="unknown runtime 'tvm'.*onnxruntime"):
        open_runtime(pkg, runtime="tvm")


def test_registry_lists_the_builtin():
    assert "onnxruntime" in RUNTIMES.names()
    assert RUNTIMES.get("onnxruntime") is OnnxRuntime


def test_selection_honours_the_target(cnn_package):
    with Package.open(cnn_package) as pkg:
        artifact, runtime = open_runtime(pkg, target="cpu")
        runtime.close()
        assert artifact.id == "onnx-fp32"
        with pytest.raises(MissingDependencyError, match="onnxruntime does not serve the ascend target"):
            open_runtime(pkg, target="ascend")


def _rss_mb() -> float:
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024


def test_shared_arena_reaches_the_session_and_answers_the_same(cnn_package):
    """The server's engines share one process-wide arena with no per-shape memory plan."""
    x = {"x": np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)}
    with Package.open(cnn_package) as pkg:
        _, own = open_runtime(pkg)
        _, shared = open_runtime(pkg, options=RuntimeOptions(shared_arena=True))
        options = shared.session.get_session_options()
        assert options.get_session_config_entry("session.use_env_allocators") == "1"
        assert not options.enable_mem_pattern
        np.testing.assert_array_equal(shared.run(x)["output"], own.run(x)["output"])
        own.close()
        shared.close()


@pytest.mark.parametrize("shared_arena", [False, True], ids=["own-arena", "shared-arena"])
def test_shrinking_gives_back_what_a_large_batch_grew(cnn_package, shared_arena):
    """ONNX Runtime keeps the arena a large call grew; a small run with shrinkage frees it (the
    server does this once traffic stops), and the engine still answers the same."""
    from unideploy.server.memory import release_free_memory

    pkg = Package.open(cnn_package)
    _, engine = open_runtime(pkg, options=RuntimeOptions(shared_arena=shared_arena))

    small = {"x": np.ones((1, 1, 8, 8), np.float32)}
    expected = engine.run(small)["output"]
    engine.run({"x": np.zeros((40_000, 1, 8, 8), np.float32)})
    grown = _rss_mb()
    engine.shrink(small)
    release_free_memory()
    assert grown - _rss_mb() > 30, f"{grown:.0f} MB after the large batch, {_rss_mb():.0f} MB after shrinking"
    np.testing.assert_array_equal(engine.run(small)["output"], expected)
    engine.close()
    pkg.close()


def test_cuda_graphs_asked_for_on_the_cpu_say_they_did_not_run(cnn_package):
    """What is reported is what ran: ``cuda_graphs`` needs the CUDA provider's batch buckets."""
    with Package.open(cnn_package) as pkg:
        _, runtime = open_runtime(pkg, options=RuntimeOptions(cuda_graphs=True))
        with runtime:
            assert runtime.run({"x": np.zeros((3, 1, 8, 8), np.float32)})["output"].shape == (3, 10)
            assert runtime.describe()["cuda_graphs"].startswith("not used: they run on ONNX Runtime's CUDA provider")
        # the server's default (None: wherever buckets run) says nothing where none do
        _, runtime = open_runtime(pkg, options=RuntimeOptions(cuda_graphs=None))
        with runtime:
            assert "cuda_graphs" not in runtime.describe() and "batch_buckets" not in runtime.describe()


def test_a_bucket_whose_graph_cannot_be_captured_runs_a_plain_session_of_its_size(digits):
    """The fallback a GPU takes where a bucket's CUDA graph cannot be captured, taken here where no
    GPU buffer can even be allocated: the reason is kept, and the bucket's session is a plain one
    told its batch size (tests/gpu/test_cuda_graphs.py runs the captured path on a GPU)."""
    images = np.load(digits["data"])["x"]
    with Package.open(digits["package"]) as pkg:
        _, runtime = open_runtime(pkg, "onnx-fp32", options=RuntimeOptions(cuda_graphs=True))
        with runtime:
            bucket = runtime._fixed_session(4)
            assert runtime.graphs_problem  # ONNX Runtime's own words for why
            assert bucket.get_inputs()[0].shape[0] == 4  # fixed, as a bucket's session is
            np.testing.assert_allclose(
                bucket.run(None, {"x": images[:4]})[0], runtime.run({"x": images[:4]})["output"], rtol=1e-5, atol=1e-5
            )
