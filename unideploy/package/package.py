"""Opening a package: the one object every stage after export receives.

Opening *is* verifying: the schema, every checksum and size, and that no path leaves the package.
A package that opens can be trusted to be what its exporter wrote.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import InputError, PackageError
from unideploy.package.files import all_files, digest_path, extract_zip, listed_files, resolve_inside, temp_prefix
from unideploy.package.manifest import MANIFEST_NAME, SIGNATURE_NAME, Artifact, Manifest, SampleSet


@dataclass
class ReferenceSample:
    """Inputs and the source framework's outputs for one stored batch."""

    batch_size: int
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


class Package:
    def __init__(self, root: Path, manifest: Manifest, origin: Path, tempdir: Path | None = None) -> None:
        self.root = root
        self.manifest = manifest
        self.origin = origin  # what the user named: a directory or a .zip
        self._tempdir = tempdir

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> Package:
        origin = Path(path)
        if not origin.exists():
            raise InputError(f"package '{origin}' does not exist")
        if origin.is_dir():
            return cls._open_root(origin, origin, None)
        if zipfile.is_zipfile(origin):
            tempdir = Path(tempfile.mkdtemp(prefix=temp_prefix(Path(tempfile.gettempdir()), "unideploy-pkg-", "")))
            try:
                root = _extract_zip(origin, tempdir)
                return cls._open_root(root, origin, tempdir)
            except BaseException:
                shutil.rmtree(tempdir, ignore_errors=True)
                raise
        raise _neither(origin)

    @classmethod
    def _open_root(cls, root: Path, origin: Path, tempdir: Path | None) -> Package:
        package = cls(root, _manifest_in(root, origin), origin, tempdir)
        package.verify_integrity()
        return package

    def verify_integrity(self) -> None:
        """Check every listed file's presence, size and sha256, and refuse unlisted files."""
        m = self.manifest
        entries: list[tuple[str, str, int | None]] = []
        kept = m.source.get("path")
        if kept:
            entries.append((kept, m.source["sha256"], m.source.get("size")))
        entries += [(a.path, a.sha256, a.size) for a in m.artifacts]
        entries += [(f["path"], f["sha256"], f["size"]) for a in m.artifacts for f in a.files or ()]
        entries += [(s.path, s.sha256, s.size) for s in m.samples]
        accounted = {MANIFEST_NAME, SIGNATURE_NAME}  # the signature is checked by verify_signature
        present = all_files(self.root)  # files, and every link (to a file or a directory)
        for relpath in sorted(present):
            if (self.root / relpath).is_symlink():  # even one pointing inside: it could be swapped
                resolve_inside(self.root, relpath)  # one pointing outside is named as such
                raise PackageError(
                    f"package file '{relpath}' is a symbolic link", "packages may not contain links; export it again"
                )
        for relpath, sha256, size in entries:
            path = resolve_inside(self.root, relpath)
            if not path.exists():
                raise PackageError(f"package file '{relpath}' is missing", "the package is incomplete; export it again")
            actual_sha, actual_size = digest_path(path)
            if size is not None and actual_size != size:
                raise PackageError(
                    f"package file '{relpath}' has {actual_size} bytes, the manifest says {size} "
                    "(truncated or modified)",
                    "the package is corrupt; export it again",
                )
            if actual_sha != sha256:
                raise PackageError(
                    f"checksum mismatch for package file '{relpath}' (modified after export)",
                    "the package is corrupt or tampered with; export it again",
                )
            accounted |= listed_files(self.root, relpath)
        for name in sorted(present - accounted):
            raise PackageError(
                f"package contains '{name}', which the manifest does not list",
                "a package must hold only what its manifest checksums; remove the file or re-export",
            )

    # -- access ------------------------------------------------------------------------------
    def path_of(self, artifact: Artifact | str) -> Path:
        if isinstance(artifact, str):
            artifact = self.manifest.artifact(artifact)
        return resolve_inside(self.root, artifact.path)

    def reference_samples(self) -> list[ReferenceSample]:
        return [self._load_samples(s) for s in self.manifest.samples]

    def reference_pairs(self) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
        """(inputs, source outputs) per stored sample: what every artifact is validated against."""
        return [(s.inputs, s.outputs) for s in self.reference_samples()]

    def _load_samples(self, sample_set: SampleSet) -> ReferenceSample:
        inputs: dict[str, np.ndarray] = {}
        outputs: dict[str, np.ndarray] = {}
        with np.load(resolve_inside(self.root, sample_set.path), allow_pickle=False) as data:
            for key in data.files:
                kind, _, name = key.partition("/")
                (inputs if kind == "inputs" else outputs)[name] = data[key]
        return ReferenceSample(sample_set.batch_size, inputs, outputs)

    def close(self) -> None:
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def __enter__(self) -> Package:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Package({self.manifest.name}:{self.manifest.version} at {self.origin})"


def samples_to_npz_dict(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**{f"inputs/{k}": v for k, v in inputs.items()}, **{f"outputs/{k}": v for k, v in outputs.items()}}


def read_manifest(path: str | Path) -> Manifest:
    """The manifest of the package at ``path`` (a directory or a .zip), its files neither checked
    nor unpacked: for deciding how to deploy a package (whether its model keeps state between
    calls) before the processes that will serve it open it. Whatever runs or trusts the package
    opens it with ``Package.open``, which checks every file."""
    origin = Path(path)
    if origin.is_dir():
        return _manifest_in(origin, origin)
    if not zipfile.is_zipfile(origin):
        raise _neither(origin)
    try:
        with zipfile.ZipFile(origin) as zf:
            root = _zip_root(zf.namelist())
            if root is None:
                raise _not_a_package(origin)
            data = zf.read(f"{root}{MANIFEST_NAME}")
    except zipfile.BadZipFile as exc:
        raise PackageError(f"zip '{origin}' is broken: {exc}", "export the package again") from exc
    return _parsed(data, origin)


def _zip_root(names: list[str]) -> str | None:
    """Where a zipped package's root lies among the archive's member names: its top level ("") or
    its single folder ("folder/", zipped with its folder); None without a manifest in either."""
    if MANIFEST_NAME in names:
        return ""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and f"{next(iter(tops))}/{MANIFEST_NAME}" in names:
        return f"{next(iter(tops))}/"
    return None


def _extract_zip(archive: Path, dest: Path) -> Path:
    """Extract safely; the package root is the archive's top level or its single folder."""
    root = _zip_root(extract_zip(archive, dest, "export the package again"))
    return dest / root if root else dest


def _manifest_in(root: Path, origin: Path) -> Manifest:
    """The manifest at a package's root (a directory, or where ``origin``, a zip, was unpacked)."""
    if not (root / MANIFEST_NAME).is_file():
        raise _not_a_package(origin)
    return _parsed((root / MANIFEST_NAME).read_bytes(), origin)


def _parsed(data: bytes, origin: Path) -> Manifest:
    try:
        return Manifest.from_json(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PackageError(f"{MANIFEST_NAME} in '{origin}' is not UTF-8 text") from exc


def _neither(origin: Path) -> PackageError:
    return PackageError(
        f"'{origin}' is neither a package directory nor a zip archive",
        "pass the directory or .zip that 'deploy export' wrote",
    )


def _not_a_package(origin: Path) -> PackageError:
    return PackageError(
        f"'{origin}' has no {MANIFEST_NAME}, so it is not a unideploy package",
        "create one with 'deploy export SRC -o PKG'",
    )
