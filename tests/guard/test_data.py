"""Calibration data: the forms accepted, and a clear error for every bad one."""

from __future__ import annotations

import numpy as np
import pytest

import unideploy
from unideploy.errors import InputError
from unideploy.guard.data import load_dataset, split

pytest.importorskip("torch", reason="the torch extra is not installed")


def optimize(pkg, data, **kw):
    return unideploy.optimize(pkg, quantize="fp16", calibration=str(data), **kw)


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"image": np.zeros((4, 1, 8, 8), np.float32)}, "unknown input\\(s\\) 'image'"),
        ({"x": np.zeros((4, 1, 8, 8), np.float64)}, "dtype float64, expected float32"),
        ({"x": np.zeros((4, 3, 8, 8), np.float32)}, "size 3 on axis 1, expected 1"),
        ({"x": np.zeros((0, 1, 8, 8), np.float32)}, "is empty"),
        ({"x": np.zeros((4, 1, 8, 8), np.float32), "labels": np.zeros(3)}, "3 labels for 4 rows"),
        ({"x": np.zeros((1, 1, 8, 8), np.float32)}, "at least 2 are needed"),
    ],
)
def test_bad_calibration_data_is_named(digits_package, tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputError, match=message):
        optimize(digits_package, tmp_path / "bad.npz")


