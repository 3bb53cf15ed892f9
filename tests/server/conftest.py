"""Fixtures for server tests: a repository of real packages and a running server."""

from __future__ import annotations

import uuid

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


@pytest.fixture
def regions():
    """System shared-memory segments made as a client makes them (tritonclient's own utilities),
    each destroyed afterwards; names unique per test. ``regions(size)`` gives (handle, name, key)."""
    shm = pytest.importorskip("tritonclient.utils.shared_memory", reason="tritonclient is in the dev extra")
    made = []

    def make(size: int) -> tuple[object, str, str]:
        name, key = f"r{uuid.uuid4().hex[:8]}", f"/unideploy-test-{uuid.uuid4().hex[:12]}"
        made.append(shm.create_shared_memory_region(name, key, size))
        return made[-1], name, key

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)
