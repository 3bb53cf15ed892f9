"""The package format: the object that export, optimize, run, serve and bundle pass along."""

from unideploy.package.manifest import Artifact, Manifest, PlannedArtifact, SampleSet
from unideploy.package.package import Package, ReferenceSample
from unideploy.package.writer import PackageWriter

__all__ = ["Artifact", "Manifest", "Package", "PackageWriter", "PlannedArtifact", "ReferenceSample", "SampleSet"]
