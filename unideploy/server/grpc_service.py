"""gRPC frontend (``inference.GRPCInferenceService``) on grpc.aio: wire format only.

Inputs come as typed ``contents`` or as ``raw_input_contents`` (one blob per input, in order);
outputs always go back as ``raw_output_contents``, which is all ``tritonclient.grpc``'s
``as_numpy`` reads (and the only way FP16 can travel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from unideploy.errors import UnideployError
from unideploy.server import codec, grpc_answer, grpc_request
from unideploy.server.dataplane import DataPlaneAPI, InferRequest
from unideploy.server.errors import BadRequest, TooLarge, check_token, grpc_code
from unideploy.server.protocol import grpc_predict_v2_pb2 as pb
from unideploy.server.protocol import grpc_predict_v2_pb2_grpc as pb_grpc
from unideploy.server.sequences import CONTROLS, sequence_control
from unideploy.server.shared_memory import Placed, Written, placement
from unideploy.server.unread import Unaligned

# gRPC's own receive limit sits this far above --max-request-bytes: a message just over the limit
# reaches the request deserializer (``_tolerant``) and gets the same message as REST, and one far
# over it is refused by gRPC before it is buffered (at twice the limit, 10 refused messages of
# 65-92 MiB grew the server from 133 to 984 MB, and it stayed there)
TRANSPORT_SLACK_BYTES = 1 << 20
# a protobuf message is at most 2 GiB; an answer --max-response-bytes admits beyond it cannot travel
MAX_GRPC_ANSWER_BYTES = (2 << 30) - (1 << 20)
# requests of one ModelStreamInfer stream in the server at once (read, not yet answered on it)
STREAM_WINDOW = 64

log = logging.getLogger("unideploy.server")


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        dataplane: DataPlaneAPI,
        inference_token: str | None,
        repository_token: str | None,
        max_request_bytes: int,
    ) -> None:
        self.dataplane = dataplane
        self.inference_token = inference_token
        self.repository_token = repository_token
        self.max_request_bytes = max_request_bytes  # a streamed request's bytes are checked here

    async def _call(
        self, context: grpc.aio.ServicerContext, token: str | None, work: Callable[[], Awaitable[Any]]
    ) -> Any:
        try:
            check_token(token, dict(context.invocation_metadata()).get("authorization", ""))
            return await work()
        except UnideployError as exc:
            await _abort(context, exc)

    # -- health and metadata -----------------------------------------------------------------
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=await self.dataplane.live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self.dataplane.ready())

    async def ModelReady(self, request, context):
        async def work():
            return pb.ModelReadyResponse(ready=await self.dataplane.model_ready(request.name, request.version or None))

        return await self._call(context, self.inference_token, work)

    async def ServerMetadata(self, request, context):
        async def work():
            return pb.ServerMetadataResponse(**await self.dataplane.server_metadata())

        return await self._call(context, self.inference_token, work)

    async def ModelMetadata(self, request, context):
        async def work():
            meta = await self.dataplane.model_metadata(request.name, request.version or None)
            tensors = lambda items: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in items]  # noqa: E731
            return pb.ModelMetadataResponse(
                name=meta["name"],
                versions=meta["versions"],
                platform=meta["platform"],
                inputs=tensors(meta["inputs"]),
                outputs=tensors(meta["outputs"]),
            )

        return await self._call(context, self.inference_token, work)

    async def ModelConfig(self, request, context):
        async def work():
            config = await self.dataplane.model_config(request.name, request.version or None)
            # the one configuration the REST side answers too (its keys are ModelConfig's JSON names)
            message = json_format.ParseDict(config, pb.ModelConfig())
            return pb.ModelConfigResponse(config=message)

        return await self._call(context, self.inference_token, work)

    async def ModelStatistics(self, request, context):
        async def work():
            found = await self.dataplane.model_statistics(request.name or None, request.version or None)
            return json_format.ParseDict(found, pb.ModelStatisticsResponse())  # the REST side's JSON

        return await self._call(context, self.inference_token, work)

    # -- inference ---------------------------------------------------------------------------
    async def ModelInfer(self, request, context):
        return await self._call(context, self.inference_token, lambda: self._infer(request, context))

    async def ModelStreamInfer(self, requests, context):
        """Triton's streaming inference: each request on the stream answered on it, as it completes
        (a client matches answers by their ``id``), several at once as unary calls are, so one
        stream carries a client's concurrency (perf_analyzer's ``--streaming``); a sequence's calls
        still run in the order they arrive (``sequences.py``). A request that fails is answered with
        ``error_message`` and the stream stays open, as Triton does; a wrong token closes it. At most
        ``STREAM_WINDOW`` requests of a stream are in the server at once, read and not yet answered
        on it: the stream is read no further meanwhile, so a client that sends without reading the
        answers is held back by the transport's flow control, not by the server's memory."""
        try:
            check_token(self.inference_token, dict(context.invocation_metadata()).get("authorization", ""))
        except UnideployError as exc:
            await _abort(context, exc)
        answers = asyncio.Queue()  # each request's ModelStreamInferResponse (or its bytes); None: the end
        running = set()  # the requests being answered
        window = asyncio.Semaphore(STREAM_WINDOW)  # a request's place, from being read until answered

        async def answer(request):  # the generated messages are untyped: as the other methods, unchecked
            try:
                if (unread := _unread(request, "ModelInferRequest", self.max_request_bytes)) is not None:
                    raise unread
                streamed = await self._infer(request, context, streamed=True)
            except Exception as exc:
                if not isinstance(exc, UnideployError):  # a unary call's would be UNKNOWN, logged
                    log.exception("a streamed inference request failed")
                streamed = pb.ModelStreamInferResponse(error_message=str(exc) or type(exc).__name__)
                if isinstance(request, grpc_request.InferCall):
                    streamed.infer_response.id = request.message.id
                    streamed.infer_response.model_name = request.message.model_name
            await answers.put(streamed)

        async def read():
            while True:
                await window.acquire()
                try:
                    request = await anext(requests)
                except StopAsyncIteration:
                    break
                task = asyncio.get_running_loop().create_task(answer(request))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(set(running))
            await answers.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (streamed := await answers.get()) is not None:
                yield streamed
                window.release()
            await reader  # its error, if reading the stream failed
        finally:
            for task in (reader, *running):
                task.cancel()

    async def _infer(self, call, context, streamed=False):  # untyped, as the generated messages are
        """``call`` (a ``grpc_request.InferCall``) run, its ``ModelInferResponse``'s wire bytes
        (``grpc_answer``; ``streamed``: a ``ModelStreamInferResponse``'s); raises ``UnideployError``."""
        decoding = time.perf_counter()
        request = call.message
        inputs = _decode_inputs(request, call.raw)
        requested = [o.name for o in request.outputs]
        placed = {
            o.name: place
            for o in request.outputs
            if (place := placement(o.parameters, _grpc_parameter, f"output '{o.name}'")) is not None
        }
        headers = {k.lower(): v for k, v in context.invocation_metadata() if isinstance(v, str)}
        sequence = (
            sequence_control({key: _grpc_parameter(request.parameters, key) for key in CONTROLS})
            if request.parameters
            else None
        )
        result = await self.dataplane.infer(
            InferRequest(
                request.model_name,
                request.model_version or None,
                inputs,
                requested or None,
                placed,
                headers,
                "grpc",
                time.perf_counter() - decoding,
                sequence,
            )
        )
        encoding = time.perf_counter()
        carried = sum(a.nbytes for a in result.outputs.values() if not isinstance(a, Written))
        if carried > MAX_GRPC_ANSWER_BYTES:  # protobuf's own limit: it could not be serialized
            raise TooLarge(
                f"the answer holds {carried} bytes, more than one gRPC message can carry (2 GiB)",
                "ask for it over REST, or write its outputs into shared memory, or send fewer rows per request",
            )
        response = pb.ModelInferResponse(model_name=result.model, model_version=result.version, id=request.id)
        if result.variant:
            response.parameters["variant"].string_param = result.variant
        blobs = []  # raw_output_contents, in order
        for name, array in result.outputs.items():
            if isinstance(array, Written):  # in the client's shared memory; an empty blob keeps positions
                entry = response.outputs.add(name=name, datatype=array.datatype, shape=list(array.shape))
                for key, value in array.parameters().items():
                    if isinstance(value, str):
                        entry.parameters[key].string_param = value
                    else:
                        entry.parameters[key].int64_param = value
                blobs.append(b"")
            else:
                response.outputs.add(name=name, datatype=codec.v2_datatype(array), shape=list(array.shape))
                blobs.append(codec.to_buffer(array))
        answer = grpc_answer.infer_response(response, blobs, streamed)
        self.dataplane.encoded(result, time.perf_counter() - encoding)
        return answer

    # -- the system and CUDA shared memory extensions (authorized like inference) --------------
    async def _shm_status(self, request, context, kind: str, response):
        async def work():
            regions = await self.dataplane.shm_status(request.name or None, kind)
            return response(regions={r["name"]: response.RegionStatus(**r) for r in regions})

        return await self._call(context, self.inference_token, work)

    async def _shm_unregister(self, request, context, kind: str, response):
        async def work():
            await self.dataplane.shm_unregister(request.name or None, kind)
            return response()

        return await self._call(context, self.inference_token, work)

    async def SystemSharedMemoryStatus(self, request, context):
        return await self._shm_status(request, context, "system", pb.SystemSharedMemoryStatusResponse)

    async def SystemSharedMemoryRegister(self, request, context):
        async def work():
            await self.dataplane.shm_register(request.name, request.key, request.offset, request.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()

        return await self._call(context, self.inference_token, work)

    async def SystemSharedMemoryUnregister(self, request, context):
        return await self._shm_unregister(request, context, "system", pb.SystemSharedMemoryUnregisterResponse)

    async def CudaSharedMemoryStatus(self, request, context):
        return await self._shm_status(request, context, "cuda", pb.CudaSharedMemoryStatusResponse)

    async def CudaSharedMemoryRegister(self, request, context):
        async def work():
            await self.dataplane.cuda_shm_register(
                request.name, request.raw_handle, request.device_id, request.byte_size
            )
            return pb.CudaSharedMemoryRegisterResponse()

        return await self._call(context, self.inference_token, work)

    async def CudaSharedMemoryUnregister(self, request, context):
        return await self._shm_unregister(request, context, "cuda", pb.CudaSharedMemoryUnregisterResponse)

    # -- repository --------------------------------------------------------------------------
    async def RepositoryIndex(self, request, context):
        async def work():
            index = await self.dataplane.repository_index(request.ready)
            return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in index])

        return await self._call(context, self.repository_token, work)

    async def RepositoryModelLoad(self, request, context):
        async def work():
            await self.dataplane.repository_load(request.model_name)
            return pb.RepositoryModelLoadResponse()

        return await self._call(context, self.repository_token, work)

    async def RepositoryModelUnload(self, request, context):
        async def work():
            await self.dataplane.repository_unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._call(context, self.repository_token, work)


