"""KServe manifests for a repository or one package: ``deploy kserve``.

A ClusterServingRuntime runs this server under KServe's runtime contract: the model where KServe's
storage initializer puts it (``/mnt/models``), REST on 8080 (the port KServe routes to), gRPC on
9000, readiness on ``/v2/health/ready``, the InferenceService's name passed as ``--model-name``
(so a client calls ``/v2/models/<isvc>/infer`` as with every KServe runtime). One InferenceService
per model points at the model's folder in ``--storage-uri``, so all its versions, ``model.yaml``
and ``routing.yaml`` travel with it and A/B routing (sticky keys, shadow) happens inside the
server. ``--routing kserve`` maps a plain weighted split of two versions onto KServe's canary
rollout instead: the stable version first, then the canary with ``canaryTrafficPercent``.

Everything is built from the KServe SDK's own models, so field names and types are KServe's.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unideploy.errors import InputError
from unideploy.package.files import replace_path, temp_prefix
from unideploy.package.manifest import FORMAT_VERSION as PACKAGE_FORMAT_VERSION
from unideploy.package.manifest import MANIFEST_NAME
from unideploy.package.writer import check_destination
from unideploy.server import require
from unideploy.server.repository import ModelSource, scan, service_name
from unideploy.server.routing import load_routing

RUNTIME_NAME = "unideploy"
MODEL_FORMAT = "unideploy"
FORMAT_VERSION = str(PACKAGE_FORMAT_VERSION)
MODEL_DIR = "/mnt/models"
HTTP_PORT, GRPC_PORT = 8080, 9000
ENGINE_CACHE_VOLUME, ENGINE_CACHE_MOUNT = "engine-cache", "/var/cache/unideploy"
IMAGE_USER = {False: 1000, True: 1001}  # the unideploy user's uid in docker/Dockerfile and Dockerfile.gpu
# What KServe's storage initializer fetches: s3, gs and pvc hold folders, http(s) one file (a .zip
# is unpacked), oci a modelcar image (one model).
STORAGE_SCHEMES = ("s3", "gs", "pvc", "https", "http", "oci")
FOLDER_SCHEMES = ("s3", "gs", "pvc")
ROUTING_MODES = ("server", "kserve")


@dataclass(frozen=True)
class KServeRequest:
    source: Path  # a repository (REPO/<model>/<version>/) or one package (directory or .zip)
    image: str
    output: Path
    storage_uri: str | None = None  # where SOURCE is uploaded; default pvc://unideploy-models/<name>
    gpu: bool = False
    namespace: str | None = None
    routing: str = "server"
    cpu: str = "1"
    memory: str = "2Gi"
    overwrite: bool = False


@dataclass(frozen=True)
class ServiceEntry:
    """One InferenceService written: what a person needs to call it."""

    model: str
    service: str
    storage_uri: str
    file: str
    canary: str | None = None  # the canary manifest, applied after the stable one is ready

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "inference_service": self.service,
            "storage_uri": self.storage_uri,
            "file": self.file,
            "canary_file": self.canary,
            "infer_path": f"/v2/models/{self.service}/infer",
        }


def runtime_args() -> list[str]:
    """The container's arguments (after ``deploy``); KServe fills ``{{.Name}}`` in."""
    return [
        "serve",
        MODEL_DIR,
        "--model-name={{.Name}}",
        "--host",
        "0.0.0.0",
        "--http-port",
        str(HTTP_PORT),
        "--grpc-port",
        str(GRPC_PORT),
    ]


