"""The remote repository's mirror, on fsspec's in-memory filesystem: what it copies, what it leaves,
and that it downloads only what changed."""

from __future__ import annotations

import pytest

from unideploy.errors import InputError
from unideploy.server.remote import RemoteRepository

fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")


@pytest.fixture
def remote(tmp_path):
    fs = fsspec.filesystem("memory")
    root = f"/repo-{tmp_path.name}"
    for path, data in {
        "digits/1/manifest.json": b"{}",
        "digits/1/artifacts/model.onnx": b"onnx",
        "digits/2.zip": b"PK",
        "digits/model.yaml": b"max_batch_size: 4\n",
        "digits/README.md": b"not served",
        "digits/.2.partial/manifest.json": b"hidden",
        "digits/staging/manifest.json": b"not a version",
        "notes.txt": b"beside the models",
    }.items():
        fs.pipe(f"{root}/{path}", data)
    yield fs, root, RemoteRepository(f"memory://{root}", tmp_path / "mirror")
    fs.rm(root, recursive=True)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_only_what_the_server_reads_is_mirrored(remote):
    _, _, repository = remote
    assert repository.sync() == ["digits/1", "digits/2.zip", "digits/model.yaml"]
    assert _files(repository.mirror) == [
        "digits/1/artifacts/model.onnx",
        "digits/1/manifest.json",
        "digits/2.zip",
        "digits/model.yaml",
    ]


def test_one_model_folder_is_mirrored_under_its_name(remote, tmp_path):
    """``deploy serve s3://bucket/models/digits --model-name digits``: the URL is the model's folder."""
    _, root, _ = remote
    repository = RemoteRepository(f"memory://{root}/digits", tmp_path / "one", model_name="digits")
    assert repository.sync() == ["digits/1", "digits/2.zip", "digits/model.yaml"]
    assert _files(repository.mirror) == [
        "digits/1/artifacts/model.onnx",
        "digits/1/manifest.json",
        "digits/2.zip",
        "digits/model.yaml",
    ]


def test_only_what_changed_is_downloaded_again_and_deletions_follow(remote, monkeypatch):
    fs, root, repository = remote
    repository.sync()
    fetched = []
    original = repository.fs.get_file
    monkeypatch.setattr(
        repository.fs, "get_file", lambda src, dst, **kw: (fetched.append(src), original(src, dst, **kw))
    )
    assert repository.sync() == [] and fetched == []
    fs.pipe(f"{root}/digits/1/artifacts/model.onnx", b"new weights")
    fs.rm(f"{root}/digits/2.zip")
    assert repository.sync() == ["digits/1", "digits/2.zip"]
    assert sorted(fetched) == [f"{root}/digits/1/artifacts/model.onnx", f"{root}/digits/1/manifest.json"]
    assert (repository.mirror / "digits/1/artifacts/model.onnx").read_bytes() == b"new weights"
    assert _files(repository.mirror) == ["digits/1/artifacts/model.onnx", "digits/1/manifest.json", "digits/model.yaml"]
    assert [p.name for p in (repository.mirror / "digits").iterdir() if p.name.startswith(".")] == []  # no staging left


def test_a_missing_prefix_and_an_unknown_protocol_are_named(tmp_path):
    with pytest.raises(InputError, match="memory://nowhere-at-all.*does not exist"):
        RemoteRepository("memory://nowhere-at-all", tmp_path / "m").sync()
    with pytest.raises(InputError, match="cannot open the model repository 'nosuch://bucket'"):
        RemoteRepository("nosuch://bucket", tmp_path / "m")
