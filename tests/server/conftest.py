"""Fixtures for server tests: a repository of real packages and a running server."""

from __future__ import annotations

import pytest
from serving import start_server, stop_server


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    running = start_server(repo, tmp_path_factory.mktemp("server"))
    yield running
    stop_server(running)
