"""Packages are written atomically: all or nothing, directory or zip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from unideploy.errors import InputError
from unideploy.package import Artifact, Manifest, Package, PackageWriter, PlannedArtifact
from unideploy.signature import Signature, TensorSpec


def _manifest(artifact: Artifact, samples) -> Manifest:
    sig = Signature((TensorSpec("x", "float32", ("batch", 2)),), (TensorSpec("y", "float32", ("batch", 2)),))
    source = {
        "framework": "onnx",
        "file_name": "m.onnx",
        "sha256": artifact.sha256,
        "exporter": "onnx",
        "library_versions": {},
    }
    return Manifest(name="m", version="1", source=source, signature=sig, artifacts=[artifact], samples=samples)


def _write(dest, tmp_path, fail: bool = False, overwrite: bool = False):
    blob = tmp_path / "blob.onnx"
    blob.write_bytes(b"fake model bytes")
    with PackageWriter(dest, overwrite) as writer:
        artifact = writer.add_artifact(blob, PlannedArtifact("a", "artifacts/m.onnx", "onnx", "fp32", ["onnxruntime"]))
        x = np.ones((1, 2), np.float32)
        samples = [writer.add_samples("samples/batch1.npz", 1, {"x": x}, {"y": x})]
        if fail:
            raise RuntimeError("simulated crash mid-export")
        return writer.commit(_manifest(artifact, samples))


@pytest.mark.parametrize("name", ["pkg", "pkg.zip"])
def test_written_package_reopens_with_checksums(tmp_path, name):
    dest = _write(tmp_path / name, tmp_path)
    with Package.open(dest) as pkg:
        assert pkg.manifest.artifacts[0].size == len(b"fake model bytes")
        np.testing.assert_array_equal(pkg.reference_samples()[0].outputs["y"], np.ones((1, 2)))


@pytest.mark.parametrize("name", ["pkg", "pkg.zip"])
def test_a_crash_leaves_nothing_behind(tmp_path, name):
    with pytest.raises(RuntimeError):
        _write(tmp_path / "out" / name, tmp_path, fail=True)
    assert list((tmp_path / "out").iterdir()) == []


def test_existing_destination_needs_overwrite(tmp_path):
    dest = _write(tmp_path / "pkg", tmp_path)
    with pytest.raises(InputError, match="already exists"):
        PackageWriter(dest)
    before = json.loads((dest / "manifest.json").read_text())
    writer = PackageWriter(dest, overwrite=True)
    writer.abort()
    assert json.loads((dest / "manifest.json").read_text()) == before


def test_manifest_that_breaks_the_schema_is_never_written(tmp_path):
    from unideploy.errors import PackageError

    blob = tmp_path / "blob.onnx"
    blob.write_bytes(b"x")
    with pytest.raises(PackageError, match="schema"), PackageWriter(tmp_path / "pkg") as writer:
        artifact = writer.add_artifact(blob, PlannedArtifact("bad id!", "artifacts/m.onnx", "onnx", "fp32", []))
        writer.commit(_manifest(artifact, []))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.onnx"]


@pytest.mark.parametrize("name", ["pkg", "pkg.zip"])
def test_what_a_killed_writer_left_is_removed_by_the_next_one(tmp_path, name):
    """kill -9 skips every cleanup: a staging folder whose process is gone goes when the next write
    to that destination starts; one of a process still running stays."""
    import os
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    out = tmp_path / "out"
    out.mkdir()
    stale, live = out / f".{name}.{dead_pid}-abc.partial", out / f".{name}.{os.getpid()}-def.partial"
    for leftover in (stale, live):
        leftover.mkdir()
        (leftover / "manifest.json").write_text("{}")
    _write(out / name, tmp_path)
    assert sorted(p.name for p in out.iterdir()) == sorted([name, live.name])


def test_replacing_a_directory_package_never_leaves_its_path_missing(tmp_path, monkeypatch):
    """A server polling the repository reads the path while `deploy optimize --force` rewrites it:
    each rewrite swaps old and new in one step (Linux's renameat2), the old one then removed; where
    the swap is not available, two renames, the old one named so a later writer cleans it up."""
    import threading

    from unideploy.package import files

    dest = _write(tmp_path / "pkg", tmp_path)
    missing, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not (dest / "manifest.json").exists():
                missing.append(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(30):
            _write(dest, tmp_path, overwrite=True)
    finally:
        stop.set()
        watcher.join()
    assert missing == [] and sorted(p.name for p in tmp_path.iterdir()) == ["blob.onnx", "pkg"]
    assert files.exchange_paths(tmp_path / "blob.onnx", dest) and (dest / "manifest.json").is_file() is False
    files.exchange_paths(tmp_path / "blob.onnx", dest)  # this filesystem swaps: and back

    monkeypatch.setattr(files, "exchange_paths", lambda a, b: False)  # a kernel or filesystem without the swap
    _write(dest, tmp_path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.onnx", "pkg"]
