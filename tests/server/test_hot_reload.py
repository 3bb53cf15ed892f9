"""Hot reload under a bounded load: add a version, replace it, drop in a corrupt one. Not one
request may fail, and the right version must be serving after each step."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from serving import Load

import unideploy


def zipped(package: Path, dest: Path) -> Path:
    """The package as a .zip written beside ``dest`` and renamed onto it (atomic, as deployers do)."""
    tmp = dest.with_name(f".{dest.name}.partial")
    with unideploy.open_package(package) as pkg:
        shutil.make_archive(str(tmp), "zip", pkg.root)
    os.replace(f"{tmp}.zip", dest)
    return dest


@pytest.fixture
def reload_server(digits, tmp_path):
    from serving import start_server, stop_server

    repo = tmp_path / "repo"
    (repo / "digits").mkdir(parents=True)
    zipped(digits["package"], repo / "digits" / "1.zip")
    running = start_server(repo, tmp_path)
    yield running
    stop_server(running)


def test_versions_come_and_go_without_a_failed_request(reload_server, digits, torch_models, tmp_path):
    with np.load(digits["data"]) as d:
        x = np.ascontiguousarray(d["x"][:2])
    other_src, shapes = torch_models["cnn_scripted"]  # same signature, different weights
    other = unideploy.export(other_src, tmp_path / "other.udp", input_shapes=shapes)
    other.close()
    expected_digits = unideploy.run(digits["package"], {"x": x})["output"].astype(np.float32).tobytes()
    expected_other = unideploy.run(tmp_path / "other.udp", {"x": x})["output"].astype(np.float32).tobytes()
    model_dir = reload_server.repo / "digits"
    load = Load(reload_server, x)
    load.start()
    try:
        load.more()
        # 1. a new version appears: it takes over (policy: latest 1)
        zipped(digits["package"], model_dir / "2.zip")
        reload_server.wait_for(lambda: load.latest()[1] == "2", what="version 2 to serve")
        # 2. version 2 is replaced in place by other weights
        zipped(tmp_path / "other.udp", model_dir / "2.zip")
        reload_server.wait_for(lambda: load.latest()[2] == expected_other, what="the replaced version 2")
        # 3. a corrupt version 3 appears: it is refused, version 2 keeps serving
        (model_dir / "3.zip").write_bytes(b"PK\x03\x04 this is not a package")
        reload_server.wait_for(
            lambda: "version 3 failed to load (version(s) 2 keep serving)" in reload_server.log.read_text(),
            what="the refusal, naming what serves",
        )
        load.more()
    finally:
        failed = load.finish()
    assert failed == [], f"failed requests: {failed[:3]}"
    assert load.latest()[1] == "2" and load.latest()[2] == expected_other
    assert any(v == "1" and d == expected_digits for _, v, d in load.results)
    with reload_server.client() as http:
        index = http.post("/v2/repository/index", json={}).json()
        failed = next(e for e in index if e["version"] == "3")
        assert (failed["state"] == "UNAVAILABLE" and "not a package" in failed["reason"]) or "zip" in failed["reason"]
        metrics = http.get("/metrics").text
        assert 'unideploy_model_load_failures_total{model="digits",version="3"} 1.0' in metrics
    # 4. later changes are still picked up: the corrupt file is fixed
    zipped(digits["package"], model_dir / "3.zip")
    with reload_server.client() as http:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1, 8, 8], "data": x.ravel().tolist()}]}
        reload_server.wait_for(
            lambda: http.post("/v2/models/digits/infer", json=body).json()["model_version"] == "3",
            what="the fixed version 3",
        )


def test_explicit_unload_and_load(reload_server):
    with reload_server.client() as http:
        assert http.post("/v2/repository/models/digits/unload").status_code == 200
        assert http.get("/v2/models/digits/ready").status_code in (404, 503)
        scans = lambda: reload_server.metric("unideploy_repository_scans_total", result="ok")  # noqa: E731
        unloaded = scans()
        # the watcher must not bring an unloaded model back by itself: two whole scans later it is still out
        reload_server.wait_for(lambda: scans() >= unloaded + 2, what="two repository scans")
        assert http.get("/v2/models/digits/ready").status_code in (404, 503)
        assert http.post("/v2/repository/models/digits/load").status_code == 200
        assert http.get("/v2/models/digits/ready").status_code == 200


def test_corrupt_replacement_keeps_the_old_files_serving(reload_server, digits):
    model_dir = reload_server.repo / "digits"
    (model_dir / "1.zip").write_bytes(b"truncated")  # replaced in place by garbage
    reload_server.wait_for(lambda: "version 1 failed to load" in reload_server.log.read_text(), what="the refusal")
    with reload_server.client() as http:
        assert http.get("/v2/models/digits/versions/1/ready").status_code == 200
    zipped(digits["package"], model_dir / "1.zip")  # fixed again: reloaded
    reload_server.wait_for(lambda: reload_server.log.read_text().count("version 1 ready") >= 2, what="the reload")


def test_model_yaml_chooses_the_artifact_to_serve(digits, tmp_path):
    """Serve the INT8 artifact of a package; a name the package lacks is refused, with the reason."""
    import yaml
    from serving import start_server, stop_server

    repo = tmp_path / "repo"
    unideploy.optimize(
        digits["package"], repo / "digits" / "1", quantize="int8", keep_slower=True, calibration=str(digits["data"])
    ).close()
    (repo / "digits" / "model.yaml").write_text(yaml.safe_dump({"artifact": "onnx-int8"}))
    with np.load(digits["data"]) as d:
        x = np.ascontiguousarray(d["x"][:3])
    running = start_server(repo, tmp_path)
    try:
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 1, 8, 8], "data": x.ravel().tolist()}]}
        with running.client() as http:
            served = np.asarray(
                http.post("/v2/models/digits/infer", json=body).json()["outputs"][0]["data"], np.float32
            )
        expected = unideploy.run(repo / "digits" / "1", {"x": x}, artifact="onnx-int8")["output"]
        np.testing.assert_allclose(served.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)
        # a setting the package cannot satisfy: version 1 keeps serving under the old one
        (repo / "digits" / "model.yaml").write_text(yaml.safe_dump({"artifact": "onnx-int4"}))
        running.wait_for(lambda: "no artifact 'onnx-int4'" in running.log.read_text(), what="the refusal")
        with running.client() as http:
            assert http.post("/v2/models/digits/infer", json=body).status_code == 200
        # back to fp32: the loaded version is reloaded under the new setting
        (repo / "digits" / "model.yaml").write_text(yaml.safe_dump({"artifact": "onnx-fp32"}))
        fp32 = unideploy.run(repo / "digits" / "1", {"x": x}, artifact="onnx-fp32")["output"]

        def serves_fp32() -> bool:
            with running.client() as http:
                out = http.post("/v2/models/digits/infer", json=body).json()["outputs"][0]["data"]
            return np.allclose(np.asarray(out, np.float32).reshape(fp32.shape), fp32, rtol=1e-6, atol=1e-6)

        running.wait_for(serves_fp32, what="the fp32 artifact to serve")
    finally:
        stop_server(running)


def test_version_folders_named_with_non_ascii_digits_are_not_versions(reload_server, digits):
    """``²`` and ``١`` pass ``str.isdigit()``; as versions they stopped hot reload and collided with 1."""  # noqa: RUF002
    root = reload_server.repo / "digits"
    for name in ("²", "١"):  # noqa: RUF001 (the Arabic-Indic digit one is the point)
        shutil.copytree(digits["package"], root / name)
    zipped(digits["package"], root / "2.zip")
    with reload_server.client() as http:

        def versions() -> dict[str, str]:
            index = http.post("/v2/repository/index", json={})
            assert index.status_code == 200, index.text
            return dict(sorted((e["version"], e["state"]) for e in index.json() if e["name"] == "digits"))

        # hot reload went on: the latest version serves
        reload_server.wait_for(lambda: versions().get("2") == "READY", what="version 2 to serve")
        assert list(versions()) == ["1", "2"]
        assert http.get("/v2/models/digits/versions/2/ready").status_code == 200


def test_temporary_files_in_a_serving_version_never_take_it_out(digits, tmp_path):
    """Editors and rsync write and remove dotfiles and temporaries inside a version's folder while it
    serves: the version that serves stays the one that serves, and nothing reloads."""
    from serving import start_server, stop_server

    repo = tmp_path / "repo"
    for version in ("1", "2"):
        shutil.copytree(digits["package"], repo / "digits" / version)
    server = start_server(repo, tmp_path)
    x = np.zeros((1, 1, 8, 8), np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": x.ravel().tolist()}]}
    served = []
    version_dir = repo / "digits" / "2"
    try:
        with server.client() as http:
            for i in range(400):  # bounded: about 2 s, ten scans of the repository
                names = [
                    version_dir / "artifacts" / f".tmp-{i}",
                    version_dir / f".model.onnx.{i:06d}",
                    version_dir / "a~",
                ]
                for name in names:
                    name.write_bytes(b"being written")
                served.append(http.post("/v2/models/digits/infer", json=body).json()["model_version"])
                for name in names[: 1 + i % 3]:
                    name.unlink()
                for name in names[1 + i % 3 :]:
                    name.unlink()
    finally:
        stop_server(server)
    assert set(served) == {"2"}
    log = server.log.read_text()
    assert "failed to load" not in log and "unloaded" not in log.split("shutting down")[0]


def test_a_change_made_while_a_temporary_file_is_there_loads_once_it_is_gone(digits, tmp_path):
    """A copy tool writes the new files of a version beside a temporary one: the load tried then fails
    (the package holds a file its manifest does not list) and the old copy keeps serving; once the
    temporary file is gone, the same files are loaded without any further change."""
    from serving import start_server, stop_server

    repo = tmp_path / "repo"
    version_dir = repo / "digits" / "1"
    shutil.copytree(digits["package"], version_dir)
    server = start_server(repo, tmp_path)
    try:
        loaded = lambda: server.log.read_text().count("model digits version 1 ready")  # noqa: E731
        server.wait_for(lambda: loaded() == 1, what="the first load")
        temporary = version_dir / "artifacts" / ".model.onnx.tmp-1"
        temporary.write_bytes(b"being written")
        manifest = version_dir / "manifest.json"
        os.utime(manifest, ns=(manifest.stat().st_atime_ns, manifest.stat().st_mtime_ns + 10**9))  # a real change
        server.wait_for(lambda: "version 1 failed to load" in server.log.read_text(), what="the load during the copy")
        with server.client() as http:
            assert http.get("/v2/models/digits/ready").status_code == 200  # the old copy serves
        temporary.unlink()
        server.wait_for(lambda: loaded() == 2, what="the load once the temporary file is gone")
    finally:
        stop_server(server)
