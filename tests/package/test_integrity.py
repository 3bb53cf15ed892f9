"""Opening a package verifies it: tampered, truncated, incomplete or escaping packages are refused."""

from __future__ import annotations

import json
import os
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from unideploy.errors import InputError, PackageError
from unideploy.package import Package
from unideploy.package.package import read_manifest


def _manifest(pkg: Path) -> dict:
    return json.loads((pkg / "manifest.json").read_text())


def _write_manifest(pkg: Path, data: dict) -> None:
    (pkg / "manifest.json").write_text(json.dumps(data))


def _zip_dir(src: Path, dest: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(dest, "w") as zf:
        for file in sorted(src.rglob("*")):
            if file.is_file():
                zf.write(file, prefix + file.relative_to(src).as_posix())
    return dest


def test_a_fresh_package_opens_and_lists_its_parts(cnn_package):
    with Package.open(cnn_package) as pkg:
        assert pkg.manifest.artifacts[0].format == "onnx"
        assert [s.batch_size for s in pkg.reference_samples()] == [1, 4]
        assert pkg.manifest.source["path"] == "source/cnn_scripted.pt"


def test_modified_artifact_is_refused_naming_the_file(cnn_package):
    model = cnn_package / "artifacts" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="checksum mismatch for package file 'artifacts/model.onnx'"):
        Package.open(cnn_package)


def test_truncated_sample_file_is_refused(cnn_package):
    sample = cnn_package / "samples" / "batch4.npz"
    sample.write_bytes(sample.read_bytes()[:100])
    with pytest.raises(PackageError, match="'samples/batch4.npz' has 100 bytes.*truncated"):
        Package.open(cnn_package)


def test_missing_artifact_is_refused(cnn_package):
    (cnn_package / "artifacts" / "model.onnx").unlink()
    with pytest.raises(PackageError, match="'artifacts/model.onnx' is missing"):
        Package.open(cnn_package)


def test_unlisted_file_is_refused(cnn_package):
    (cnn_package / "artifacts" / "extra.bin").write_bytes(b"payload")
    with pytest.raises(PackageError, match="'artifacts/extra.bin', which the manifest does not list"):
        Package.open(cnn_package)


def test_manifest_edits_are_caught_by_the_schema(cnn_package):
    data = _manifest(cnn_package)
    del data["signature"]
    _write_manifest(cnn_package, data)
    with pytest.raises(PackageError, match="does not match the package schema.*'signature' is a required property"):
        Package.open(cnn_package)


def test_newer_format_version_is_explained(cnn_package):
    data = _manifest(cnn_package)
    data["format_version"] = 2
    _write_manifest(cnn_package, data)
    with pytest.raises(PackageError, match="format version 2 is not supported"):
        Package.open(cnn_package)


def test_manifest_that_is_not_json(cnn_package):
    (cnn_package / "manifest.json").write_text("{ not json")
    with pytest.raises(PackageError, match="manifest.json is not valid JSON"):
        Package.open(cnn_package)


@pytest.mark.parametrize("evil", ["../outside.onnx", "/etc/passwd", "artifacts/../../outside.onnx"])
def test_paths_escaping_the_package_are_refused(cnn_package, evil):
    data = _manifest(cnn_package)
    data["artifacts"][0]["path"] = evil
    _write_manifest(cnn_package, data)
    with pytest.raises(PackageError):
        Package.open(cnn_package)


def test_symlink_out_of_the_package_is_refused(cnn_package, tmp_path):
    outside = tmp_path / "outside.onnx"
    model = cnn_package / "artifacts" / "model.onnx"
    shutil.move(model, outside)
    os.symlink(outside, model)
    with pytest.raises(PackageError, match="escapes the package"):
        Package.open(cnn_package)