def _grpc_parameter(params: Any, key: str) -> Any:
    """One entry of a gRPC parameter map as a Python value (None when absent)."""
    if key not in params:
        return None
    which = params[key].WhichOneof("parameter_choice")
    return getattr(params[key], which) if which else None


def _decode_inputs(request: Any, raw: list[memoryview]) -> dict:
    """``request``'s inputs, ``raw`` its raw_input_contents (``grpc_request``)."""
    if not request.model_name:
        raise BadRequest("model_name is empty")
    if not request.inputs:
        raise BadRequest("request has no inputs")
    # inputs in shared memory carry no bytes: the raw contents belong, in order, to the others
    places = [placement(t.parameters, _grpc_parameter, f"input '{t.name}'") for t in request.inputs]
    in_request = sum(place is None for place in places)
    if raw and len(raw) != in_request:
        raise BadRequest(
            f"{len(raw)} raw_input_contents for {in_request} inputs not in shared memory; give one per such input"
        )
    blobs = iter(raw)
    inputs: dict[str, np.ndarray | Unaligned | Placed] = {}
    for tensor, place in zip(request.inputs, places, strict=True):
        if tensor.name in inputs:
            raise BadRequest(f"input '{tensor.name}' is given twice")
        shape = codec.check_shape(list(tensor.shape), tensor.name)
        if place is not None:
            inputs[tensor.name] = Placed(place, tensor.datatype, shape)
        elif raw:
            inputs[tensor.name] = codec.from_bytes(next(blobs), tensor.datatype, shape, tensor.name)
        else:
            inputs[tensor.name] = codec.from_contents(tensor.contents, tensor.datatype, shape, tensor.name)
    return inputs


