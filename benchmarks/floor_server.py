"""The floor under any server: what the client and the kernel cost for the same requests.

A stand-in for ``deploy serve`` that does no work of its own: the first request of each kind
(method, path and sizes over HTTP; method and size over gRPC) is forwarded to the real server and
its answer kept, every later one is answered with the kept bytes. Over HTTP it reads each request
into one preallocated buffer (``recv_into``) on a thread per connection; over gRPC it is grpcio's
synchronous server with raw-bytes handlers (no protobuf decoding). What a client measures against
it is therefore the client, the loopback and the least a Python server must do to receive the
bytes: ``benchmarks/server_overhead.py`` subtracts it to show what ``deploy serve`` itself adds.
Only fit for requests whose answers do not depend on their content (perf_analyzer's zeros). It
keeps no statistics (Triton's extension, which perf_analyzer reads around each window where the
server metadata lists it: replayed, they would never change, and perf_analyzer would find no version
that served), so the server metadata it replays leaves the extension out.
"""

from __future__ import annotations

import http.client
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import orjson
from tritonclient.grpc import service_pb2

from unideploy.server.dataplane import STATISTICS  # left out of the server metadata a stand-in replays

HEADER_END = b"\r\n\r\n"
NOT_FORWARDED = {"host", "content-length", "connection", "transfer-encoding", "date", "server"}


class HttpFloor:
    """HTTP/1.1 keep-alive responder on 127.0.0.1, replaying ``upstream``'s answers."""

    def __init__(self, upstream: str, max_bytes: int = 16 << 20) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.max_bytes = max_bytes
        self._answers: dict[tuple, bytes] = {}
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(self.max_bytes)
        view, have = memoryview(buffer), 0
        with conn:
            while True:
                while (end := buffer.find(HEADER_END, 0, have)) < 0:
                    if not (n := conn.recv_into(view[have:])):
                        return
                    have += n
                lines = bytes(view[:end]).decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                lower = {k.lower(): v for k, v in headers.items()}
                body_end = end + len(HEADER_END) + int(lower.get("content-length", 0))
                while have < body_end:
                    if not (n := conn.recv_into(view[have:])):
                        return
                    have += n
                key = (method, path, lower.get("inference-header-content-length"), body_end - end)
                if key not in self._answers:
                    body = bytes(view[end + len(HEADER_END) : body_end])
                    sent = {k: v for k, v in headers.items() if k.lower() not in NOT_FORWARDED}
                    with self._lock:
                        self._answers[key] = self._forward(method, path, sent, body)
                conn.sendall(self._answers[key])
                buffer[: have - body_end] = view[body_end:have]
                have -= body_end

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        upstream = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            upstream.request(method, path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            if path.rstrip("/") == "/v2" and response.status == 200:  # the server metadata
                found = orjson.loads(data)
                found["extensions"] = [e for e in found["extensions"] if e != STATISTICS]
                data = orjson.dumps(found)
            kept = "".join(f"{k}: {v}\r\n" for k, v in response.getheaders() if k.lower() not in NOT_FORWARDED)
        finally:
            upstream.close()
        status = f"HTTP/1.1 {response.status} {response.reason}\r\n{kept}content-length: {len(data)}\r\n\r\n"
        return status.encode("latin-1") + data

    def close(self) -> None:
        self._listener.close()


class GrpcFloor:
    """grpcio synchronous server on 127.0.0.1, replaying ``upstream``'s answers as raw bytes."""

    def __init__(self, upstream: str, max_bytes: int = 16 << 20) -> None:
        sizes = [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]
        self._channel = grpc.insecure_channel(upstream, options=sizes)
        self._answers: dict[tuple[str, int], bytes] = {}
        self._server = grpc.server(ThreadPoolExecutor(4), handlers=[self], options=sizes)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """grpc.GenericRpcHandler's one method: every call is answered by ``_answer``."""
        method = details.method
        return grpc.unary_unary_rpc_method_handler(lambda request, context: self._answer(method, request))

    def _answer(self, method: str, request: bytes) -> bytes:
        key = (method, len(request))
        if key not in self._answers:
            answer = self._channel.unary_unary(method)(request, timeout=30)
            if method.endswith("/ServerMetadata"):
                found = service_pb2.ServerMetadataResponse.FromString(answer)
                kept = [e for e in found.extensions if e != STATISTICS]
                del found.extensions[:]
                found.extensions.extend(kept)
                answer = found.SerializeToString()
            self._answers[key] = answer
        return self._answers[key]

    def close(self) -> None:
        self._server.stop(0)
        self._channel.close()