def test_not_a_package(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        Package.open(tmp_path / "nope")
    with pytest.raises(PackageError, match="has no manifest.json"):
        Package.open(tmp_path)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(PackageError, match="neither a package directory nor a zip"):
        Package.open(junk)


def test_zipped_package_opens_with_or_without_a_top_folder(cnn_package, tmp_path):
    for prefix in ("", "cnn.udp/"):
        archive = _zip_dir(cnn_package, tmp_path / f"p{len(prefix)}.zip", prefix)
        with Package.open(archive) as pkg:
            assert pkg.manifest.name == "cnn_scripted"
            extracted = pkg.root
        assert not extracted.exists()  # the temporary extraction is removed on close


def test_the_manifest_alone_reads_from_a_directory_or_a_zip_without_checking_the_files(cnn_package, tmp_path):
    # what `deploy serve --ray` reads to learn whether a model keeps state before its replicas open it
    # (and check) the package: opening is the check, reading the manifest is not
    (cnn_package / "samples" / "batch1.npz").write_bytes(b"x" * 10)
    for prefix in ("", "cnn.udp/"):
        archive = _zip_dir(cnn_package, tmp_path / f"m{len(prefix)}.zip", prefix)
        assert read_manifest(archive).to_dict() == read_manifest(cnn_package).to_dict()
    assert read_manifest(cnn_package).name == "cnn_scripted"
    with pytest.raises(PackageError, match="has no manifest.json"):
        read_manifest(tmp_path)
    with pytest.raises(PackageError, match="neither a package directory nor a zip"):
        read_manifest(tmp_path / "nope")
    bare = _zip_dir(cnn_package / "artifacts", tmp_path / "bare.zip")
    with pytest.raises(PackageError, match="has no manifest.json"):
        read_manifest(bare)
    (cnn_package / "manifest.json").write_bytes(b"\xff\xfe")
    with pytest.raises(PackageError, match="not UTF-8"):
        read_manifest(cnn_package)


def test_zip_slip_member_is_refused(cnn_package, tmp_path):
    archive = _zip_dir(cnn_package, tmp_path / "evil.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr("../../evil.txt", "owned")
    with pytest.raises(PackageError, match=r"'\.\./\.\./evil\.txt' would be written outside the package"):
        Package.open(archive)
    assert not (tmp_path.parent / "evil.txt").exists()


def test_zip_symlink_member_is_refused(cnn_package, tmp_path):
    archive = _zip_dir(cnn_package, tmp_path / "link.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        info = zipfile.ZipInfo("artifacts/link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(PackageError, match="is a symbolic link"):
        Package.open(archive)


def test_truncated_zip_is_refused(cnn_package, tmp_path):
    archive = _zip_dir(cnn_package, tmp_path / "cut.zip")
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(PackageError):
        Package.open(archive)


def test_tampered_zip_member_is_refused(cnn_package, tmp_path):
    (cnn_package / "samples" / "batch1.npz").write_bytes(b"x" * 10)
    archive = _zip_dir(cnn_package, tmp_path / "t.zip")
    with pytest.raises(PackageError, match="samples/batch1.npz"):
        Package.open(archive)


def test_artifact_companion_files_are_checksummed_too(cnn_package):
    from unideploy.package.files import digest_path

    extra = cnn_package / "artifacts" / "required_operators.config"
    extra.write_text("ai.onnx;17;Conv,Relu\n")
    data = _manifest(cnn_package)
    sha256, size = digest_path(extra)
    data["artifacts"][0]["files"] = [{"path": "artifacts/required_operators.config", "sha256": sha256, "size": size}]
    _write_manifest(cnn_package, data)
    Package.open(cnn_package).close()
    extra.write_text("ai.onnx;17;Conv,Relu,Evil\n")
    with pytest.raises(PackageError, match="'artifacts/required_operators.config'"):
        Package.open(cnn_package)


def test_symlink_inside_a_directory_artifact_is_refused(cnn_package, tmp_path):
    """A link inside a listed directory used to pass integrity and be read, served and copied."""
    saved = cnn_package / "artifacts" / "saved"
    saved.mkdir()
    os.symlink(cnn_package / "artifacts" / "model.onnx", saved / "model.onnx")
    with pytest.raises(PackageError, match="'artifacts/saved/model.onnx' is a symbolic link"):
        Package.open(cnn_package)


def test_zip_with_two_members_of_one_name_is_refused(cnn_package, tmp_path):
    archive = _zip_dir(cnn_package, tmp_path / "twice.zip")
    with zipfile.ZipFile(archive, "a") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        zf.writestr("manifest.json", "{}")
    with pytest.raises(PackageError, match="two members named 'manifest.json'"):
        Package.open(archive)


def test_manifest_nested_beyond_reason_is_refused(cnn_package):
    (cnn_package / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PackageError, match="manifest.json is not valid JSON"):
        Package.open(cnn_package)


def test_zip_bomb_is_refused_before_anything_is_written(cnn_package, tmp_path):
    archive = _zip_dir(cnn_package, tmp_path / "bomb.zip")
    with (
        zipfile.ZipFile(archive, "a", compression=zipfile.ZIP_DEFLATED) as zf,
        zf.open("artifacts/zeros.bin", "w", force_zip64=True) as member,
    ):
        chunk = b"\0" * (64 * 1024 * 1024)
        for _ in range(17):  # 1.06 GiB of zeros, about 1 MiB compressed
            member.write(chunk)
    with pytest.raises(PackageError, match=r"x its size \(a zip bomb\?\)"):
        Package.open(archive)


def test_zip_with_too_many_members_is_refused(cnn_package, tmp_path):
    archive = _zip_dir(cnn_package, tmp_path / "many.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        for i in range(10_001):
            zf.writestr(f"samples/x{i}", b"")
    with pytest.raises(PackageError, match="members; a package has far fewer"):
        Package.open(archive)
