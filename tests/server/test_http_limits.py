"""What a REST client may send before its request is routed (server/http_limits.py), against a live
server over raw sockets: oversized and too many headers answered 431, a request head (or a new
connection's first one) that does not arrive in time answered 408 and closed, the descriptor
limit raised at start; keep-alive requests, one after another, unaffected. On the gRPC port, a
connection that never completes its handshake, or stops making calls, is closed too."""

from __future__ import annotations

import resource
import socket
import subprocess

import httpx
import pytest
from serving import start_server, stop_server

BODY = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,1,8,8],"data":[' + b",".join([b"0"] * 64) + b"]}]}"


@pytest.fixture(scope="module")
def limited(repo, tmp_path_factory):
    running = start_server(
        repo,
        tmp_path_factory.mktemp("limits"),
        "--header-timeout",
        "1",
        "--grpc-idle-timeout",
        "1",
        "--max-headers",
        "50",
        "--frontends",
        "0",
    )
    yield running
    stop_server(running)


def exchange(server, raw: bytes, wait_s: float = 30) -> bytes:
    """Send ``raw`` on a new connection; everything the server answers until it closes (or ``wait_s``)."""
    host, port = server.http.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        if raw:
            sock.sendall(raw)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


def closed_by_server(address: str, raw: bytes, wait_s: float = 30) -> bool:
    """Whether the server closes a new connection to ``address`` after ``raw`` (within ``wait_s``)."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        if raw:
            sock.sendall(raw)
        try:
            while sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            pass
        return True


def request(headers: str = "") -> bytes:
    return (
        f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


def test_a_huge_header_is_answered_431(limited):
    answer = exchange(limited, request(f"X-Big: {'a' * 1_000_000}\r\n"))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"exceed 65536 bytes" in answer
    assert limited.ready()  # and the server goes on


def test_too_many_headers_are_answered_431(limited):
    answer = exchange(limited, request("".join(f"X-H{i}: v\r\n" for i in range(2000))))
    assert answer.startswith(b"HTTP/1.1 431 ") and b"more than 50 request headers" in answer


def test_a_head_that_never_completes_is_answered_408_and_closed(limited):
    answer = exchange(limited, b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1 s" in answer


def test_a_connection_that_sends_nothing_is_closed(limited):
    assert exchange(limited, b"").startswith(b"HTTP/1.1 408 ")


def test_a_grpc_connection_without_a_handshake_or_calls_is_closed(limited):
    """Silent after connecting: closed after the header timeout; an HTTP/2 preface and SETTINGS but no
    call: closed after the idle timeout (GOAWAY); a real client still gets its answers."""
    import tritonclient.grpc as triton

    assert closed_by_server(limited.grpc, b"")
    assert closed_by_server(limited.grpc, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"))
    client = triton.InferenceServerClient(limited.grpc)
    assert client.is_model_ready("digits")
    client.close()


def test_a_connection_over_the_cap_is_answered_503_with_retry_after_as_it_opens(repo, tmp_path):
    """--max-connections 2: two keep-alive connections are served; a third is answered 503 with
    Retry-After and closed before it sends anything (its descriptor given back at once); once one of
    the two closes, a new connection is served."""
    server = start_server(repo, tmp_path, "--max-connections", "2", "--frontends", "0")
    try:
        clients = [httpx.Client(base_url=server.http, timeout=30) for _ in range(2)]
        assert all(c.post("/v2/models/digits/infer", content=BODY).status_code == 200 for c in clients)
        answer = exchange(server, b"")
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1\r\n" in answer, answer
        assert b"more than 2 connections at once" in answer
        clients.pop().close()
        server.wait_for(
            lambda: exchange(server, request("Connection: close\r\n")).startswith(b"HTTP/1.1 200 "),
            what="a free connection",
        )
        clients[0].close()
    finally:
        stop_server(server)


def test_keep_alive_requests_are_not_timed_between_them(limited):
    """Three requests on one connection with pauses longer than the header timeout (but within
    the keep-alive timeout) between them: each head is timed from its own first byte."""
    import time

    with httpx.Client(base_url=limited.http, timeout=30) as client:
        for _ in range(3):
            assert client.post("/v2/models/digits/infer", content=BODY).status_code == 200
            time.sleep(1.5)


def test_the_descriptor_limit_is_raised_to_the_hard_limit(repo, tmp_path):
    """Started with a soft limit of 256 open files (as a shell's ulimit -Sn may leave it), the
    server raises it to the hard limit before it accepts connections."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    server = start_server(repo, tmp_path, "--frontends", "0", wrapper=("prlimit", f"--nofile=256:{hard}"))
    try:
        limits = subprocess.run(
            ["prlimit", "--nofile", "--pid", str(server.process.pid), "--output", "SOFT,HARD", "--noheadings"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    finally:
        stop_server(server)
    assert limits[0] == limits[1], limits


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_binary_body_sent_in_pieces_is_answered_as_if_sent_at_once(limited, digits, framing):
    """Real digit images as binary tensors after a JSON header of odd length (so the tensor does not
    start aligned in the body), the body sent in pieces with pauses: the server waits for the whole
    declared body (or the last chunk) and answers exactly as for the body sent at once."""
    import json
    import time

    import numpy as np

    x = np.ascontiguousarray(np.load(digits["data"])["x"][:3])
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": list(x.shape), "parameters": {"binary_data_size": x.nbytes}}
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": False}}],
        }
    ).encode()
    header += b" " * (1 - len(header) % 2)  # odd: the tensor starts off any 4-byte boundary
    body = header + x.tobytes()
    with httpx.Client(base_url=limited.http, timeout=30) as client:
        whole = client.post(
            "/v2/models/digits/infer", content=body, headers={"Inference-Header-Content-Length": str(len(header))}
        )
    assert whole.status_code == 200, whole.text
    head = f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {len(header)}\r\n"
    cut = len(header) + x.nbytes // 2
    if framing == "content-length":
        pieces = [f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:cut], body[cut:]]
    else:
        pieces = [f"{head}Transfer-Encoding: chunked\r\n\r\n".encode()]
        pieces += [b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:cut], body[cut:])] + [b"0\r\n\r\n"]
    host, port = limited.http.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.2)  # the input's shape: pieces that arrive apart
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
            answer.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
        ):
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    got = json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"]
    assert got == whole.json()["outputs"][0]["data"]