def write_manifests(request: KServeRequest) -> tuple[str, list[ServiceEntry]]:
    """Write the runtime and the InferenceServices into ``request.output`` (staged, then renamed);
    the runtime's file name and the services."""
    _check_request(request)
    check_destination(request.output, request.overwrite)
    documents, entries = _documents(request)
    serialize = _serializer()
    out = request.output
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=temp_prefix(out.parent, f".{out.name}.", ".partial"), suffix=".partial", dir=out.parent)
    )
    try:
        for relpath, document in documents.items():
            (staging / relpath).parent.mkdir(parents=True, exist_ok=True)
            (staging / relpath).write_text(serialize(document), encoding="utf-8")
        replace_path(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return next(iter(documents)), entries


def _check_request(request: KServeRequest) -> None:
    if request.routing not in ROUTING_MODES:
        raise InputError(f"unknown routing mode '{request.routing}'", f"choose one of {', '.join(ROUTING_MODES)}")
    if request.storage_uri is not None:
        scheme = request.storage_uri.split("://", 1)[0] if "://" in request.storage_uri else ""
        if scheme not in STORAGE_SCHEMES:
            raise InputError(
                f"--storage-uri '{request.storage_uri}' is not a location KServe's storage initializer fetches",
                f"use one of {', '.join(s + '://' for s in STORAGE_SCHEMES)}",
            )


def _documents(request: KServeRequest) -> tuple[dict[str, Any], list[ServiceEntry]]:
    """File name -> KServe object, the runtime first."""
    source = request.source
    if not source.exists():
        raise InputError(f"'{source}' does not exist", "pass a model repository or a package")
    is_package = source.is_file() or (source / MANIFEST_NAME).is_file()
    base = (request.storage_uri or f"pvc://unideploy-models/{source.name}").rstrip("/")
    runtime = _runtime(request)
    documents: dict[str, Any] = {"servingruntime.yaml": runtime}
    entries = []
    models = _package_model(source) if is_package else scan(source)
    if not models:
        raise InputError(f"'{source}' holds no models", "create REPO/<model>/<version>/ holding packages")
    names: dict[str, str] = {}
    for name, model in models.items():
        service = service_name(name)
        if service in names:
            raise InputError(
                f"models '{names[service]}' and '{name}' both become InferenceService '{service}'",
                "rename one of the model folders",
            )
        names[service] = name
        if is_package:
            stable, canary = (base, None)
        else:
            stable, canary = _storage_uris(request, base, model)
        scaling = model.settings
        file = f"{service}.yaml"
        documents[file] = _inference_service(request, service, stable, scaling)
        canary_file = None
        if canary is not None:
            uri, percent = canary
            canary_file = f"canary/{service}.yaml"
            documents[canary_file] = _inference_service(request, service, uri, scaling, percent)
        entries.append(ServiceEntry(name, service, stable, file, canary_file))
    return documents, entries


def _package_model(source: Path) -> dict[str, ModelSource]:
    from unideploy.package import Package
    from unideploy.server.config import ModelSettings

    with Package.open(source) as package:
        name = package.manifest.name
    return {name: ModelSource(name, source, ModelSettings(), {})}


def _storage_uris(request: KServeRequest, base: str, model: ModelSource) -> tuple[str, tuple[str, int] | None]:
    """The model's storageUri, and with ``--routing kserve`` and a routing file, the canary's URI and
    traffic percent (the stable URI is then the other version's package)."""
    scheme = base.split("://", 1)[0]
    folder = f"{base}/{model.name}"
    routing = load_routing(model.directory) if request.routing == "kserve" else None
    if routing is None:
        if scheme not in FOLDER_SCHEMES:
            raise InputError(
                f"{scheme}:// storage holds one file or image, not model '{model.name}''s folder of versions",
                f"use {', '.join(s + '://' for s in FOLDER_SCHEMES)} for a repository, or "
                "run 'deploy kserve' on one package",
            )
        return folder, None
    unsupported = [
        what
        for what, used in (
            ("a sticky header", routing.sticky_header),
            ("a shadow version", routing.shadow_version),
            ("more than two variants", len(routing.variants) > 2),
        )
        if used
    ]
    if unsupported or len(routing.variants) < 2:
        raise InputError(
            f"model '{model.name}': routing.yaml uses {' and '.join(unsupported) or 'one variant'}, "
            "which KServe's canary rollout cannot express",
            "use --routing server (the default) to route inside unideploy's server",
        )
    stable, candidate = sorted(routing.variants, key=lambda v: int(v.version))
    percent = round(100 * candidate.weight / (stable.weight + candidate.weight))

    def version_uri(version: str) -> str:
        source = model.versions.get(version)
        if source is None:
            raise InputError(
                f"model '{model.name}': routing.yaml names version {version}, which is not in {model.directory}",
                "add that version or fix routing.yaml",
            )
        return f"{folder}/{source.path.name}"

    return version_uri(stable.version), (version_uri(candidate.version), percent)


def _runtime(request: KServeRequest) -> Any:
    kserve, k8s = _sdk()
    gpu = request.gpu
    limits = {"cpu": request.cpu, "memory": request.memory, **({"nvidia.com/gpu": "1"} if gpu else {})}
    container = k8s.V1Container(
        name="kserve-container",
        image=request.image,
        command=["deploy"],
        args=runtime_args(),
        env=[k8s.V1EnvVar(name="UNIDEPLOY_ENGINE_CACHE", value=f"{ENGINE_CACHE_MOUNT}/engines")] if gpu else None,
        resources=k8s.V1ResourceRequirements(requests={"cpu": request.cpu, "memory": request.memory}, limits=limits),
        readiness_probe=k8s.V1Probe(
            http_get=k8s.V1HTTPGetAction(path="/v2/health/ready", port=HTTP_PORT), period_seconds=5, failure_threshold=3
        ),
        liveness_probe=k8s.V1Probe(
            http_get=k8s.V1HTTPGetAction(path="/v2/health/live", port=HTTP_PORT), period_seconds=10, failure_threshold=3
        ),
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False,
            privileged=False,
            run_as_non_root=True,
            run_as_user=IMAGE_USER[gpu],
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
        volume_mounts=[k8s.V1VolumeMount(name=ENGINE_CACHE_VOLUME, mount_path=ENGINE_CACHE_MOUNT)] if gpu else None,
    )
    spec = kserve.V1alpha1ServingRuntimeSpec(
        annotations={"prometheus.kserve.io/port": str(HTTP_PORT), "prometheus.kserve.io/path": "/metrics"},
        supported_model_formats=[
            kserve.V1alpha1SupportedModelFormat(
                name=MODEL_FORMAT, version=FORMAT_VERSION, auto_select=not gpu, priority=1
            )
        ],
        protocol_versions=["v2", "grpc-v2"],
        containers=[container],
        volumes=[k8s.V1Volume(name=ENGINE_CACHE_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource())] if gpu else None,
    )
    return kserve.V1alpha1ClusterServingRuntime(
        api_version=f"{kserve.constants.KSERVE_GROUP}/{kserve.constants.KSERVE_V1ALPHA1_VERSION}",
        kind="ClusterServingRuntime",
        metadata=k8s.V1ObjectMeta(name=_runtime_name(gpu)),
        spec=spec,
    )


def _runtime_name(gpu: bool) -> str:
    return f"{RUNTIME_NAME}-gpu" if gpu else RUNTIME_NAME


def _inference_service(
    request: KServeRequest, service: str, storage_uri: str, scaling: Any, canary_percent: int | None = None
) -> Any:
    kserve, k8s = _sdk()
    autoscale = scaling.target_concurrency is not None
    predictor = kserve.V1beta1PredictorSpec(
        model=kserve.V1beta1ModelSpec(
            model_format=kserve.V1beta1ModelFormat(name=MODEL_FORMAT, version=FORMAT_VERSION),
            name="kserve-container",
            runtime=_runtime_name(request.gpu),
            protocol_version="v2",
            storage_uri=storage_uri,
        ),
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        scale_metric="concurrency" if autoscale else None,
        scale_target=scaling.target_concurrency if autoscale else None,
        canary_traffic_percent=canary_percent,
    )
    metadata = k8s.V1ObjectMeta(
        name=service, namespace=request.namespace, annotations={"serving.kserve.io/enable-prometheus-scraping": "true"}
    )
    return kserve.V1beta1InferenceService(
        api_version=f"{kserve.constants.KSERVE_GROUP}/{kserve.constants.KSERVE_V1BETA1_VERSION}",
        kind=kserve.constants.KSERVE_KIND_INFERENCESERVICE,
        metadata=metadata,
        spec=kserve.V1beta1InferenceServiceSpec(predictor=predictor),
    )


def _sdk() -> tuple[Any, Any]:
    """The KServe SDK and the Kubernetes client models it builds on."""
    require("kserve", "deploy kserve")
    import kserve
    from kubernetes import client

    return kserve, client


def _serializer() -> Any:
    """KServe object -> YAML, through the SDK's own serialization (camelCase fields, no empty ones)."""
    import yaml
    from kserve.api_client import ApiClient

    client = ApiClient()
    return lambda document: yaml.safe_dump(client.sanitize_for_serialization(document), sort_keys=False)
