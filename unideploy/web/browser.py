"""A site served on 127.0.0.1 as a host should serve it, and headless Chromium to open it.

Chromium is the system's (Debian's ``chromium``); Playwright drives it over the DevTools protocol
(its own browser download is never used)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unideploy.errors import MissingDependencyError
from unideploy.registry import Availability, ExtraModules

if TYPE_CHECKING:
    from playwright.sync_api import Browser

PLAYWRIGHT = ExtraModules("web", ("playwright",))
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_INSTALL = "apt-get install chromium (Debian/Ubuntu), or set UNIDEPLOY_CHROMIUM to a Chromium or Chrome binary"
# WebGPU is behind this switch in Chromium on Linux; SwiftShader is Chromium's software GPU.
WEBGPU_FLAGS = ("--enable-unsafe-webgpu",)
SOFTWARE_WEBGPU_FLAGS = ("--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan")


def find_chromium() -> str | None:
    """``$UNIDEPLOY_CHROMIUM``, else the first Chromium or Chrome on PATH."""
    named = os.environ.get("UNIDEPLOY_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


def browser_availability() -> Availability:
    """Both halves of verifying a site: the driver (Playwright) and a Chromium to drive."""
    driver = PLAYWRIGHT.availability()
    if not driver.ok:
        return driver
    binary = find_chromium()
    if binary is None:
        return Availability(
            False, "no Chromium or Chrome found (UNIDEPLOY_CHROMIUM, or chromium on PATH)", CHROMIUM_INSTALL
        )
    return Availability(True, f"Chromium at {binary}", modules=driver.modules)


@contextmanager
def served(root: Path, headers: Mapping[str, str], content_types: Mapping[str, str]) -> Iterator[str]:
    """Serve ``root`` read-only on 127.0.0.1 (a free port) with ``headers`` on every response;
    yields the base URL."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {  # noqa: RUF012  (the stdlib's class attribute, extended)
            **http.server.SimpleHTTPRequestHandler.extensions_map,
            **content_types,
        }

        def end_headers(self) -> None:
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Cache-Control", "no-store")
            super().end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, name="site-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def chromium(software_webgpu: bool = False) -> Iterator[Browser]:
    """Headless Chromium, with WebGPU switched on (a software adapter when ``software_webgpu``)."""
    found = browser_availability()
    if not found.ok:
        raise MissingDependencyError(f"cannot open a browser: {found.detail}", found.fix)
    from playwright.sync_api import sync_playwright

    args = [*WEBGPU_FLAGS, *(SOFTWARE_WEBGPU_FLAGS if software_webgpu else ())]
    if os.geteuid() == 0:  # Chromium refuses to start its sandbox as root
        args.append("--no-sandbox")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=find_chromium(), headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()
