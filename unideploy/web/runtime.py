"""ONNX Runtime Web, vendored into each site at build time (a page never fetches it from a CDN).

npm fetches the pinned release once per machine into a cache (npm checks the registry's integrity
hash); a bundle then copies only the files its backends need: the JavaScript entry, the Emscripten
loader it imports and the WebAssembly binary."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from unideploy.errors import InputError, MissingDependencyError
from unideploy.package.files import scratch_dir
from unideploy.registry import Availability

ORT_WEB_VERSION = "1.30.0"
NPM_INSTALL = "apt-get install nodejs npm (Debian/Ubuntu), or Node.js 18+ from nodejs.org"


@dataclass(frozen=True)
class Build:
    """One of ONNX Runtime Web's builds: its entry module, and what that module loads at run time."""

    backends: tuple[str, ...]
    entry: str
    loader: str
    wasm: str

    @property
    def files(self) -> tuple[str, ...]:
        return (self.entry, self.loader, self.wasm)


# The default build (JSEP) runs WebAssembly and WebGPU; the WebAssembly-only build is half the bytes.
BUILDS = {
    "wasm,webgpu": Build(
        ("wasm", "webgpu"), "ort.min.mjs", "ort-wasm-simd-threaded.jsep.mjs", "ort-wasm-simd-threaded.jsep.wasm"
    ),
    "wasm": Build(("wasm",), "ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm"),
}


def build_for(backends: str) -> Build:
    try:
        return BUILDS[backends]
    except KeyError:
        raise InputError(f"unknown web backends '{backends}'", f"use one of: {', '.join(BUILDS)}") from None


def npm_availability() -> Availability:
    """npm is needed once per runtime version, to fill the cache; a filled cache needs nothing."""
    if _cached(ORT_WEB_VERSION).is_dir():
        return Availability(True, f"onnxruntime-web {ORT_WEB_VERSION} cached in {_cached(ORT_WEB_VERSION)}")
    npm = shutil.which("npm")
    if npm is None:
        return Availability(
            False, f"npm not found (needed once, to fetch onnxruntime-web {ORT_WEB_VERSION})", NPM_INSTALL
        )
    return Availability(True, f"npm {_version(npm)}; onnxruntime-web {ORT_WEB_VERSION} is fetched on first use")


def runtime_dir(version: str = ORT_WEB_VERSION) -> Path:
    """The cached ``dist/`` of onnxruntime-web ``version``, fetched with npm when it is not there yet."""
    cached = _cached(version)
    if cached.is_dir():
        return cached
    npm = shutil.which("npm")
    if npm is None:
        raise MissingDependencyError(
            f"npm is needed once to fetch onnxruntime-web {version} for web bundles", NPM_INSTALL
        )
    cached.parent.mkdir(parents=True, exist_ok=True)
    with scratch_dir("unideploy-npm-") as tmp:
        done = subprocess.run(
            [
                npm,
                "install",
                "--prefix",
                tmp,
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                f"onnxruntime-web@{version}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        dist = Path(tmp) / "node_modules" / "onnxruntime-web" / "dist"
        if done.returncode != 0 or not dist.is_dir():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise MissingDependencyError(
                f"npm could not fetch onnxruntime-web {version}: {' | '.join(tail)}",
                "check that the npm registry is reachable (npm config get registry), then build again",
            )
        staged = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        for build in BUILDS.values():
            for name in build.files:
                shutil.copyfile(dist / name, staged / name)
        shutil.copyfile(dist.parent / "package.json", staged / "package.json")  # version and licence (MIT)
        try:
            os.replace(staged, cached)
        except OSError:  # a concurrent fetch of the same version got there first
            shutil.rmtree(staged, ignore_errors=True)
            if not cached.is_dir():
                raise
    return cached


def _cached(version: str) -> Path:
    """``$UNIDEPLOY_WEB_CACHE``, else ``~/.cache/unideploy/web``; one folder per version."""
    env = os.environ.get("UNIDEPLOY_WEB_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "unideploy" / "web"
    return root / f"onnxruntime-web-{version}"


def _version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "(version unknown)"
