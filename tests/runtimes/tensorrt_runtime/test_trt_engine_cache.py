"""Engine cache keys and lookups: a plan is loaded only under exactly the key it was built with."""

from __future__ import annotations

import json

import pytest

from unideploy.runtimes.tensorrt.engine_cache import EngineCache, EngineKey, cached_or_built, default_cache_dir
from unideploy.runtimes.tensorrt.profiles import InputProfile

PROFILES = [InputProfile("x", (1, 3), (8, 3), (32, 3))]


def key(**changes) -> EngineKey:
    fields = {
        "onnx_sha256": "a" * 64,
        "precision": "fp16",
        "profiles": PROFILES,
        "gpu": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
        "tensorrt": "10.13.0",
        "workspace_mib": None,
        "calibration_sha256": None,
    }
    fields.update(changes)
    return EngineKey.make(**fields)


def test_every_field_of_the_key_changes_its_digest():
    base = key()
    variants = [
        key(onnx_sha256="b" * 64),
        key(precision="int8"),
        key(gpu="NVIDIA A100-SXM4-80GB"),
        key(compute_capability="8.0"),
        key(tensorrt="10.14.1"),
        key(workspace_mib=1024),
        key(calibration_sha256="c" * 64),
        key(profiles=[InputProfile("x", (1, 3), (8, 3), (64, 3))]),
    ]
    digests = {base.digest} | {v.digest for v in variants}
    assert len(digests) == len(variants) + 1
    assert key().digest == base.digest  # and it is stable


def test_a_stored_plan_is_a_hit_for_its_own_key_only(tmp_path):
    cache = EngineCache(tmp_path)
    path = cache.store(key(), b"plan-bytes")
    assert path.read_bytes() == b"plan-bytes"
    plan, why = cache.load(key())
    assert plan == b"plan-bytes" and "cache hit" in why
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary files left

    plan, why = cache.load(key(gpu="NVIDIA A100-SXM4-80GB", tensorrt="10.14.1"))
    assert plan is None
    assert "built for another setup" in why
    assert (
        "gpu: 'NVIDIA H100 80GB HBM3' -> 'NVIDIA A100-SXM4-80GB'" in why and "tensorrt: '10.13.0' -> '10.14.1'" in why
    )

    plan, why = cache.load(key(onnx_sha256="d" * 64))
    assert plan is None and "no engine for this model" in why


def test_a_tampered_plan_or_key_file_is_not_loaded(tmp_path):
    cache = EngineCache(tmp_path)
    path = cache.store(key(), b"plan-bytes")
    path.write_bytes(b"plan-bytez")
    plan, why = cache.load(key())
    assert plan is None and "does not match its checksum" in why

    cache.store(key(), b"plan-bytes")
    meta = path.with_suffix(".json")
    data = json.loads(meta.read_text())
    data["gpu"] = "something else"
    meta.write_text(json.dumps(data))
    plan, why = cache.load(key())
    assert plan is None and "does not match: gpu" in why

    meta.write_text("{not json")
    assert cache.load(key())[0] is None


def test_cached_or_built_prefers_shipped_then_cached_then_builds_and_says_why(tmp_path):
    shipped, local = EngineCache(tmp_path / "package"), EngineCache(tmp_path / "cache")
    shipped.store(key(gpu="NVIDIA A100-SXM4-80GB"), b"a100-plan")  # built at export on another GPU
    reasons = []

    def build(why: str) -> bytes:
        reasons.append(why)
        return b"h100-plan"

    plan, said = cached_or_built(key(), shipped, local, build)
    assert plan == b"h100-plan" and len(reasons) == 1
    assert "gpu: 'NVIDIA A100-SXM4-80GB' -> 'NVIDIA H100 80GB HBM3'" in reasons[0]
    assert said.startswith("built a new engine") and str(local.directory) in said

    plan, said = cached_or_built(key(), shipped, local, build)
    assert plan == b"h100-plan" and "cache hit" in said and len(reasons) == 1  # not rebuilt

    plan, said = cached_or_built(key(gpu="NVIDIA A100-SXM4-80GB"), shipped, local, build)
    assert plan == b"a100-plan" and str(shipped.directory) in said


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("UNIDEPLOY_ENGINE_CACHE", str(tmp_path / "engines"))
    assert default_cache_dir() == tmp_path / "engines"
    monkeypatch.delenv("UNIDEPLOY_ENGINE_CACHE")
    assert default_cache_dir().parts[-3:] == (".cache", "unideploy", "engines")


def test_a_failed_write_leaves_no_entry(tmp_path, monkeypatch):
    import unideploy.runtimes.tensorrt.engine_cache as engine_cache

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(engine_cache.os, "replace", fail)
    with pytest.raises(OSError):
        EngineCache(tmp_path).store(key(), b"plan")
    assert list(tmp_path.iterdir()) == []
