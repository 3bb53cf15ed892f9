"""Checksums, safe paths and zip archives for package (and bundle) contents."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from unideploy.errors import PackageError

_CHUNK = 1 << 20
# A zip whose members claim more than this is refused before extraction (zip bombs).
MAX_UNPACKED_BYTES = 16 * 1024**3
MAX_MEMBERS = 10_000  # packages hold tens of files (a SavedModel directory included)
# weights compress little (pruned ones about 4x): a zip unpacking past 1 GiB at over 100x its size is a bomb
MAX_RATIO, BOMB_MIN_BYTES = 100, 1024**3


def _hash_file(path: Path, digest: hashlib._Hash) -> int:
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


def read_format_document(path: Path, fmt: str, version: int, what: str, again: str) -> dict[str, Any]:
    """One of unideploy's JSON documents (an engine recipe, a bundle manifest): readable, of format
    ``fmt``, at the version this unideploy reads. ``what`` names it for people ("TensorRT recipe"),
    ``again`` is how to make it anew ("export it again")."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackageError(f"{what} '{path.name}' cannot be read: {exc}", f"the file is damaged; {again}") from exc
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise PackageError(f"'{path.name}' is not a unideploy {what}", again)
    if data.get("format_version") != version:
        raise PackageError(
            f"{what} format version {data.get('format_version')!r} is not supported "
            f"(this unideploy reads version {version})",
            f"upgrade unideploy, or {again}",
        )
    return data


def resolve_inside(root: Path, relpath: str) -> Path:
    """Resolve ``relpath`` under ``root``, refusing anything that lands outside (``..``, links)."""
    candidate = (root / relpath).resolve()
    real_root = root.resolve()
    if candidate != real_root and real_root not in candidate.parents:
        raise PackageError(
            f"path '{relpath}' escapes the package", "the package is malformed or malicious; do not use it"
        )
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


def temp_prefix(parent: Path, prefix: str, suffix: str) -> str:
    """The name prefix for a temporary file or directory of this process in ``parent`` (it carries
    the process id), after removing those that processes no longer running left there: a kill -9
    skips every cleanup, and staging folders or extracted zips would pile up."""
    owned = re.compile(re.escape(prefix) + r"(\d+)-.*" + re.escape(suffix) + r"\Z")
    for entry in map(Path, glob.glob(glob.escape(str(parent / prefix)) + "*")):
        found = owned.match(entry.name)
        if found and not _running(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    return f"{prefix}{os.getpid()}-"


def scratch_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A scratch folder in the system's temp dir named for this process (``unideploy-export-PID-...``),
    after removing those of ``prefix`` that processes no longer running left there: an export or
    optimization killed mid-way (kill -9, the OOM killer) left them behind for good."""
    return tempfile.TemporaryDirectory(prefix=temp_prefix(Path(tempfile.gettempdir()), prefix, ""))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or an id no process can have: leave it be)
    return True


RENAME_EXCHANGE = 2  # renameat2(2) flag: swap two existing paths in one step (Linux 3.15+)
AT_FDCWD = -100


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically where the kernel and filesystem can (Linux's
    ``renameat2(RENAME_EXCHANGE)``; Python has no call for it); False where they cannot, and the
    caller falls back to two renames."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28 (macOS, musl, Windows)
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # a kernel or filesystem without it
        return False
    raise OSError(code, os.strerror(code), str(b))


def replace_path(staged: Path, target: Path) -> None:
    """Put ``staged`` (a file or directory) where ``target`` is, on the same filesystem. An existing
    target of the same kind is swapped in one step where the kernel can, so readers never find the
    path missing; elsewhere it is moved aside (``<stem>.old<suffix>`` beside ``staged``, a name the
    caller's stale-staging cleanup covers) just before ``staged`` is renamed in, then removed."""
    if target.exists() and staged.is_dir() == target.is_dir() and exchange_paths(staged, target):
        old = staged  # the swap left the previous target there
    else:
        old = None
        if target.exists():  # two renames: for an instant the path is missing
            old = staged.with_name(f"{staged.stem}.old{staged.suffix}")
            os.rename(target, old)
        os.rename(staged, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def staging_for(dest: Path) -> Path:
    """A new folder beside ``dest`` to build it in (same filesystem, so :func:`publish` renames)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    prefix = temp_prefix(dest.parent, f".{dest.name}.", ".partial")
    return Path(tempfile.mkdtemp(prefix=prefix, suffix=".partial", dir=dest.parent))


def publish(staging: Path, dest: Path) -> None:
    """Put a finished staging folder at ``dest`` in one step: zipped when ``dest`` ends in .zip,
    else renamed into place; a reader never finds it half-written."""
    if dest.suffix.lower() == ".zip":
        write_zip(staging, dest)
        shutil.rmtree(staging, ignore_errors=True)
    else:
        replace_path(staging, dest)


def write_zip(directory: Path, dest: Path) -> None:
    """Zip every file under ``directory`` into ``dest``: written beside it, then renamed."""
    fd, tmp_zip = tempfile.mkstemp(
        prefix=temp_prefix(dest.parent, f".{dest.name}.", ".partial"), suffix=".partial", dir=dest.parent
    )
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp_zip, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for file in sorted(p for p in directory.rglob("*") if p.is_file()):
                zf.write(file, file.relative_to(directory).as_posix())
        os.replace(tmp_zip, dest)
    except BaseException:
        Path(tmp_zip).unlink(missing_ok=True)
        raise


def extract_zip(archive: Path, dest: Path, remedy: str) -> list[str]:
    """Extract after checking every member: no absolute or ``..`` paths, no links, bounded size; the
    members' names, in the archive's order."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            total, seen = 0, set()
            for info in members:
                name = info.filename
                if name in seen:  # extraction would keep the last one, unseen by any check of the first
                    raise PackageError(
                        f"zip has two members named '{name}'", "the archive is malicious or broken; do not use it"
                    )
                seen.add(name)
                parts = PurePosixPath(name.replace("\\", "/")).parts
                if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                    raise PackageError(
                        f"zip member '{name}' would be written outside the package (zip-slip)",
                        "the archive is malicious or broken; do not use it",
                    )
                if stat.S_ISLNK(info.external_attr >> 16):
                    raise PackageError(f"zip member '{name}' is a symbolic link", "packages may not contain links")
                total += info.file_size
            if total > MAX_UNPACKED_BYTES:
                raise PackageError(f"zip '{archive}' would unpack to {total} bytes, over the limit")
            if len(members) > MAX_MEMBERS:
                raise PackageError(
                    f"zip '{archive}' has {len(members)} members; a package has far fewer (at most {MAX_MEMBERS})",
                    "the archive is malicious or broken; do not use it",
                )
            if total > BOMB_MIN_BYTES and total > MAX_RATIO * archive.stat().st_size:
                raise PackageError(
                    f"zip '{archive}' would unpack to {total} bytes, {total // archive.stat().st_size}x "
                    "its size (a zip bomb?)",
                    "the archive is malicious or broken; do not use it",
                )
            bad = zf.testzip()
            if bad is not None:
                raise PackageError(f"zip member '{bad}' is corrupt (CRC mismatch)", f"the archive is damaged; {remedy}")
            zf.extractall(dest)
            return [info.filename for info in members]
    except zipfile.BadZipFile as exc:
        raise PackageError(f"'{archive}' is a damaged zip archive: {exc}", remedy) from exc
    except (EOFError, OSError) as exc:
        raise PackageError(f"'{archive}' cannot be read as a zip archive: {exc}", remedy) from exc