@dataclass(frozen=True)
class _Undecodable:
    """What a request whose bytes are no protobuf message of its method's type decodes to."""

    why: str


@dataclass(frozen=True)
class _Oversized:
    """What a request over ``--max-request-bytes`` decodes to (its bytes are not parsed)."""

    size: int


def _tolerant(parse: Callable[[bytes], Any], max_request_bytes: int) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: grpc.aio answers a raising one with UNKNOWN and
    logs a traceback per request, so bad bytes become ``_Undecodable`` for the method to refuse. The
    size limit is checked here, on the bytes' length (the transport's own limit has some slack):
    counting a parsed message's size re-encodes it, 0.1 ms for a 600 KB tensor."""

    def deserialize(data: bytes) -> Any:
        if len(data) > max_request_bytes:
            return _Oversized(len(data))
        try:
            return parse(data)
        except DecodeError as exc:
            return _Undecodable(str(exc) or "DecodeError")

    return deserialize


async def _abort(context: grpc.aio.ServicerContext, exc: UnideployError) -> None:
    """End the call with ``exc``'s gRPC code and message (``errors.grpc_code``)."""
    await context.abort(getattr(grpc.StatusCode, grpc_code(exc)), str(exc))


def _unread(request: Any, message: str, max_request_bytes: int) -> BadRequest | None:
    """Why a request the deserializer did not parse is refused (``_tolerant``); None where it was."""
    if isinstance(request, _Oversized):
        return TooLarge(
            f"request of {request.size} bytes exceeds the limit of {max_request_bytes} bytes "
            "(the server's --max-request-bytes)"
        )
    if isinstance(request, _Undecodable):
        return BadRequest(
            f"the request is not a valid inference.{message} ({request.why}); send one built from "
            "the protocol's .proto (docs/server.md, Protocol)"
        )
    return None


