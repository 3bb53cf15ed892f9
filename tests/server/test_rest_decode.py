"""Large JSON bodies are decoded in a worker process (server/rest_decode.py): a live server keeps
answering health checks while one is decoded and refused, and decodes them exactly as on the loop."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from unideploy.server.errors import BadRequest
from unideploy.server.rest_decode import DECODE_INLINE_BYTES, JsonDecoder, parse


def json_body(rows: np.ndarray) -> bytes:
    values = ",".join(map(repr, rows.ravel().tolist()))
    return (
        f'{{"id":"7","inputs":[{{"name":"x","datatype":"FP32","shape":{list(rows.shape)},"data":[{values}]}}],'
        f'"outputs":[{{"name":"output","parameters":{{"binary_data":true}}}}]}}'
    ).encode()


def test_the_worker_decodes_what_the_loop_would(digits):
    """A JSON body over the inline limit comes back from the worker process as the same tensors,
    and its refusals as the same errors."""
    import asyncio

    with np.load(digits["data"]) as d:
        rows = np.ascontiguousarray(np.tile(d["x"][:100], (20, 1, 1, 1)))  # 2,000 real digit images
    body = json_body(rows)
    assert len(body) > DECODE_INLINE_BYTES

    async def both():
        decoder = JsonDecoder()
        try:
            far = await decoder.decode(body, len(body))
            with pytest.raises(BadRequest, match="not valid JSON"):
                await decoder.decode(body[:-1], len(body) - 1)
            return far
        finally:
            decoder.close()

    far, near = asyncio.run(both()), parse(body, len(body))
    np.testing.assert_array_equal(far.inputs["x"], near.inputs["x"])
    np.testing.assert_array_equal(far.inputs["x"], rows)
    assert (far.request_id, far.requested, far.binary_output("output")) == ("7", ["output"], True)


def test_health_checks_are_answered_while_a_large_json_body_is_decoded(server):
    """While a 30 MB JSON request is read, decoded and refused (its rank is wrong), health checks go
    on: the longest any of them waited is a small part of the big request's time (decoded on the
    event loop, or on a thread holding the GIL, it was most of it: 1.58 s of 2.6 s for 60 MB)."""
    values = 7_500_000
    body = f'{{"inputs":[{{"name":"x","datatype":"FP32","shape":[1,{values}],"data":[' + ",".join(["0.5"] * values)
    body_bytes = (body + "]}]}").encode()
    waits: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.http, timeout=60) as client:
            while not stop.is_set() and len(waits) < 100_000:
                began = time.perf_counter()
                assert client.get("/v2/health/ready").status_code == 200
                waits.append(time.perf_counter() - began)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        server.wait_for(lambda: len(waits) > 20, what="health checks")
        began = time.perf_counter()
        refused = httpx.post(f"{server.http}/v2/models/digits/infer", content=body_bytes, timeout=120)
        took = time.perf_counter() - began
        during = len(waits)
    finally:
        stop.set()
        prober.join(timeout=60)
    assert refused.status_code == 400 and "expected rank 4" in refused.json()["error"]
    assert during > 20 and max(waits[20:during]) < 0.3 * took, (max(waits[20:during]), took)
