"""Fixtures for server tests: a repository of real packages and a running server."""

from __future__ import annotations

import pytest
from serving import FRONTEND_COUNTS, FRONTEND_IDS, start_server, stop_server


@pytest.fixture(scope="module", params=FRONTEND_COUNTS, ids=FRONTEND_IDS)
def server(repo, tmp_path_factory, request):
    """A server in one process (the default below 8 cores), and one whose requests are decoded,
    checked and answered by two front-end processes (``--frontends``): every test of protocols,
    bad requests and shared memory runs against both, since they must answer alike."""
    running = start_server(repo, tmp_path_factory.mktemp("server"), "--frontends", request.param)
    yield running
    stop_server(running)
