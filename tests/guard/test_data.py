"""Calibration data: the forms accepted, and a clear error for every bad one."""

from __future__ import annotations

import numpy as np
import pytest

import unideploy
from unideploy.errors import InputError

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
