from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import unideploy
from unideploy.web.browser import browser_availability
from unideploy.web.runtime import npm_availability

_npm = npm_availability()
if not _npm.ok:
    pytest.skip(f"web bundles need npm once: {_npm.detail} ({_npm.fix})", allow_module_level=True)


@pytest.fixture(scope="session")
def browser_here() -> None:
    """Skips a test that opens a browser where none can be (make web-tools installs Chromium)."""
    found = browser_availability()
    if not found.ok:
        pytest.skip(f"verifying a site needs Chromium: {found.detail} ({found.fix}; make web-tools)")


@pytest.fixture(scope="session")
def digits_variants(digits, tmp_path_factory) -> Path:
    """The digits CNN with its fp32 ONNX and the int8 and fp16 variants its guard admitted (the INT8
    kept on a CPU where it runs no faster: the site is what is tested)."""
    package = tmp_path_factory.mktemp("digits-web") / "digits.udp"
    shutil.copytree(digits["package"], package)
    for options in ({"quantize": "int8", "keep_slower": True}, {"quantize": "fp16"}):
        unideploy.optimize(package, calibration=str(digits["data"]), **options).close()
    return package


@pytest.fixture(scope="session")
def digits_site(digits_variants, tmp_path_factory) -> Path:
    from unideploy.web.bundle import build_web_bundle

    folder = tmp_path_factory.mktemp("site")
    labels = folder / "labels.txt"
    labels.write_text("".join(f"digit {i}\n" for i in range(10)))
    build_web_bundle(digits_variants, folder / "digits-site", labels=labels)
    return folder / "digits-site"