def test_missing_and_unreadable_files(digits_package, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        optimize(digits_package, tmp_path / "nope.npz")
    (tmp_path / "junk.npz").write_text("not numpy")
    with pytest.raises(InputError, match=r"not an \.npz archive"):
        optimize(digits_package, tmp_path / "junk.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no .npz or .npy files"):
        optimize(digits_package, tmp_path / "empty")
    (tmp_path / "huge").mkdir()  # a header declaring 256 GiB over 64 bytes: was an internal MemoryError
    with open(tmp_path / "huge" / "x.npy", "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (2**36,)})
        fh.write(bytes(64))
    with pytest.raises(InputError, match=r"'.*x\.npy' declares an array larger than this machine's memory"):
        optimize(digits_package, tmp_path / "huge")


def test_without_data_accuracy_cannot_be_judged(digits_package):
    with pytest.raises(InputError, match="without it the accuracy of an optimized model cannot be judged"):
        unideploy.optimize(digits_package, quantize="fp16")


def test_directory_of_npz_batches_and_npy_arrays(digits_package, digits, tmp_path):
    with np.load(digits["data"]) as d:
        x, labels = d["x"], d["labels"]
    (tmp_path / "npz").mkdir()
    for i in range(0, 200, 50):
        np.savez(tmp_path / "npz" / f"batch{i:03d}.npz", x=x[i : i + 50], labels=labels[i : i + 50])
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "x.npy", x[:200])
    for folder, metric in (("npz", "accuracy"), ("npy", "top1")):
        with optimize(digits_package, tmp_path / folder, output=tmp_path / f"{folder}.udp") as pkg:
            record = pkg.manifest.optimizations[-1]
            assert record["data"]["calibration_rows"] == 100 and record["accuracy"]["metric"] == metric


def test_separate_validation_data(digits_package, digits, tmp_path):
    with np.load(digits["data"]) as d:
        np.savez(tmp_path / "cal.npz", x=d["x"][:64])
        np.savez(tmp_path / "val.npz", x=d["x"][64:], labels=d["labels"][64:])
    with unideploy.optimize(
        digits_package, quantize="fp16", calibration=str(tmp_path / "cal.npz"), validation=str(tmp_path / "val.npz")
    ) as pkg:
        data = pkg.manifest.optimizations[-1]["data"]
        assert (data["calibration_rows"], data["validation_rows"], data["labels"]) == (64, 633, True)


def test_accuracy_metric_needs_labels(digits_package, tmp_path):
    np.savez(tmp_path / "nolabels.npz", x=np.random.default_rng(0).random((10, 1, 8, 8), np.float32))
    with pytest.raises(InputError, match="--metric accuracy needs labels"):
        optimize(digits_package, tmp_path / "nolabels.npz", metric="accuracy")


def test_the_batch_is_found_by_name_not_assumed_at_axis_0(tmp_path):
    from onnx_models import rows_of_state, stateful_model

    """Export from example rows, calibration splits, batches, directories of files and timing all
    cut or join each input along its own batch axis (axis 1 of the state): before, export was
    refused ("size 4 on axis 0, expected 2") and optimize saw "different row counts"."""
    np.savez(tmp_path / "example.npz", **rows_of_state(4, 1))
    with unideploy.export(
        stateful_model(tmp_path / "stateful.onnx"), tmp_path / "pkg", example_inputs=str(tmp_path / "example.npz")
    ) as package:
        assert package.manifest.signature.batch_axes == {"x": 0, "state": 1}
        assert package.manifest.validation["onnx-fp32"]["passed"]
        assert sorted(s.batch_size for s in package.manifest.samples) == [1, 4]
    np.savez(tmp_path / "calibration.npz", **rows_of_state(40, 2))
    with optimize(tmp_path / "pkg", tmp_path / "calibration.npz") as package:
        record = package.manifest.optimizations[-1]
        assert (record["data"]["calibration_rows"], record["data"]["validation_rows"]) == (20, 20)
        assert record["accuracy"]["outputs"]["y"]["within_budget"]
    (tmp_path / "parts").mkdir()  # a directory of files joins each input along its batch axis too
    for i, count in enumerate((24, 16)):
        np.savez(tmp_path / "parts" / f"part{i}.npz", **rows_of_state(count, 5 + i))
    with optimize(tmp_path / "pkg", tmp_path / "parts", output=tmp_path / "from-parts") as package:
        assert package.manifest.optimizations[-1]["data"]["calibration_rows"] == 20
    state = rows_of_state(6, 3)
    out = unideploy.run(tmp_path / "pkg", state, artifact="onnx-fp16")
    assert out["y"].shape == (6, 3) and out["stateN"].shape == (2, 6, 3)
    uneven = {**rows_of_state(8, 4), "state": np.zeros((2, 5, 3), np.float32)}
    np.savez(tmp_path / "uneven.npz", **uneven)
    with pytest.raises(InputError, match=r"different row counts along their batch axes: .*'state': '5 \(axis 1\)'"):
        optimize(tmp_path / "pkg", tmp_path / "uneven.npz", output=tmp_path / "other")


def _average_package(tmp_path):
    from onnx_models import running_average_model

    return unideploy.export(running_average_model(tmp_path / "average.onnx"), tmp_path / "pkg", state=["h=h_next:0.25"])


def test_a_streaming_model_s_rows_without_their_state_are_a_stream_each_file_its_own(tmp_path):
    """A streaming model's data that leaves its state out is read as streams, as ``deploy run``
    reads a file of rows: one per .npz file of a directory, in order; the calibration rows get the
    state the model carries to each (h = 0.5 h + x from 0.25 here, afresh in each stream), and the
    split keeps where each stream begins."""
    from unideploy.guard.data import carrying_state, validation_rows
    from unideploy.runtimes import RUNTIMES, RuntimeOptions

    with _average_package(tmp_path) as package:
        signature = package.manifest.signature
        run = RUNTIMES.get("onnxruntime")(
            package.path_of(package.manifest.base_onnx()), signature, RuntimeOptions(device="cpu")
        )
    rng = np.random.default_rng(0)
    streams = [rng.standard_normal((n, 4)).astype(np.float32) for n in (5, 3)]
    (tmp_path / "streams").mkdir()
    for i, x in enumerate(streams):
        np.savez(tmp_path / "streams" / f"take{i}.npz", x=x)
    data = load_dataset(tmp_path / "streams", signature)
    assert data.stream_starts == (0, 5) and data.rows == 8
    assert [s["x"].shape[0] for s in data.streams()] == [5, 3]
    with run:
        rows = carrying_state(data, run.run, signature)
    expected = []
    for x in streams:
        h = np.full(4, 0.25, np.float32)
        for row in x:
            expected.append(h)
            h = 0.5 * h + row
    assert rows.stream_starts is None and np.allclose(rows.inputs["h"], np.array(expected), atol=1e-6)
    calibration, validation = split(data)
    assert (calibration.stream_starts, validation.stream_starts) == ((0,), (0, 1))  # the second stream begins at row 5
    judged = validation_rows(validation, None, signature)
    assert judged["rows_are"] == "validation rows (2 streams)" and judged["stream"] is signature
    assert [b["x"].shape[0] for b in judged["batches"]] == [1, 3] and judged["rows"] == 4
    np.savez(tmp_path / "with-state.npz", x=streams[0], h=np.zeros((5, 4), np.float32))
    assert load_dataset(tmp_path / "with-state.npz", signature).stream_starts is None  # rows that carry their own


def test_a_stream_of_the_wrong_shape_is_named_as_its_first_call_would_be(tmp_path):
    with _average_package(tmp_path) as package:
        signature = package.manifest.signature
    np.savez(tmp_path / "bad.npz", x=np.zeros((6, 3), np.float32))
    with pytest.raises(InputError, match=r"--calibration data '.*bad\.npz': input 'x'.*size 3 on axis 1, expected 4"):
        load_dataset(tmp_path / "bad.npz", signature)
