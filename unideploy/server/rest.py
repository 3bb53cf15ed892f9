"""REST frontend (Open Inference Protocol v2 over HTTP) on Starlette: wire format only.

JSON tensors and the binary tensor extension: a body whose first ``Inference-Header-Content-Length``
bytes are the JSON header, followed by each binary input's bytes in order (``binary_data_size``).
Outputs come back binary when the request asks (per output ``binary_data``, or
``binary_data_output`` for all), which is what ``tritonclient.http`` does by default.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import orjson
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from unideploy.errors import UnideployError
from unideploy.server import codec
from unideploy.server.config import ServerConfig
from unideploy.server.dataplane import DataPlaneAPI, InferRequest
from unideploy.server.errors import RequestTimeout, TooLarge, check_token, http_status
from unideploy.server.http_body import aligned_buffer, received_body
from unideploy.server.rest_decode import JsonDecoder, b64_bytes, json_length, json_object
from unideploy.server.shared_memory import Written

log = logging.getLogger("unideploy.server")

HEADER_LENGTH = "inference-header-content-length"


def inference_body_offset(scope: MutableMapping[str, Any]) -> int | None:
    """Where an inference request's binary tensors start in its body (the length its
    ``Inference-Header-Content-Length`` gives; 0 without tensors), for the server to receive the
    body laid out for them (``http_body``); None for any other request. A header that is no length
    counts as none here: the route refuses it."""
    if scope["method"] != "POST" or not scope["path"].endswith("/infer"):
        return None
    header = next((value for name, value in scope["headers"] if name == HEADER_LENGTH.encode()), b"")
    return int(header) if header.isdigit() and len(header) < 16 else 0


def _aligned_body(chunks: list[bytes], size: int, aligned_from: int) -> bytes | memoryview:
    """An inference body from its chunks (one whose length was not declared), laid out so that
    byte ``aligned_from``, where binary tensors start after the JSON header, sits on a 64-byte
    boundary: the tensors are then read in place (one still unaligned, after a tensor of another
    type, is copied once where the call wants it: ``codec.from_bytes``)."""
    if not 0 < aligned_from < size:
        return b"".join(chunks)
    body = aligned_buffer(size, aligned_from)
    at = 0
    for chunk in chunks:  # the one copy b"".join would make
        body[at : at + len(chunk)] = chunk
        at += len(chunk)
    return body


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


def create_app(dataplane: DataPlaneAPI, cfg: ServerConfig) -> Starlette:
    """The REST routes for ``dataplane``, with ``cfg``'s limits and tokens."""
    max_request_bytes, body_timeout_s = cfg.max_request_bytes, cfg.body_timeout_s
    inference_token, repository_token = cfg.inference_token, cfg.repository_token
    decoder = JsonDecoder()  # large JSON bodies are decoded in a process of its own

    def guarded(handler: Handler, token: str | None) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                check_token(token, request.headers.get("authorization", ""))
                return await handler(request)
            except UnideployError as exc:
                return _error(http_status(exc), str(exc))
            except ClientDisconnect:  # nobody is left to answer: one line, not a traceback
                peer = f"{request.client.host}:{request.client.port}" if request.client else "a client"
                log.info("%s disconnected before its %s %s request was read", peer, request.method, request.url.path)
                return Response(status_code=400)

        return endpoint

    async def read_chunks(request: Request) -> tuple[list[bytes], int]:
        """The body's chunks and its size, within the limits; for a body the server received into
        one buffer (``http_body``), no chunks and its size once it is complete."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_request_bytes):
            raise TooLarge(f"request body of {declared} bytes exceeds the limit of {max_request_bytes}")
        chunks, size = [], 0
        received = received_body(request.scope)
        try:
            async with asyncio.timeout(body_timeout_s):  # a body shorter than its Content-Length waits no longer
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > max_request_bytes:
                        raise TooLarge(f"request body exceeds the limit of {max_request_bytes} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            came = received.received if received is not None else size
            raise RequestTimeout(
                f"request body did not arrive within {body_timeout_s:g} s ({came} bytes came)"
            ) from None
        return chunks, size if received is None else received.received

    async def read_body(request: Request) -> bytes:
        return b"".join((await read_chunks(request))[0])

    def version_of(request: Request) -> str | None:
        return request.path_params.get("version")

    # -- health and metadata -----------------------------------------------------------------
    async def live(request: Request) -> Response:
        return JSONResponse({"live": await dataplane.live()})

    async def ready(request: Request) -> Response:
        is_ready = await dataplane.ready()
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(await dataplane.server_metadata())

    async def model_metadata(request: Request) -> Response:
        return JSONResponse(await dataplane.model_metadata(request.path_params["model"], version_of(request)))

    async def model_ready(request: Request) -> Response:
        is_ready = await dataplane.model_ready(request.path_params["model"], version_of(request))
        return JSONResponse(
            {"name": request.path_params["model"], "ready": is_ready}, status_code=200 if is_ready else 503
        )

    async def model_config(request: Request) -> Response:
        return JSONResponse(await dataplane.model_config(request.path_params["model"], version_of(request)))

    # -- the system and CUDA shared memory extensions -----------------------------------------
    def shm_status(kind: str) -> Handler:
        async def endpoint(request: Request) -> Response:
            return JSONResponse(await dataplane.shm_status(request.path_params.get("region"), kind))

        return endpoint

    def shm_unregister(kind: str) -> Handler:
        async def endpoint(request: Request) -> Response:
            await dataplane.shm_unregister(request.path_params.get("region"), kind)
            return JSONResponse({})

        return endpoint

    async def shm_register(request: Request) -> Response:
        found = json_object(await read_body(request))
        await dataplane.shm_register(
            request.path_params["region"], found.get("key"), found.get("offset", 0), found.get("byte_size")
        )
        return JSONResponse({})

    async def cuda_shm_register(request: Request) -> Response:
        found = json_object(await read_body(request))
        await dataplane.cuda_shm_register(
            request.path_params["region"],
            b64_bytes(found.get("raw_handle"), "raw_handle"),
            found.get("device_id"),
            found.get("byte_size"),
        )
        return JSONResponse({})

    async def model_statistics(request: Request) -> Response:
        return JSONResponse(await dataplane.model_statistics(request.path_params.get("model"), version_of(request)))

    async def metrics(request: Request) -> Response:
        return Response(await dataplane.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    # -- inference ---------------------------------------------------------------------------
    async def infer(request: Request) -> Response:
        chunks, size = await read_chunks(request)
        cut = json_length(size, request.headers.get(HEADER_LENGTH))
        received = received_body(request.scope)
        body = received.view if received is not None else _aligned_body(chunks, size, cut)
        decoding = time.perf_counter()
        # A large JSON part takes milliseconds to decode: in the decoder's process, other requests go
        # on. Binary tensors are read in place at any size, so only the JSON part counts (a 600 KB
        # binary request sent to a thread and back cost 0.18 ms of its 1.05 ms in the server).
        decoded = await decoder.decode(body, cut)
        result = await dataplane.infer(
            InferRequest(
                request.path_params["model"],
                version_of(request),
                decoded.inputs,
                decoded.requested or None,
                decoded.placed,
                request.headers,
                "rest",
                time.perf_counter() - decoding,
                decoded.sequence,
            )
        )
        encoding = time.perf_counter()
        response: dict[str, Any] = {"model_name": result.model, "model_version": result.version, "outputs": []}
        if decoded.request_id is not None:
            response["id"] = decoded.request_id
        if result.variant:
            response["parameters"] = {"variant": result.variant}
        blobs = []
        for name, array in result.outputs.items():
            if isinstance(array, Written):  # in the client's shared memory, not in the response
                # binary_data_size 0: Triton's C++ client (perf_analyzer) reads it from any output's parameters
                parameters = {**array.parameters(), "binary_data_size": 0}
                response["outputs"].append(
                    {"name": name, "datatype": array.datatype, "shape": list(array.shape), "parameters": parameters}
                )
                continue
            entry: dict[str, Any] = {"name": name, "datatype": codec.v2_datatype(array), "shape": list(array.shape)}
            if decoded.binary_output(name):
                blob = codec.to_buffer(array)
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:  # orjson writes numeric arrays directly, without a Python list in between
                flat = np.ascontiguousarray(array).reshape(-1)
                entry["data"] = flat if flat.dtype.kind in "biuf" else flat.tolist()
            response["outputs"].append(entry)
        headers = {"x-unideploy-model-version": result.version}
        if result.variant:
            headers["x-unideploy-variant"] = result.variant
        text = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
        if blobs:
            headers["Inference-Header-Content-Length"] = str(len(text))
            text = b"".join((text, *blobs))  # each output's bytes copied once, into the body
        dataplane.encoded(result, time.perf_counter() - encoding)
        return Response(text, media_type="application/octet-stream" if blobs else "application/json", headers=headers)

    # -- repository and routing --------------------------------------------------------------
    async def repository_index(request: Request) -> Response:
        body = await read_body(request)
        ready_only = bool(json_object(body).get("ready", False)) if body.strip() else False
        return JSONResponse(await dataplane.repository_index(ready_only))

    async def load(request: Request) -> Response:
        await dataplane.repository_load(request.path_params["model"])
        return JSONResponse({})

    async def unload(request: Request) -> Response:
        await dataplane.repository_unload(request.path_params["model"])
        return JSONResponse({})

    async def routing(request: Request) -> Response:
        name = request.path_params["model"]
        if request.method == "GET":
            return JSONResponse(await dataplane.routing(name) or {})
        return JSONResponse(await dataplane.set_routing(name, json_object(await read_body(request))))

    inference = lambda h: guarded(h, inference_token)  # noqa: E731
    repository = lambda h: guarded(h, repository_token)  # noqa: E731
    open_ = lambda h: guarded(h, None)  # noqa: E731
    routes = [  # matched in order: inference, the hot path, first
        Route("/v2/models/{model}/infer", inference(infer), methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", inference(infer), methods=["POST"]),
        Route("/v2/health/live", open_(live)),
        Route("/v2/health/ready", open_(ready)),
        Route("/metrics", open_(metrics)),
        Route("/v2", inference(server_metadata)),
        # Triton's statistics extension; before the model routes, which would take "stats" for a model's name
        Route("/v2/models/stats", inference(model_statistics)),
        Route("/v2/models/{model}/stats", inference(model_statistics)),
        Route("/v2/models/{model}/versions/{version}/stats", inference(model_statistics)),
        Route("/v2/models/{model}", inference(model_metadata)),
        Route("/v2/models/{model}/versions/{version}", inference(model_metadata)),
        Route("/v2/models/{model}/ready", inference(model_ready)),
        Route("/v2/models/{model}/versions/{version}/ready", inference(model_ready)),
        *(
            route
            for kind, register in (("system", shm_register), ("cuda", cuda_shm_register))
            for route in (
                Route(f"/v2/{kind}sharedmemory/status", inference(shm_status(kind))),
                Route(f"/v2/{kind}sharedmemory/region/{{region}}/status", inference(shm_status(kind))),
                Route(f"/v2/{kind}sharedmemory/region/{{region}}/register", inference(register), methods=["POST"]),
                Route(f"/v2/{kind}sharedmemory/unregister", inference(shm_unregister(kind)), methods=["POST"]),
                Route(
                    f"/v2/{kind}sharedmemory/region/{{region}}/unregister",
                    inference(shm_unregister(kind)),
                    methods=["POST"],
                ),
            )
        ),
        Route("/v2/models/{model}/config", inference(model_config)),
        Route("/v2/models/{model}/versions/{version}/config", inference(model_config)),
        Route("/v2/repository/index", repository(repository_index), methods=["POST"]),
        Route("/v2/repository/models/{model}/load", repository(load), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", repository(unload), methods=["POST"]),
        Route("/v2/models/{model}/routing", repository(routing), methods=["GET", "PUT"]),
    ]
    app = Starlette(routes=routes)
    app.state.json_decoder = decoder  # closed with the listeners
    return app
