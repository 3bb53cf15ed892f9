"""``deploy verify SITE``: a web bundle proved in a real browser.

Integrity first (web.json's checksums, then the inner package's), then the site is served on
127.0.0.1 with the headers its web.json asks for and opened in headless Chromium; the page runs
every reference sample on every model and backend, and its outputs are judged here with the
package's own tolerances and comparison code. Nothing is called verified that did not run in the
page: a backend the browser does not offer is reported as skipped, with what the browser said."""

from __future__ import annotations

import base64
import statistics
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import InputError, PackageError, RuntimeFailure, ValidationError
from unideploy.package import Package
from unideploy.package.bundled import check_listed_files
from unideploy.package.files import extract_zip, read_format_document, resolve_inside, scratch_dir
from unideploy.package.manifest import ValidationRecord
from unideploy.validation import Samples, failure_text, validate_like
from unideploy.web.browser import chromium, served
from unideploy.web.bundle import AGAIN, WEB_FORMAT, WEB_MANIFEST, WEB_VERSION

PAGE_TIMEOUT_MS = 120_000  # loading the page (the runtime's WebAssembly compiles here)
CHECK_TIMEOUT_MS = 300_000  # one model on one backend: load, every sample, the timed runs


@dataclass
class BrowserCheck:
    """One model variant on one backend, as it ran in the page."""

    artifact: str
    backend: str
    status: str  # "passed", "failed" or "skipped"
    reason: str | None = None
    record: ValidationRecord | None = None
    load_ms: float | None = None
    latency_ms: float | None = None  # median of the timed runs
    latency_runs: int | None = None
    latency_batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        found = {k: v for k, v in self.__dict__.items() if k != "record"}
        return {**found, **({"validation": self.record} if self.record else {})}


@dataclass
class WebReport:
    browser: str
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend -> {ok, detail}
    checks: list[BrowserCheck] = field(default_factory=list)
    screenshot: str | None = None

    @property
    def failed(self) -> list[str]:
        return [f"{c.artifact} on {c.backend}" for c in self.checks if c.status == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "integrity": "passed",
            "browser": self.browser,
            "backends": self.backends,
            "checks": [c.to_dict() for c in self.checks],
            "screenshot": self.screenshot,
        }


def is_web_bundle(path: str | Path) -> bool:
    path = Path(path)
    if path.is_dir():
        return (path / WEB_MANIFEST).is_file()
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return WEB_MANIFEST in zf.namelist()


@contextmanager
def _site_root(path: Path) -> Iterator[Path]:
    if path.is_dir():
        yield path
        return
    with scratch_dir("unideploy-web-") as tmp:
        extract_zip(path, Path(tmp), AGAIN)
        yield Path(tmp)


def verify_web_bundle(
    path: str | Path,
    backends: list[str] | None = None,
    software_webgpu: bool = False,
    repeats: int = 20,
    screenshot: str | Path | None = None,
) -> WebReport:
    """Integrity, then every model on every backend (default: those of the site's runtime build)
    in headless Chromium, judged against the package's reference outputs."""
    with _site_root(Path(path)) as root:
        document = read_format_document(root / WEB_MANIFEST, WEB_FORMAT, WEB_VERSION, "web bundle", AGAIN)
        try:
            package_root = resolve_inside(root, document["package"])
            check_listed_files(root, document["files"], document["package"], WEB_MANIFEST, AGAIN)
            headers, types = document["headers"], document["content_types"]
            offered = document["runtime"]["backends"]
        except (KeyError, TypeError) as exc:
            raise PackageError(f"{WEB_MANIFEST} is malformed ({type(exc).__name__}: {exc})", AGAIN) from exc
        if missing := [b for b in backends or () if b not in offered]:
            raise InputError(
                f"the site's runtime build has no {', '.join(missing)} backend (it has {', '.join(offered)})",
                "build it again with 'deploy bundle --platform web --backends wasm,webgpu', or check another backend",
            )
        wanted = [b for b in offered if not backends or b in backends]
        with (
            Package.open(package_root) as package,
            served(root, headers, types) as url,
            chromium(software_webgpu) as browser,
        ):
            report = WebReport(f"Chromium {browser.version}")
            pairs = package.reference_pairs()
            page = _open(browser, url + "index.html?auto=0", "ready")
            for backend in wanted:
                report.backends[backend] = page.evaluate("(b) => unideploy.backendInfo(b)", backend)
                for artifact in package.manifest.artifacts:
                    why = page.evaluate("([v, b]) => unideploy.unsupported(v, b)", [artifact.id, backend])
                    if why:
                        report.checks.append(BrowserCheck(artifact.id, backend, "skipped", why))
                        continue
                    report.checks.append(_check(page, package, pairs, artifact.id, backend, repeats))
            page.close()
            if screenshot is not None:
                shown = _open(browser, url + "index.html", "done")
                shown.screenshot(path=str(screenshot), full_page=True)
                report.screenshot = str(screenshot)
        return report


def _open(browser: Any, url: str, state: str) -> Any:
    """A page at ``url`` once its body says ``state``; what went wrong in it when it never does."""
    from playwright.sync_api import Error

    page = browser.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.goto(url)
    try:
        page.wait_for_function(f"document.body.dataset.state === '{state}'", timeout=PAGE_TIMEOUT_MS)
    except Error as exc:
        said = "; ".join(problems[-3:]) or str(exc).splitlines()[0]
        raise RuntimeFailure(f"the site's page did not start in Chromium: {said}", AGAIN) from exc
    return page


def _check(page: Any, package: Package, pairs: Samples, artifact: str, backend: str, repeats: int) -> BrowserCheck:
    """Run one variant in the page and judge its outputs here, as ``deploy verify`` judges any artifact."""
    from playwright.sync_api import Error

    try:
        result = page.evaluate(
            """([variant, backend, repeats, ms]) => Promise.race([
                unideploy.check(variant, backend, repeats),
                new Promise((_, reject) => setTimeout(() => reject(new Error(`no answer in ${ms} ms`)), ms)),
            ])""",
            [artifact, backend, repeats, CHECK_TIMEOUT_MS],
        )
    except Error as exc:
        said = str(exc).removeprefix("Page.evaluate: ").splitlines()[0]
        return BrowserCheck(artifact, backend, "failed", f"did not run in the page: {said}")
    outputs = {id(inputs): _arrays(found) for (inputs, _), found in zip(pairs, result["outputs"], strict=True)}
    try:  # the artifact in the browser's runtime, held to what it was held to when made
        record = validate_like(
            package.manifest, artifact, lambda inputs: outputs[id(inputs)], pairs, package.manifest.source["framework"]
        )
    # an output of another shape, or missing: the page computed something else
    except (ValidationError, KeyError) as exc:
        return BrowserCheck(artifact, backend, "failed", f"{type(exc).__name__}: {exc}")
    return BrowserCheck(
        artifact,
        backend,
        "passed" if record["passed"] else "failed",
        None if record["passed"] else failure_text(record),
        record,
        result["load_ms"],
        statistics.median(result["latency_ms"]),
        len(result["latency_ms"]),
        result["latency_batch"],
    )


def _arrays(outputs: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """The page's outputs (raw little-endian bytes, base64) as arrays."""
    return {
        name: np.frombuffer(base64.b64decode(t["base64"]), dtype=np.dtype(t["dtype"]).newbyteorder("<")).reshape(
            t["shape"]
        )
        for name, t in outputs.items()
    }
