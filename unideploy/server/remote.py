"""Remote model repositories: ``deploy serve s3://bucket/prefix`` (``gs://``, and any filesystem
fsspec opens and lists).

The remote repository is mirrored into a local folder, and the server watches that folder as it
watches a local repository: a new or changed version is downloaded into a hidden staging folder,
swapped into place in one step, then checksum-verified, loaded and warmed before it serves; a
version that fails (a corrupt upload, a package still being uploaded object by object) is refused
while the previous one keeps serving, and tried again when its objects change. Only what changed
is downloaded: each model file and version is fingerprinted by its objects' sizes and ETags.

Credentials come from where the storage library looks for them (for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for S3-compatible stores, instance roles; for GCS:
``GOOGLE_APPLICATION_CREDENTIALS``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from unideploy.errors import InputError, MissingDependencyError, first_line
from unideploy.package.files import replace_path, temp_prefix
from unideploy.server.repository import MODEL_NAME

log = logging.getLogger("unideploy.server")
REMOTE_INSTALL = "pip install 'unideploy[remote]' (s3fs for s3://, gcsfs for gs://)"


class RemoteRepository:
    def __init__(self, url: str, mirror: Path, model_name: str | None = None) -> None:
        try:
            import fsspec

            self.fs, self.root = fsspec.core.url_to_fs(url)
        except ImportError as exc:
            raise MissingDependencyError(f"serving from '{url}' needs {exc.name}", REMOTE_INSTALL) from exc
        except ValueError as exc:  # a protocol fsspec does not know
            raise InputError(
                f"cannot open the model repository '{url}': {first_line(exc)}",
                "use s3://bucket/prefix, gs://bucket/prefix or a local folder",
            ) from exc
        self.url, self.mirror = url, mirror
        self.model_name = model_name  # the URL is this one model's folder: mirrored as <mirror>/<name>/
        self.root = self.root.rstrip("/")
        self._mirrored: dict[str, tuple] = {}  # "model/1", "model/1.zip", "model/model.yaml" -> fingerprint

    @classmethod
    def mirrored(cls, url: str, model_name: str | None = None) -> RemoteRepository:
        """The repository at ``url`` mirrored into a new private temporary folder, synced once (a
        missing bucket is refused here, the folder removed); a mirror a killed server left behind
        is removed when the next one starts."""
        temp = Path(tempfile.gettempdir())
        prefix = temp_prefix(temp, "unideploy-remote-repo-", ".mirror")
        mirror = Path(tempfile.mkdtemp(prefix=prefix, suffix=".mirror"))
        try:
            repository = cls(url, mirror, model_name)
            repository.sync()
        except BaseException:
            shutil.rmtree(mirror, ignore_errors=True)
            raise
        return repository

    def sync(self) -> list[str]:
        """Bring the mirror up to date with the remote repository; the entries that changed."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except (FileNotFoundError, PermissionError, OSError) as exc:
            raise InputError(
                f"cannot list the model repository '{self.url}': {first_line(exc)}",
                "check the bucket, the prefix and the credentials in the environment",
            ) from exc
        if not found and not self.fs.isdir(self.root):
            raise InputError(
                f"model repository '{self.url}' does not exist or is empty",
                "upload REPO/<model>/<version>/ packages from 'deploy export' under that prefix",
            )
        entries: dict[str, dict[str, dict[str, Any]]] = {}
        for path, info in found.items():
            parts = path[len(self.root) :].strip("/").split("/")
            parts = [self.model_name, *parts] if self.model_name else parts
            if info.get("type", "file") != "file" or not _served(parts):
                continue
            entries.setdefault("/".join(parts[:2]), {})["/".join(parts)] = info
        changed = []
        for entry, objects in sorted(entries.items()):
            fingerprint = tuple(sorted((name, info.get("size"), _version_tag(info)) for name, info in objects.items()))
            if self._mirrored.get(entry) != fingerprint:
                self._download(entry, objects)
                self._mirrored[entry] = fingerprint
                changed.append(entry)
        for entry in sorted(set(self._mirrored) - set(entries)):  # deleted remotely: the server unloads it
            local = self.mirror / entry
            shutil.rmtree(local, ignore_errors=True) if local.is_dir() else local.unlink(missing_ok=True)
            del self._mirrored[entry]
            changed.append(entry)
        if changed:
            log.info("remote repository %s: %s changed", self.url, ", ".join(changed))
        return changed

    def _download(self, entry: str, objects: dict[str, dict[str, Any]]) -> None:
        """One model file or version, staged beside its place in the mirror and swapped in."""
        target = self.mirror / entry
        target.parent.mkdir(parents=True, exist_ok=True)
        prefix = temp_prefix(target.parent, f".{target.name}.", ".partial")
        staging = Path(tempfile.mkdtemp(prefix=prefix, suffix=".partial", dir=target.parent))
        try:
            staged = staging / target.name
            for name in objects:
                local = staged / Path(name).relative_to(entry) if name != entry else staged
                local.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(f"{self.root}/{self._remote_name(name)}", str(local))
            replace_path(staged, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _remote_name(self, name: str) -> str:
        """Where a mirrored name lives in the bucket (without the model name a model folder lacks)."""
        return name.split("/", 1)[1] if self.model_name else name

    def close(self) -> None:
        shutil.rmtree(self.mirror, ignore_errors=True)


def _served(parts: list[str]) -> bool:
    """Whether an object is one the server reads: ``<model>/<version>/...``, ``<model>/<version>.zip``,
    ``<model>/model.yaml`` or ``routing.yaml`` (not other objects, hidden names or ``..``)."""
    hidden = any(p in ("", ".", "..") or p.startswith(".") for p in parts)
    if len(parts) < 2 or not MODEL_NAME.match(parts[0]) or hidden:
        return False
    entry = parts[1]
    if len(parts) > 2:
        return entry.isascii() and entry.isdigit()
    return entry in ("model.yaml", "routing.yaml") or (
        entry.endswith(".zip") and entry[:-4].isascii() and entry[:-4].isdigit()
    )


def _version_tag(info: dict[str, Any]) -> str:
    """What changes when an object is rewritten: its ETag (S3), md5/etag (GCS), else its time."""
    for key in ("ETag", "etag", "md5Hash", "LastModified", "updated", "mtime"):
        if info.get(key):
            return str(info[key])
    return ""
