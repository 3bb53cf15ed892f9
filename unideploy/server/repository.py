"""What the repository on disk asks to be served: ``REPO/<model>/<version>/`` (a package
directory) or ``REPO/<model>/<version>.zip``; versions are whole numbers, as in Triton and TF
Serving. A fingerprint per version (sizes and times of its files) tells the watcher what changed.

REPO may also be one package directory (``manifest.json`` at its top), as KServe's storage
initializer leaves a single model's ``storageUri`` in ``/mnt/models``: it serves as the one model
its manifest names, at its manifest's version when that is a whole number, else version 1.

Given a model name (``deploy serve REPO --model-name NAME``, which KServe's runtime passes as
``{{.Name}}``), one model is served as NAME: REPO itself (its ``<version>/`` folders with their
``model.yaml`` and ``routing.yaml``, TF Serving's layout under ``/mnt/models``, or one package),
or, where REPO is a repository, its model named NAME or whose Kubernetes name NAME is.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from unideploy.errors import InputError
from unideploy.package.manifest import MANIFEST_NAME
from unideploy.server.config import ModelSettings, model_settings

log = logging.getLogger("unideploy.server")
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class VersionSource:
    model: str
    version: str
    path: Path
    fingerprint: tuple
    transient: tuple = ()  # the transient files in it when scanned (a copy still being written)


@dataclass(frozen=True)
class ModelSource:
    name: str
    directory: Path
    settings: ModelSettings
    versions: dict[str, VersionSource]  # every version on disk, oldest first


def service_name(model: str) -> str:
    """A model name as a Kubernetes resource name (a DNS-1035 label: lowercase letters, digits and
    '-', starting with a letter, at most 63 characters): what KServe passes as ``--model-name``."""
    name = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    name = name if name[:1].isalpha() else f"m-{name}"
    return name[:63].rstrip("-")


def transient(relpath: Path) -> bool:
    """A name editors, rsync and copy tools give files they are still writing or about to remove
    (dotfiles such as rsync's ``.name.XXXXXX`` or ``.tmp-N``, ``name~``, ``.swp``/``.tmp``/``.partial``):
    their coming and going is no change to a version."""
    return any(part.startswith(".") for part in relpath.parts) or relpath.name.endswith(
        ("~", ".swp", ".tmp", ".partial")
    )


def _version(model: str, version: str, path: Path) -> VersionSource:
    """A version as it lies on disk: sizes and times of its files, transient ones apart, so a version
    changes only when its own files do; a file removed while we look is skipped (the next scan sees
    the final state), never a reason to drop the whole version from this scan, which retired it and
    served an older one until the next scan. The transient names are kept too: a load that failed
    while they were there (a package still being copied lists more files than its manifest) is
    tried again once they are gone."""
    if path.is_file():
        return VersionSource(model, version, path, ((str(path), path.stat().st_size, path.stat().st_mtime_ns),))
    found, passing = [], []
    for folder, _, names in os.walk(path):  # a folder removed mid-walk is skipped, not raised
        for name in names:
            file = Path(folder) / name
            if transient(file.relative_to(path)):
                passing.append(str(file.relative_to(path)))
                continue
            try:
                stat = file.stat()
            except OSError:
                continue
            found.append((str(file), stat.st_size, stat.st_mtime_ns))
    return VersionSource(model, version, path, tuple(sorted(found)), tuple(sorted(passing)))


def _versions_on_disk(directory: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for entry in directory.iterdir():
        name = entry.stem if entry.is_file() and entry.suffix == ".zip" else entry.name
        if entry.name.startswith(".") or not (name.isascii() and name.isdigit()):  # not "²" or "١"  # noqa: RUF003
            continue  # model.yaml, routing.yaml, staging directories
        if entry.is_dir() or entry.suffix == ".zip":
            found[str(int(name))] = entry
    return dict(sorted(found.items(), key=lambda kv: int(kv[0])))


def _single_package(directory: Path, name: str | None) -> ModelSource:
    """A repository that is one package: its model name (unless given) and version from its manifest
    (read leniently: a broken manifest still gives a model, whose load then fails with the reason)."""
    try:
        model = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))["model"]
    except (OSError, ValueError, TypeError, KeyError):
        model = {}
    model = model if isinstance(model, dict) else {}
    named = name or model.get("name")
    name = (
        named
        if isinstance(named, str) and MODEL_NAME.match(named)
        else (directory.resolve().name if MODEL_NAME.match(directory.resolve().name) else "model")
    )
    declared = str(model.get("version", ""))
    version = str(int(declared)) if declared.isascii() and declared.isdigit() else "1"
    source = _version(name, version, directory)
    return ModelSource(name, directory, ModelSettings(), {version: source})


def _model(directory: Path, name: str) -> ModelSource:
    """One model folder: its settings and the versions on disk."""
    try:
        settings = model_settings(directory)
    except InputError as exc:
        settings = ModelSettings()
        log.error("model %s: %s; using the default settings", name, exc)
    versions = {}
    for version, path in _versions_on_disk(directory).items():
        try:
            versions[version] = _version(name, version, path)
        except OSError:  # removed while we looked; the next scan sees the final state
            continue
    return ModelSource(name, directory, settings, versions)


def scan(repository: Path, model_name: str | None = None) -> dict[str, ModelSource]:
    """The models REPO holds; with ``model_name``, REPO is that one model's folder or package."""
    if not repository.is_dir():
        raise InputError(
            f"model repository '{repository}' is not a directory",
            "create REPO/<model>/<version>/ holding packages from 'deploy export'",
        )
    if model_name is not None and not MODEL_NAME.match(model_name):
        raise InputError(
            f"model name '{model_name}' is not usable in a URL path",
            "use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    if (repository / MANIFEST_NAME).is_file():
        single = _single_package(repository, model_name)
        return {single.name: single}
    if model_name is not None:
        model = _model(repository, model_name)
        inner = sorted(p for p in repository.iterdir() if p.is_dir() and _versions_on_disk(p))
        if not model.versions and inner:  # a repository: the model named so, or whose service name that is
            named = [p for p in inner if model_name in (p.name, service_name(p.name))]
            if not named:
                raise InputError(
                    f"'{repository}' holds a repository of models ({', '.join(p.name for p in inner)}) and none "
                    f"is named '{model_name}'",
                    "drop --model-name to serve them all, or name one of them",
                )
            model = _model(named[0], model_name)
        return {model_name: model}
    dirs = sorted(p for p in repository.iterdir() if p.is_dir() and MODEL_NAME.match(p.name))
    return {d.name: _model(d, d.name) for d in dirs}
