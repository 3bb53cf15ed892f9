"""What every bundle (``deploy bundle`` for Android, iOS and the web) shares: the models stay a
unideploy package inside it, so ``deploy verify`` proves them with the same code as any package,
and every file beside that package is listed with its checksum in the bundle's own document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unideploy.errors import InputError, PackageError
from unideploy.package.files import all_files, digest_path, resolve_inside
from unideploy.package.manifest import Artifact, Manifest
from unideploy.package.package import Package
from unideploy.package.writer import PackageWriter


def write_model_package(package: Package, chosen: list[Artifact], dest: Path) -> None:
    """A package with only ``chosen`` and the reference samples (the source model stays out)."""
    manifest = package.manifest.copy()
    ids = {a.id for a in chosen}
    with PackageWriter(dest) as writer:
        for sample in manifest.samples:
            writer.add_file(resolve_inside(package.root, sample.path), sample.path)
        manifest.artifacts = []
        for artifact in chosen:
            companions = {f["path"]: resolve_inside(package.root, f["path"]) for f in artifact.files or ()}
            manifest.artifacts.append(writer.add_artifact(package.path_of(artifact), artifact.planned(), companions))
        manifest.validation = {k: v for k, v in manifest.validation.items() if k in ids}
        manifest.source = {**manifest.source, "path": None}
        manifest.source.pop("size", None)
        writer.commit(manifest)


def file_entry(root: Path, relpath: str) -> dict[str, Any]:
    """A bundle document's line for one file: path, sha256, size."""
    sha256, size = digest_path(root / relpath)
    return {"path": relpath, "sha256": sha256, "size": size}


def check_listed_files(root: Path, entries: list[dict[str, Any]], package_dir: str, document: str, again: str) -> None:
    """Every listed file as checksummed, and nothing else outside the inner package (whose own
    manifest checksums it)."""
    listed: set[str] = set()
    for entry in entries:
        file = resolve_inside(root, entry["path"])
        if not file.is_file() or digest_path(file) != (entry["sha256"], entry["size"]):
            raise PackageError(
                f"bundle file '{entry['path']}' is missing or modified (checksum mismatch)",
                f"the bundle is corrupt or tampered with; {again}",
            )
        listed.add(entry["path"])
    for rel in sorted(all_files(root) - listed - {document}):
        if not rel.startswith(f"{package_dir}/"):
            raise PackageError(
                f"bundle contains '{rel}', which {document} does not list",
                f"a bundle must hold only what {document} checksums; {again}",
            )


def read_labels(path: str | Path) -> list[str]:
    """Class labels, one per line in class-index order (blank lines dropped)."""
    try:
        lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read labels '{path}': {exc}", "pass a UTF-8 text file, one label per line") from exc
    lines = [line for line in lines if line]
    if not lines:
        raise InputError(f"labels file '{path}' is empty", "one label per line, in class-index order")
    return lines


def check_labels(labels: list[str], manifest: Manifest) -> None:
    """A labels file must name every class of the first output, no more, no fewer."""
    classes = manifest.signature.outputs[0].shape[-1] if manifest.signature.outputs else None
    if isinstance(classes, int) and classes != len(labels):
        raise InputError(
            f"the labels file has {len(labels)} labels but output "
            f"'{manifest.signature.outputs[0].name}' has {classes} classes",
            "one label per line, in class-index order",
        )
