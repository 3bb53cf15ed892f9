"""Signed packages: `deploy sign` covers every file; `deploy verify --trusted-key/--trusted-chain`
and `deploy serve --require-signed` refuse unsigned, wrongly signed and changed packages, and a
refused version leaves the previous one serving."""

from __future__ import annotations

import datetime
import json
import shutil
import zipfile

import numpy as np
import pytest
from console import assert_one_line_error, deploy, without_modules

from unideploy.package.files import digest_path

pytest.importorskip("model_signing", reason="the sign extra is not installed")
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key_pair(folder, name: str) -> tuple:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return key, private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    _, ours, ours_pub = _key_pair(folder, "ours")
    _, theirs, theirs_pub = _key_pair(folder, "theirs")
    return {"private": ours, "public": ours_pub, "other_private": theirs, "other_public": theirs_pub}


def test_signed_package_verifies_and_any_change_is_caught(digits_package, keys, tmp_path):
    assert deploy("sign", digits_package, "--key", keys["private"]).returncode == 0
    assert (digits_package / "signature.sig").is_file()
    checked = deploy("verify", digits_package, "--trusted-key", keys["public"], "--json")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["signature"] == "passed"

    other = deploy("verify", digits_package, "--trusted-key", keys["other_public"])
    assert_one_line_error(other, 2, "fails its signature check")

    # an attacker who can write the package rewrites a sample and the manifest's checksum of it:
    # integrity passes, the signature does not
    manifest = json.loads((digits_package / "manifest.json").read_text())
    sample = manifest["samples"][0]
    with np.load(digits_package / sample["path"]) as data:
        arrays = dict(data.items())
    arrays[next(k for k in arrays if k.startswith("outputs/"))] += 1.0
    np.savez(digits_package / sample["path"], **arrays)
    sample["sha256"], sample["size"] = digest_path(digits_package / sample["path"])
    (digits_package / "manifest.json").write_text(json.dumps(manifest))
    assert deploy("inspect", digits_package).returncode == 0  # consistent as far as checksums go
    assert_one_line_error(
        deploy("verify", digits_package, "--trusted-key", keys["public"]), 2, "fails its signature check"
    )


def test_a_file_that_is_not_a_private_key_is_refused_and_nothing_is_signed(digits_package, keys):
    assert_one_line_error(deploy("sign", digits_package, "--key", keys["public"]), 2, "cannot sign with")
    assert_one_line_error(deploy("sign", digits_package, "--key", digits_package / "nope.pem"), 2, "does not exist")
    assert not (digits_package / "signature.sig").exists()


def test_unsigned_package_is_refused_when_a_signature_is_required(digits_package, keys):
    assert_one_line_error(deploy("verify", digits_package, "--trusted-key", keys["public"]), 2, "is not signed")


def test_without_the_sign_extra_requiring_signatures_stops_before_serving(digits_package, keys, tmp_path, monkeypatch):
    """Not a server that starts and refuses every version: one line naming the extra, before any port opens."""
    monkeypatch.setenv("PYTHONPATH", without_modules(tmp_path / "no-sign", "model_signing"))
    missing = r"checking signatures needs the sign extra: .*model_signing \(pip install 'unideploy\[sign\]'\)"
    assert_one_line_error(deploy("verify", digits_package, "--trusted-key", keys["public"]), 2, missing)
    served = deploy("serve", digits_package, "--require-signed", "--trusted-key", keys["public"], "--http-port", "0")
    assert_one_line_error(served, 2, missing)
    signed = deploy("sign", digits_package, "--key", keys["private"])
    assert_one_line_error(
        signed, 2, r"signing packages needs the sign extra: .*model_signing \(pip install 'unideploy\[sign\]'\)"
    )
    assert not (digits_package / "signature.sig").exists()


def test_zip_package_is_signed_inside_the_archive(digits_package, keys, tmp_path):
    archive = tmp_path / "digits.zip"
    shutil.make_archive(str(archive.with_suffix("")), "zip", digits_package)
    assert deploy("sign", archive, "--key", keys["private"]).returncode == 0
    with zipfile.ZipFile(archive) as zf:
        assert zf.namelist().count("signature.sig") == 1
    assert deploy("verify", archive, "--trusted-key", keys["public"]).returncode == 0
    assert deploy("sign", archive, "--key", keys["private"]).returncode == 0  # signing again replaces it
    assert deploy("verify", archive, "--trusted-key", keys["public"]).returncode == 0


def test_a_package_derived_from_a_signed_one_is_not_signed_by_it(digits_package, digits, keys, tmp_path):
    assert deploy("sign", digits_package, "--key", keys["private"]).returncode == 0
    optimized = deploy(
        "optimize", digits_package, "-o", tmp_path / "fp16", "--quantize", "fp16", "--calibration", digits["data"]
    )
    assert optimized.returncode == 0, optimized.stderr
    assert not (tmp_path / "fp16" / "signature.sig").exists()
    assert_one_line_error(deploy("verify", tmp_path / "fp16", "--trusted-key", keys["public"]), 2, "is not signed")


def _certificates(folder, key) -> tuple:
    """A root CA and a code-signing certificate it issued for ``key``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unideploy test root")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "release signer")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "signer-cert.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    return folder / "ca.pem", folder / "signer-cert.pem"


def test_certificate_signed_package_verifies_against_its_chain(digits_package, tmp_path):
    key, private, _ = _key_pair(tmp_path, "signer")
    ca, certificate = _certificates(tmp_path, key)
    signed = deploy("sign", digits_package, "--key", private, "--certificate", certificate, "--cert-chain", ca)
    assert signed.returncode == 0, signed.stderr
    assert deploy("verify", digits_package, "--trusted-chain", ca).returncode == 0
    (tmp_path / "other").mkdir()
    other_key, _, _ = _key_pair(tmp_path / "other", "signer")
    other_ca, _ = _certificates(tmp_path / "other", other_key)
    assert_one_line_error(deploy("verify", digits_package, "--trusted-chain", other_ca), 2, "fails its signature check")


def test_server_requiring_signatures_keeps_the_signed_version_when_an_unsigned_one_arrives(digits, keys, tmp_path):
    from serving import start_server, stop_server

    repo = tmp_path / "repo"
    shutil.copytree(digits["package"], repo / "digits" / "1")
    assert deploy("sign", repo / "digits" / "1", "--key", keys["private"]).returncode == 0
    server = start_server(repo, tmp_path, "--require-signed", "--trusted-key", str(keys["public"]))
    try:
        shutil.copytree(digits["package"], repo / "digits" / "2")  # unsigned
        with server.client() as http:

            def refused() -> bool:
                index = http.post("/v2/repository/index", json={}).json()
                return any(e["version"] == "2" and "not signed" in e["reason"] for e in index)

            server.wait_for(refused, what="version 2 to be refused")
            assert http.get("/v2/models/digits").json()["versions"] == ["1"]
            with np.load(digits["data"]) as data:
                rows = data["x"][:2]
            body = {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": list(rows.shape), "data": rows.ravel().tolist()}]
            }
            answer = http.post("/v2/models/digits/infer", json=body)
            assert answer.status_code == 200 and answer.json()["model_version"] == "1"
    finally:
        stop_server(server)
