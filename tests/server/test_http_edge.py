"""The HTTP edge (`server/http_edge.py`) against real sockets: request deadlines, the connection
cap, header limits and unambiguous framing; every refusal closes its connection, and the other
clients keep being served."""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import httpx
import pytest

from inflight.engine.async_engine import AsyncLLM
from inflight.server.http_edge import EdgeLimits, head_problem
from tests.server.live import LiveServer

LIMITS = EdgeLimits(read_timeout=1.0, max_connections=24, max_header_bytes=4096, max_headers=20)
POST = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
BODY = b'{"model": "tiny", "prompt": "hi", "max_tokens": 1}'
LENGTH = b"Content-Length: %d\r\n" % len(BODY)
CHUNK = b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n"


def head(*fields: bytes) -> bytes:
    return b"GET /health HTTP/1.1\r\n" + b"".join(f + b"\r\n" for f in fields) + b"\r\n"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (head(b"Host: a"), None),
        (b"\r\n" + head(b"Host: a"), None),  # a blank line before the request line is allowed
        (head(b"Host: a", b"X: " + b"x" * 5000), 431),
        (b"GET /health HTTP/1.1\r\nX: " + b"x" * 5000, 431),  # incomplete, already too long
        (b"GET /health HTTP/1.1\r\nX: " + b"x" * 100, None),  # incomplete, within bounds
        (head(*[b"X-%d: 1" % i for i in range(21)]), 431),
        (head(*[b"X-%d: 1" % i for i in range(20)]), None),
        (head(b"Host: a", b"X: b", b" c"), 400),  # obsolete line folding
        (head(b"Host: a", b"Content-Length: 5", b"Content-Length: 5"), 400),
        (head(b"Host: a", b"content-length: 5", b"Transfer-Encoding: chunked"), 400),
        (head(b"Host: a", b"Transfer-Encoding: chunked"), None),
    ],
)
def test_head_problems(raw, status):
    refusal = head_problem(raw, LIMITS)
    assert (refusal and refusal.status) == status, refusal


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> bytes:
    """Sends `raw` and reads until the server closes the connection (the test fails if it
    does not within `timeout`)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(raw)
        return read_to_close(sock, timeout)


def read_to_close(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        raise AssertionError(f"the connection stayed open; got {received[:200]!r}") from None
    return received


def status_and_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split()[1]), json.loads(body)["error"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)


@pytest.fixture(scope="module")
def server(engine):
    with LiveServer(engine, served_model_name="tiny", read_timeout=LIMITS.read_timeout,
                    max_connections=LIMITS.max_connections,
                    max_header_bytes=LIMITS.max_header_bytes,
                    max_headers=LIMITS.max_headers) as s:  # fmt: skip
        yield s


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (head(b"Host: 127.0.0.1", b"X: " + b"x" * 100_000), 431, "exceeds 4096 bytes"),
        (head(b"Host: 127.0.0.1", *[b"X-%d: 1" % i for i in range(30)]), 431, "header fields"),
        (POST + LENGTH + b"Transfer-Encoding: chunked\r\n\r\n" + CHUNK
         + head(b"Host: 127.0.0.1"), 400, "Transfer-Encoding"),
        (POST + LENGTH + LENGTH + b"\r\n" + BODY, 400, "Content-Length"),
        (POST + LENGTH + b"Content-Length: 49\r\n\r\n" + BODY, 400, "Content-Length"),
        (POST + b"Content-Length: +50\r\n\r\n" + BODY, 400, "malformed"),
        (POST + b"X-A: b\r\n c\r\n" + LENGTH + b"\r\n" + BODY, 400, "line folding"),
    ],
)  # fmt: skip
def test_bad_heads_get_their_status_and_a_closed_connection(server, raw, status, fragment):
    """The smuggling case sends a second request on the same connection: it is never served."""
    response = exchange(server.port, raw)
    assert response.count(b"HTTP/1.1 ") == 1, response[:300]
    got, error = status_and_error(response)
    assert got == status and fragment in error["message"], error
    assert error["type"] == "invalid_request_error"
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_chunked_body_is_served(server):
    raw = POST + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + CHUNK
    response = exchange(server.port, raw)
    assert response.startswith(b"HTTP/1.1 200"), response[:300]


def trickle(port: int, raw: bytes, interval: float, result: dict) -> None:
    """Sends `raw` a byte every `interval` seconds until the server answers."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for byte in raw:
            if select.select([sock], [], [], 0)[0]:
                break
            sock.sendall(bytes([byte]))
            time.sleep(interval)
        result["response"] = read_to_close(sock, 10)
    result["held_s"] = time.monotonic() - start


@pytest.mark.parametrize(
    "raw",
    [
        b"",  # connects and sends nothing
        head(b"Host: 127.0.0.1") * 5,  # trickles its head
        POST + LENGTH + b"\r\n" + BODY,  # its body
    ],
    ids=["idle", "head", "body"],
)
def test_slow_clients_get_408_within_the_deadline(server, raw):
    """A byte every 50 ms is never silent for long, yet the request takes 5-10 s to arrive."""
    results = [{} for _ in range(8)]
    threads = [threading.Thread(target=trickle, args=(server.port, raw, 0.05, r)) for r in results]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    start = time.monotonic()
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200  # others are served
    assert time.monotonic() - start < 2
    for thread in threads:
        thread.join(30)
    for result in results:
        assert result["held_s"] < LIMITS.read_timeout + 2, result
        status, error = status_and_error(result["response"])
        assert status == 408 and error["code"] == "request_timeout"


def test_connections_past_the_cap_are_refused_at_once(engine):
    with LiveServer(engine, served_model_name="tiny", max_connections=8) as s:
        held = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(8)]
        try:
            time.sleep(0.2)  # the server has accepted them all
            start = time.monotonic()
            with socket.create_connection(("127.0.0.1", s.port)) as extra:
                response = read_to_close(extra, 5)
            assert time.monotonic() - start < 2
            status, error = status_and_error(response)
            assert status == 503 and error["code"] == "too_many_connections"
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        assert httpx.get(s.url + "/health").status_code == 200


def test_a_stalled_body_gets_408_behind_any_asgi_server():
    """`RequestLimits` alone (Ray Serve's proxy has no edge): a body that stops arriving."""
    import asyncio

    from inflight.server.middleware import RequestLimits

    async def app(scope, receive, send):
        raise AssertionError("the route must not run")

    async def stall():
        await asyncio.sleep(3600)

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "headers": [(b"content-length", b"10")]}
    asyncio.run(RequestLimits(app, max_bytes=100, read_timeout=0.1)(scope, stall, send))
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_timeout"