def _refusing_undecodable(
    method: Callable[[Any, Any], Awaitable[Any]], message: str, max_request_bytes: int
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if (unread := _unread(request, message, max_request_bytes)) is not None:
            await _abort(context, unread)
        return await method(request, context)

    return behavior


def add_servicer(
    server: grpc.aio.Server,
    dataplane: DataPlaneAPI,
    inference_token: str | None,
    repository_token: str | None,
    max_request_bytes: int,
) -> None:
    """Every method of the service, from the proto's descriptor, each with a deserializer that
    turns undecodable bytes into an INVALID_ARGUMENT answer instead of an UNKNOWN and a traceback."""
    servicer = InferenceServicer(dataplane, inference_token, repository_token, max_request_bytes)
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]

    def handler(method: Any) -> grpc.RpcMethodHandler:
        message = getattr(pb, method.input_type.name)
        parse = _tolerant(
            grpc_request.infer_call_parser(message)
            if method.input_type.name == "ModelInferRequest"
            else message.FromString,
            max_request_bytes,
        )
        serialize = grpc_answer.serializer(getattr(pb, method.output_type.name))
        if method.client_streaming:  # ModelStreamInfer: each unread request answered on the stream
            return grpc.stream_stream_rpc_method_handler(
                getattr(servicer, method.name), request_deserializer=parse, response_serializer=serialize
            )
        return grpc.unary_unary_rpc_method_handler(
            _refusing_undecodable(getattr(servicer, method.name), method.input_type.name, max_request_bytes),
            request_deserializer=parse,
            response_serializer=serialize,
        )

    handlers = {method.name: handler(method) for method in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
