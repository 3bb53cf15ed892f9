"""`deploy kserve`: manifests that are KServe's own objects, and a runtime container whose command
serves what KServe's storage initializer leaves in /mnt/models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from console import assert_one_line_error, without_modules
from serving import DEPLOY, RunningServer, free_port, stop_server, two_versions

from unideploy.package import Package
from unideploy.server.kserve import MODEL_DIR, runtime_args
from unideploy.server.repository import service_name

IMAGE = "registry.example.com/unideploy:0.1"


def kserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DEPLOY, "kserve", *args], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"}
    )  # paths printed on one line


def round_trip(path: Path) -> dict:
    """A manifest read back through the SDK model of its kind serializes to the same document
    (tests/server/kserve_types.py, in a process of its own: the KServe SDK registers its own copy of
    the Open Inference Protocol's .proto, which cannot share a process with the server's)."""
    checked = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("kserve_types.py")), str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def kserve_repo(digits, tmp_path_factory) -> Path:
    """The digits package as versions 1 and 2 of 'digits_cnn', with routing and scaling settings."""
    return two_versions(
        tmp_path_factory.mktemp("kserve-repo"),
        digits["package"],
        "digits_cnn",
        (90, 10),
        {"replicas": {"min": 1, "max": 4, "target_concurrency": 8}},
    )


def test_manifests_are_kserve_objects(kserve_repo, tmp_path):
    out = tmp_path / "manifests"
    result = kserve(
        str(kserve_repo),
        "--image",
        IMAGE,
        "--storage-uri",
        "s3://bucket/models/",
        "-o",
        str(out),
        "--namespace",
        "ml",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["services"] == [
        {
            "model": "digits_cnn",
            "inference_service": "digits-cnn",
            "storage_uri": "s3://bucket/models/digits_cnn",
            "file": "digits-cnn.yaml",
            "canary_file": None,
            "infer_path": "/v2/models/digits-cnn/infer",
        }
    ]
    assert sorted(p.name for p in out.iterdir()) == ["digits-cnn.yaml", "servingruntime.yaml"]

    runtime = round_trip(out / "servingruntime.yaml")
    assert (runtime["kind"], runtime["metadata"]["name"]) == ("ClusterServingRuntime", "unideploy")
    spec = runtime["spec"]
    assert spec["supportedModelFormats"] == [{"autoSelect": True, "name": "unideploy", "priority": 1, "version": "1"}]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    assert spec["annotations"] == {"prometheus.kserve.io/port": "8080", "prometheus.kserve.io/path": "/metrics"}
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container" and container["image"] == IMAGE
    assert container["command"] == ["deploy"] and container["args"] == runtime_args()
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert (
        container["securityContext"]["runAsNonRoot"] is True
        and "nvidia.com/gpu" not in container["resources"]["limits"]
    )

    service = round_trip(out / "digits-cnn.yaml")
    assert service["metadata"]["name"] == "digits-cnn" and service["metadata"]["namespace"] == "ml"
    predictor = service["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == "s3://bucket/models/digits_cnn"  # the model folder: routing inside
    assert predictor["model"]["modelFormat"] == {"name": "unideploy", "version": "1"}
    assert (predictor["model"]["runtime"], predictor["model"]["protocolVersion"]) == ("unideploy", "v2")
    # model.yaml's replicas become KServe's autoscaling on requests in flight
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (1, 4)
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("concurrency", 8)
    assert "canaryTrafficPercent" not in predictor


def test_gpu_runtime_requests_a_gpu_and_keeps_an_engine_cache(kserve_repo, tmp_path):
    out = tmp_path / "gpu"
    assert (
        kserve(str(kserve_repo), "--image", IMAGE, "--gpu", "--storage-uri", "gs://b/m", "-o", str(out)).returncode == 0
    )
    spec = round_trip(out / "servingruntime.yaml")["spec"]
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "UNIDEPLOY_ENGINE_CACHE", "value": "/var/cache/unideploy/engines"} in container["env"]
    assert container["volumeMounts"] == [{"mountPath": "/var/cache/unideploy", "name": "engine-cache"}]
    assert spec["volumes"] == [{"emptyDir": {}, "name": "engine-cache"}]
    assert spec["supportedModelFormats"][0]["autoSelect"] is False  # chosen by name, never by accident
    assert round_trip(out / "digits-cnn.yaml")["spec"]["predictor"]["model"]["runtime"] == "unideploy-gpu"


def test_weighted_split_becomes_a_kserve_canary(kserve_repo, tmp_path):
    out = tmp_path / "canary"
    result = kserve(
        str(kserve_repo), "--image", IMAGE, "--storage-uri", "s3://bucket/models", "-o", str(out), "--routing", "kserve"
    )
    assert result.returncode == 0, result.stderr
    assert f"kubectl apply -f {out / 'canary'}" in result.stdout
    stable = round_trip(out / "digits-cnn.yaml")["spec"]["predictor"]
    canary = round_trip(out / "canary" / "digits-cnn.yaml")["spec"]["predictor"]
    assert stable["model"]["storageUri"] == "s3://bucket/models/digits_cnn/1" and "canaryTrafficPercent" not in stable
    assert canary["model"]["storageUri"] == "s3://bucket/models/digits_cnn/2" and canary["canaryTrafficPercent"] == 10


def test_what_kserve_cannot_express_or_fetch_is_refused(kserve_repo, tmp_path):
    sticky = tmp_path / "sticky"
    shutil.copytree(kserve_repo, sticky)
    routing = yaml.safe_load((sticky / "digits_cnn" / "routing.yaml").read_text())
    (sticky / "digits_cnn" / "routing.yaml").write_text(yaml.safe_dump({**routing, "sticky_header": "x-user"}))
    cases = [
        ((str(sticky), "--routing", "kserve"), "uses a sticky header, which KServe's canary rollout cannot express"),
        ((str(kserve_repo), "--storage-uri", "ftp://host/models"), "not a location KServe's storage initializer"),
        ((str(kserve_repo), "--storage-uri", "https://host/models"), "https:// storage holds one file or image"),
        ((str(tmp_path / "missing"),), "does not exist"),
    ]
    for args, message in cases:
        out = tmp_path / "out"
        result = kserve(*args, "--image", IMAGE, "-o", str(out))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not out.exists() and not list(tmp_path.glob(".out.*"))  # nothing half-written
    (tmp_path / "out").mkdir()
    result = kserve(str(kserve_repo), "--image", IMAGE, "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and "--force" in result.stderr


def test_without_its_extra_deploy_kserve_names_what_to_install(kserve_repo, tmp_path, monkeypatch):
    """As on an install with neither the kserve extra nor the serve extra (the settings classes that
    read model.yaml come with either): one line, before anything is read or written."""
    monkeypatch.setenv("PYTHONPATH", without_modules(tmp_path / "core-only", "kserve", "pydantic_settings"))
    result = kserve(str(kserve_repo), "--image", IMAGE, "-o", str(tmp_path / "out"))
    assert_one_line_error(
        result,
        2,
        r"deploy kserve needs the kserve extra: missing Python module\(s\): kserve, pydantic_settings "
        r"\(pip install 'unideploy\[kserve\]'\)",
    )
    assert not (tmp_path / "out").exists()


CRD_DIR = os.environ.get("KSERVE_CRD_DIR")


def crd_schemas(folder: Path) -> dict[tuple[str, str], dict]:
    """(kind, version) -> the CRD's openAPIV3Schema made strict the way the API server is: fields a
    structural schema does not list are refused, int-or-string fields take either."""

    def strict(node):
        if isinstance(node, list):
            return [strict(item) for item in node]
        if not isinstance(node, dict):
            return node
        node = {key: strict(value) for key, value in node.items()}
        if node.get("x-kubernetes-int-or-string"):
            node["type"] = ["integer", "string"]
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        return node

    schemas = {}
    for file in folder.glob("serving.kserve.io_*.yaml"):
        crd = yaml.safe_load(file.read_text())
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by the API server itself
            schemas[(crd["spec"]["names"]["kind"], version["name"])] = schema
    return schemas


@pytest.mark.skipif(
    not CRD_DIR,
    reason="KServe's CRDs ship in no PyPI package and tests never download: set "
    "KSERVE_CRD_DIR to a KServe checkout's config/crd/full to run this check",
)
def test_manifests_match_kserve_crd_schemas(kserve_repo, tmp_path):
    import jsonschema

    schemas = crd_schemas(Path(CRD_DIR))
    out = tmp_path / "crd"
    for flags in ((), ("--gpu", "--routing", "kserve", "--namespace", "ml")):
        assert kserve(str(kserve_repo), "--image", IMAGE, "-o", str(out), "--force", *flags).returncode == 0
        for file in out.rglob("*.yaml"):
            document = yaml.safe_load(file.read_text())
            schema = schemas[(document["kind"], document["apiVersion"].split("/")[1])]
            jsonschema.Draft7Validator(schema).validate(document)
    misspelt = yaml.safe_load((out / "digits-cnn.yaml").read_text())
    misspelt["spec"]["predictor"]["model"]["storageUrl"] = misspelt["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(jsonschema.ValidationError, match="storageUrl"):
        jsonschema.Draft7Validator(schemas[("InferenceService", "v1beta1")]).validate(misspelt)


def run_runtime_container(manifests: Path, mnt: Path, service: str, tmp_path: Path) -> RunningServer:
    """The runtime's container command, as KServe runs it, with only what a test must change: the
    model mount, ports that are free here, and 127.0.0.1 for 0.0.0.0."""
    (container,) = yaml.safe_load((manifests / "servingruntime.yaml").read_text())["spec"]["containers"]
    http_port, grpc_port = free_port(), free_port()
    swap = {MODEL_DIR: str(mnt), "0.0.0.0": "127.0.0.1", "8080": str(http_port), "9000": str(grpc_port)}
    args = [swap.get(a, a).replace("{{.Name}}", service) for a in container["args"]]
    assert container["command"] == ["deploy"]
    log = tmp_path / "runtime.log"
    with open(log, "w") as log_file:  # the child keeps its own descriptor
        process = subprocess.Popen([DEPLOY, *args], stdout=log_file, stderr=subprocess.STDOUT)
    server = RunningServer(mnt, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process, log)
    probe = container["readinessProbe"]["httpGet"]["path"]

    def ready() -> bool:
        try:
            return httpx.get(server.http + probe, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    server.wait_for(ready, what="the readiness probe")
    return server


@pytest.mark.parametrize("layout", ["model-folder", "repository", "package"])
def test_runtime_container_serves_what_the_storage_initializer_leaves(kserve_repo, digits, tmp_path, layout):
    """storageUri of a model folder (all versions, routing.yaml), of a whole repository (the model
    whose Kubernetes name the service has) or of one package (a .zip is unpacked by the storage
    initializer): /mnt/models serves as the InferenceService's name."""
    manifests = tmp_path / "manifests"
    source = digits["package"] if layout == "package" else kserve_repo
    result = kserve(
        str(source), "--image", IMAGE, "--storage-uri", "s3://bucket/models", "-o", str(manifests), "--json"
    )
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["services"][0]["inference_service"]
    assert service == ("digits" if layout == "package" else service_name("digits_cnn"))
    mnt = tmp_path / "mnt" / "models"
    shutil.copytree(
        {"model-folder": kserve_repo / "digits_cnn", "repository": kserve_repo}.get(layout, digits["package"]), mnt
    )
    model_dir = mnt / "digits_cnn" if layout == "repository" else mnt
    with Package.open(digits["package"]) as package:
        sample = package.reference_samples()[-1]
    server = run_runtime_container(manifests, mnt, service, tmp_path)
    try:
        with server.client() as http:
            metadata = http.get(f"/v2/models/{service}").json()
            assert metadata["versions"] == (["1"] if layout == "package" else ["1", "2"])
            ((name, x),) = sample.inputs.items()
            body = {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
            answer = http.post(f"/v2/models/{service}/infer", json=body)
            assert answer.status_code == 200, answer.text
            (output,) = answer.json()["outputs"]
            expected = sample.outputs[output["name"]]
            np.testing.assert_allclose(np.reshape(output["data"], expected.shape), expected, rtol=1e-4, atol=1e-5)
            if layout != "package":  # routing.yaml came along and routes inside the server
                assert answer.headers.get("x-unideploy-variant") in ("control", "candidate")
                # and the routing API writes the model's own routing.yaml: /mnt/models is the model
                only_candidate = {"variants": [{"name": "candidate", "version": "2", "weight": 1}]}
                assert http.put(f"/v2/models/{service}/routing", json=only_candidate).status_code == 200
                assert yaml.safe_load((model_dir / "routing.yaml").read_text())["variants"][0]["name"] == "candidate"
    finally:
        stop_server(server)


def test_a_model_name_a_repository_does_not_hold_is_refused(kserve_repo, tmp_path):
    result = subprocess.run(
        [
            DEPLOY,
            "serve",
            str(kserve_repo),
            "--model-name",
            "x",
            "--http-port",
            str(free_port()),
            "--grpc-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "holds a repository of models (digits_cnn) and none is named 'x'" in result.stderr
