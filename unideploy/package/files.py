"""Checksums and safe paths for package contents."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from unideploy.errors import PackageError

_CHUNK = 1 << 20


def _hash_file(path: Path, digest: "hashlib._Hash") -> int:
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size


def digest_path(path: Path) -> tuple[str, int]:
    """sha256 and byte size of a file, or of a directory tree (relative names and contents).

    Directory artifacts exist (SavedModel), so one digest covers both shapes.
    """
    digest = hashlib.sha256()
    if path.is_file():
        size = _hash_file(path, digest)
        return digest.hexdigest(), size
    size = 0
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        size += _hash_file(file, digest)
    return digest.hexdigest(), size


def resolve_inside(root: Path, relpath: str) -> Path:
    """Resolve ``relpath`` under ``root``, refusing anything that lands outside (``..``, links)."""
    candidate = (root / relpath).resolve()
    real_root = root.resolve()
    if candidate != real_root and real_root not in candidate.parents:
        raise PackageError(f"path '{relpath}' escapes the package", "the package is malformed or malicious; do not use it")
    return candidate


def listed_files(root: Path, relpath: str) -> set[str]:
    """Every file a listed entry accounts for (itself, or all files of a listed directory)."""
    path = root / relpath
    if path.is_dir():
        return {p.relative_to(root).as_posix() for p in path.rglob("*") if not p.is_dir()}
    return {Path(relpath).as_posix()}


def all_files(root: Path) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            found.add((Path(dirpath) / name).relative_to(root).as_posix())
    return found
