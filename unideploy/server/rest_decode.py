"""A REST inference request's body decoded into tensors (the JSON tensors and the binary tensor
extension), on the event loop when its JSON part is small and in a worker process when it is not.

A large JSON part takes the GIL for as long as it decodes (orjson and numpy's list conversion hold
it), so a worker thread did not help: while one 60 MB JSON body was decoded and refused, health
checks waited up to 1.58 s. ``JsonDecoder`` hands JSON parts over ``DECODE_INLINE_BYTES`` to a
process of its own (started on first use, with ``spawn``: the server's threads must not be forked),
which returns the tensors; the event loop meanwhile answers everything else.
"""

from __future__ import annotations

import asyncio
import base64
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from unideploy.errors import UnideployError
from unideploy.server import codec
from unideploy.server.errors import BadRequest
from unideploy.server.sequences import CONTROLS, SequenceControl, sequence_control
from unideploy.server.shared_memory import Placed, Placement, placement
from unideploy.server.unread import Unaligned

DECODE_INLINE_BYTES = 256 * 1024  # JSON parts above this are decoded in the worker process


@dataclass
class DecodedRequest:
    inputs: dict[str, np.ndarray | Unaligned | Placed]
    requested: list[str]  # the outputs named, in order
    binary: dict[str, bool]  # per named output: whether it goes back as binary
    all_binary: bool  # binary_data_output: the default for outputs not named
    request_id: Any
    placed: dict[str, Placement]  # outputs to write into shared memory
    sequence: SequenceControl | None = None  # sequence_id, sequence_start, sequence_end (sequences.py)

    def binary_output(self, name: str) -> bool:
        return self.binary.get(name, self.all_binary)


class JsonDecoder:
    """Decodes request bodies; one per REST app, its worker process started on first need."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def decode(self, body: bytes | memoryview, cut: int) -> DecodedRequest:
        """``body``, whose first ``cut`` bytes are JSON (binary tensors follow)."""
        if cut <= DECODE_INLINE_BYTES:
            return parse(body, cut)
        body = bytes(body)  # what goes to the decoder's process is pickled
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, parse, body, cut)
        except BrokenProcessPool:  # killed (out of memory on a huge body): the next one gets a new one
            self._pool = None
            raise DecoderLost(
                f"the process decoding this {cut}-byte JSON request stopped",
                "send large tensors as binary data (Inference-Header-Content-Length), or smaller requests",
            ) from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class DecoderLost(UnideployError):
    """The worker process decoding a large JSON body died (a 500: no fault of the request's)."""


def json_length(size: int, header_length: str | None) -> int:
    """How many of a ``size``-byte body's bytes are its JSON part: all of them, or what
    ``Inference-Header-Content-Length`` says (binary tensors follow)."""
    if header_length is None:
        return size
    # ASCII digits ("²" is a digit int() refuses), no more of them than the body's size has (int()
    # refuses 4,300 and more)
    digits = header_length.isascii() and header_length.isdigit()
    if not digits or len(header_length) > len(str(size)) or int(header_length) > size:
        raise BadRequest(f"Inference-Header-Content-Length {header_length!r} does not fit a {size}-byte body")
    return int(header_length)


def parse(body: bytes | memoryview, cut: int) -> DecodedRequest:
    view = memoryview(body)  # the tensors' bytes are read in place: no copy of a large body
    return _decode_request(json_object(view[:cut]), view[cut:])


def json_object(raw: bytes | memoryview) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # invalid UTF-8 included
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


def b64_bytes(value: Any, what: str) -> bytes:
    """``{"b64": "..."}``, how Triton's REST API carries bytes in JSON (a CUDA IPC handle), decoded.
    Line breaks are dropped first: Triton's C++ clients (perf_analyzer) encode with libb64, which
    breaks its output every 72 characters, and Triton's decoder skips them too."""
    encoded = value.get("b64") if isinstance(value, dict) else None
    try:
        if not isinstance(encoded, str):
            raise ValueError("not a string")
        return base64.b64decode("".join(encoded.split()), validate=True)
    except ValueError:
        raise BadRequest(f'{what} must be {{"b64": "<base64>"}}, got {str(value)[:80]}') from None


def _json_parameter(params: dict[str, Any], key: str) -> Any:
    return params.get(key)


def _decode_request(header: dict[str, Any], binary: bytes | memoryview) -> DecodedRequest:
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("request has no 'inputs' list")
    inputs: dict[str, np.ndarray | Unaligned | Placed] = {}
    offset = 0
    for item in raw_inputs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest(f"each input needs a 'name', got {str(item)[:100]}")
        name = item["name"]
        if name in inputs:
            raise BadRequest(f"input '{name}' is given twice")
        shape = codec.check_shape(item.get("shape"), name)
        datatype = item.get("datatype")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f"input '{name}' parameters must be an object")
        size = params.get("binary_data_size")
        place = placement(params, _json_parameter, f"input '{name}'")
        if place is not None:
            inputs[name] = Placed(place, datatype, shape)
        elif size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise BadRequest(
                    f"input '{name}' binary_data_size {size!r} does not fit the {len(binary)} binary bytes"
                )
            inputs[name] = codec.from_bytes(binary[offset : offset + size], datatype, shape, name)
            offset += size
        elif "data" in item:
            inputs[name] = codec.from_json_data(item["data"], datatype, shape, name)
        else:
            raise BadRequest(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    outputs = header.get("outputs") or []
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) and isinstance(o.get("parameters") or {}, dict)
        for o in outputs
    ):
        raise BadRequest("'outputs' must be a list of objects with a 'name' (and 'parameters', if any, an object)")
    params = header.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest("request parameters must be an object")
    all_binary = bool(params.get("binary_data_output", False))
    per_output = {o["name"]: bool((o.get("parameters") or {}).get("binary_data", all_binary)) for o in outputs}
    placed = {
        o["name"]: place
        for o in outputs
        if (place := placement(o.get("parameters") or {}, _json_parameter, f"output '{o['name']}'")) is not None
    }
    return DecodedRequest(
        inputs,
        [o["name"] for o in outputs],
        per_output,
        all_binary,
        header.get("id"),
        placed,
        sequence_control(params) if params.keys() & CONTROLS else None,
    )
