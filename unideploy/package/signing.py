"""Signed packages: who made a package, checked before it is served.

A package's checksums catch a file changed after export; they cannot say who wrote the manifest
that lists them, so whoever can write a package can rewrite both. A signature can: ``deploy
sign`` signs every file of the package (manifest, source, artifacts, recipes, reference samples)
with the OpenSSF model-signing library, as a Sigstore bundle over each file's SHA-256 stored as
``signature.sig`` at the package root, with an elliptic-curve private key or a key and its
certificate. ``deploy verify --trusted-key`` / ``--trusted-chain`` and ``deploy serve
--require-signed`` refuse a package whose signature is missing, made by another key, or does not
match its files. Everything is offline: no Sigstore service is contacted.

A package changed by a later stage (``deploy optimize``, ``--target edge``) is a new package: the
old signature does not carry over, and it must be signed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from unideploy.errors import InputError, MissingDependencyError, PackageError, first_line
from unideploy.package.files import write_zip
from unideploy.package.manifest import SIGNATURE_NAME
from unideploy.package.package import Package
from unideploy.registry import ExtraModules


@dataclass(frozen=True)
class TrustedSigners:
    """What a signature must chain to: a public key, or a certificate chain (PEM files)."""

    key: Path | None = None
    chain: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if (self.key is None) == (not self.chain):
            raise InputError(
                "trust either a public key or a certificate chain",
                "pass --trusted-key PUBLIC.pem, or --trusted-chain CA.pem (repeatable)",
            )
        for path in (self.key, *self.chain):
            if path is not None and not Path(path).is_file():
                raise InputError(f"trusted key or certificate '{path}' does not exist")
        # checked here, where trust is declared: a server would otherwise start and refuse every version
        _require_library("checking signatures")


SIGNING = ExtraModules("sign", ("model_signing",))


def _require_library(action: str) -> None:
    """Stop, naming the sign extra, when the OpenSSF model-signing library is not installed."""
    found = SIGNING.availability()
    if not found.ok:
        raise MissingDependencyError(f"{action} needs the sign extra: {found.detail}", found.fix)


def _library(action: str):
    _require_library(action)
    from model_signing import hashing, signing, verifying

    return hashing, signing, verifying


def _hashing_config(hashing):
    # every file but the signature itself; links are refused (packages never hold any)
    return (
        hashing.Config()
        .use_file_serialization(allow_symlinks=False)
        .set_ignored_paths(paths=[SIGNATURE_NAME], ignore_git_paths=False)
    )


def sign_package(
    path: str | Path,
    key: str | Path,
    certificate: str | Path | None = None,
    chain: Sequence[str | Path] = (),
    password: str | None = None,
) -> Path:
    """Sign the package at ``path`` (a directory or a zip) in place; return the signature's path
    inside it. The package is checked first: a corrupt package is never signed."""
    hashing, signing, _ = _library("signing packages")
    path, key = Path(path), Path(key)
    if not key.is_file():
        raise InputError(f"private key '{key}' does not exist")
    config = signing.Config().set_hashing_config(_hashing_config(hashing))
    try:
        if certificate is not None:
            config.use_certificate_signer(
                private_key=key, signing_certificate=Path(certificate), certificate_chain=[Path(c) for c in chain]
            )
        else:
            config.use_elliptic_key_signer(private_key=key, password=password)
    except (ValueError, TypeError, OSError) as exc:
        raise InputError(
            f"cannot sign with '{key}': {first_line(exc)}",
            "use an elliptic-curve private key in PEM (and its certificate, if any)",
        ) from exc
    with Package.open(path) as package:
        partial = package.root.parent / f".{package.root.name}.{SIGNATURE_NAME}.partial"  # outside the package
        try:
            config.sign(package.root, partial)
            partial.replace(package.root / SIGNATURE_NAME)
        finally:
            partial.unlink(missing_ok=True)
        if package.root != path:  # a zip: the signed tree becomes the new archive, atomically
            write_zip(package.root, path)
    return path / SIGNATURE_NAME if path.is_dir() else path


def verify_signature(package: Package, trusted: TrustedSigners) -> None:
    """Raise PackageError unless the package is signed by ``trusted`` and every file matches."""
    hashing, _, verifying = _library("checking signatures")
    signature = package.root / SIGNATURE_NAME
    if not signature.is_file():
        raise PackageError(f"package '{package.origin}' is not signed", "sign it with 'deploy sign PKG --key KEY'")
    config = verifying.Config().set_hashing_config(_hashing_config(hashing))
    if trusted.key is not None:
        config.use_elliptic_key_verifier(public_key=trusted.key)
    else:
        config.use_certificate_verifier(certificate_chain=list(trusted.chain))
    try:
        config.verify(package.root, signature)
    except Exception as exc:  # the library raises ValueError and its crypto back ends their own errors
        raise PackageError(
            f"package '{package.origin}' fails its signature check: {first_line(exc)}",
            "it was signed by another key, or changed after signing; sign it again if you made the change",
        ) from exc
