"""Inference bodies received straight into one buffer (server/http_body.py): laid out for their
tensors, filled in place, and, against a live server over raw sockets, answered as before when
requests come pipelined on one connection, after ``Expect: 100-continue``, or cut short."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from serving import start_server, stop_server

from unideploy.server.http_body import ALIGNMENT, DeclaredBody, aligned_buffer


@pytest.mark.parametrize("aligned_from", [1, 7, 63, 64, 250])
def test_a_buffer_puts_its_tensors_on_an_aligned_address(aligned_from):
    view = aligned_buffer(1000, aligned_from)
    address = np.frombuffer(view, np.uint8).ctypes.data
    assert len(view) == 1000 and not view.readonly
    assert (address + aligned_from) % ALIGNMENT == 0


def test_a_declared_body_is_filled_in_place_piece_by_piece():
    body = DeclaredBody(10, 3)
    for piece in (b"abc", b"defg", b"hij"):
        body.write(piece)
    assert body.received == 10 and bytes(body.view) == b"abcdefghij"


@pytest.fixture(scope="module")
def served(repo, tmp_path_factory):
    running = start_server(repo, tmp_path_factory.mktemp("body"), "--frontends", "0")
    yield running
    stop_server(running)


def _infer_request(x: np.ndarray, extra_headers: str = "") -> tuple[bytes, bytes]:
    """A binary inference request for the digits model (JSON header of odd length, so the tensor
    starts off any 4-byte boundary of the body): its head and its body."""
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": list(x.shape), "parameters": {"binary_data_size": x.nbytes}}
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": False}}],
        }
    ).encode()
    header += b" " * (1 - len(header) % 2)
    body = header + x.tobytes()
    head = (
        f"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n{extra_headers}\r\n"
    ).encode()
    return head, body


def _read_answers(sock: socket.socket, count: int) -> list[tuple[bytes, dict]]:
    """``count`` HTTP answers from ``sock``, each as (status line, JSON body)."""
    data, answers = b"", []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, rest = data.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(rest) < length:
            rest += sock.recv(65536)
        answers.append((head.split(b"\r\n", 1)[0], json.loads(rest[:length])))
        data = rest[length:]
    return answers


def _connect(server) -> socket.socket:
    host, port = server.http.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_pipelined_requests_each_get_their_own_body(served, digits):
    """Three requests of different images sent in one write, before any answer: each answered
    with its own image's scores, in order (each request's body has its own buffer)."""
    images = np.load(digits["data"])["x"]
    singles = [np.ascontiguousarray(images[i : i + 1]) for i in range(3)]
    with _connect(served) as sock:
        alone = []
        for x in singles:
            sock.sendall(b"".join(_infer_request(x)))
            alone.append(_read_answers(sock, 1)[0])
        sock.sendall(b"".join(b"".join(_infer_request(x)) for x in singles))
        pipelined = _read_answers(sock, 3)
    assert [status for status, _ in pipelined] == [b"HTTP/1.1 200 OK"] * 3
    assert [answer["outputs"] for _, answer in pipelined] == [answer["outputs"] for _, answer in alone]
    assert len({str(answer["outputs"]) for _, answer in alone}) == 3  # three different answers


def test_a_body_sent_after_100_continue_is_answered(served, digits):
    x = np.ascontiguousarray(np.load(digits["data"])["x"][:2])
    head, body = _infer_request(x, "Expect: 100-continue\r\n")
    with _connect(served) as sock:
        sock.sendall(head)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        ((status, answer),) = _read_answers(sock, 1)
    assert status == b"HTTP/1.1 200 OK" and answer["outputs"][0]["shape"][0] == 2


def test_a_body_cut_short_leaves_the_server_answering(served, digits):
    """A client that leaves mid-body: the server forgets the request and answers the next one."""
    x = np.ascontiguousarray(np.load(digits["data"])["x"][:1])
    head, body = _infer_request(x)
    with _connect(served) as sock:
        sock.sendall(head + body[: len(body) // 2])
    with _connect(served) as sock:
        sock.sendall(head + body)
        ((status, _),) = _read_answers(sock, 1)
    assert status == b"HTTP/1.1 200 OK"
