"""Writing a package atomically.

Everything is staged in a hidden directory beside the destination (same filesystem, so the final
rename is atomic); an exception or Ctrl-C removes the staging area and leaves the destination as
it was. Replacing an existing directory package swaps the two in one step where Linux can, so a
server reading the path never finds it missing. A destination ending in ``.zip`` gets the archive
form, also written then renamed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import TracebackType

import numpy as np

from unideploy.errors import InputError
from unideploy.package.files import digest_path, publish, staging_for
from unideploy.package.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Artifact,
    Manifest,
    OmittedRecord,
    OptimizationRecord,
    PlannedArtifact,
    SampleSet,
    ValidationRecord,
)
from unideploy.package.package import Package, samples_to_npz_dict


def check_destination(dest: Path, overwrite: bool) -> None:
    """Refuse a destination before any work is spent on it."""
    if dest.exists() and not overwrite:
        raise InputError(f"'{dest}' already exists", "choose another -o path or pass --force")
    if dest.exists() and (dest.suffix.lower() == ".zip") == dest.is_dir():
        raise InputError(
            f"'{dest}' exists and is a {'directory' if dest.is_dir() else 'file'}",
            "remove it or choose another -o path",
        )


class PackageWriter:
    def __init__(self, dest: str | Path, overwrite: bool = False) -> None:
        self.dest = Path(dest)
        check_destination(self.dest, overwrite)
        self.staging = staging_for(self.dest)

    # -- staging -----------------------------------------------------------------------------
    def _target(self, relpath: str) -> Path:
        target = self.staging / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def add_file(self, src: str | Path, relpath: str) -> tuple[str, int]:
        """Copy a file or directory into the package; return its sha256 and size."""
        src, target = Path(src), self._target(relpath)
        if src.is_dir():
            shutil.copytree(src, target)
        else:
            shutil.copyfile(src, target)
        return digest_path(target)

    def add_package(self, package: Package) -> Manifest:
        """Start from everything an existing package holds; return its manifest to amend. Not its
        signature: the package written is a new one, to be signed again."""
        for item in package.root.iterdir():
            if item.name not in (MANIFEST_NAME, SIGNATURE_NAME):
                self.add_file(item, item.name)
        return package.manifest.copy()

    def add_artifact(
        self, src: str | Path, planned: PlannedArtifact, companions: dict[str, Path] | None = None
    ) -> Artifact:
        """Add an artifact, and files that ship with it (package path -> file); return its manifest
        entry, checksums included."""
        sha256, size = self.add_file(src, planned.path)
        files = None
        if companions:
            files = []
            for relpath, file in companions.items():
                file_sha256, file_size = self.add_file(file, relpath)
                files.append({"path": relpath, "sha256": file_sha256, "size": file_size})
        return Artifact.written(planned, sha256, size, files)

    def add_samples(
        self,
        relpath: str,
        batch_size: int,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
        origin: str | None = None,
    ) -> SampleSet:
        target = self._target(relpath)
        with open(target, "wb") as fh:
            np.savez_compressed(fh, **samples_to_npz_dict(inputs, outputs))  # type: ignore[arg-type]  # numpy stub: **arrays read as allow_pickle
        sha256, size = digest_path(target)
        return SampleSet(relpath, batch_size, sha256, size, origin)

    # -- finishing ---------------------------------------------------------------------------
    def commit(self, manifest: Manifest) -> Path:
        (self.staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        publish(self.staging, self.dest)
        return self.dest

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> PackageWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()


# (artifact, its file, companion files by package path, its validation record)
AddedArtifact = tuple[PlannedArtifact, Path, dict[str, Path], ValidationRecord]


def extend_package(
    package: Package,
    package_path: str | Path,
    output: str | Path,
    added: list[AddedArtifact],
    overwrite: bool = False,
    first: bool = False,
    omitted: list[OmittedRecord] | None = None,
    optimizations: list[OptimizationRecord] | None = None,
) -> Path:
    """Write ``output``: ``package`` with ``added`` replacing artifacts of the same ids (listed before
    the others when ``first``: artifacts to be preferred where they can run), ``omitted`` saying
    what the stage left out and why, and ``optimizations`` the records of how optimized artifacts
    were made (replacing those of the same artifacts). ``output`` may be the package itself: every
    stage that adds artifacts (optimizers, edge, GPU, Ascend) can update in place."""
    destination = Path(output)
    same = destination.resolve() == Path(package_path).resolve()
    with PackageWriter(destination, overwrite=overwrite or same) as writer:
        updated = writer.add_package(package)
        ids = {artifact.id for artifact, *_ in added}
        kept = [a for a in updated.artifacts if a.id not in ids]
        new = []
        for artifact, path, companions, record in added:
            new.append(writer.add_artifact(path, artifact, companions))
            updated.validation[artifact.id] = record
        updated.artifacts = new + kept if first else kept + new
        if omitted:
            stages = {o["stage"] for o in omitted}
            updated.omitted = [o for o in updated.omitted if o["stage"] not in stages] + omitted
        if optimizations:
            made = {o["artifact"] for o in optimizations}
            updated.optimizations = [o for o in updated.optimizations if o.get("artifact") not in made] + optimizations
        return writer.commit(updated)
