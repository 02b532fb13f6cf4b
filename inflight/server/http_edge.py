"""The HTTP/1.1 edge: what uvicorn's h11 protocol leaves to the application, enforced per
connection before any route runs.

- **One deadline per request**: its head and body must both arrive within `read_timeout`
  seconds of the connection opening or of the previous response ending. A client that sends
  nothing, or trickles its head or body a byte at a time (slowloris), gets 408 and a closed
  connection; a silence-based timeout alone lets a byte every few seconds hold a connection
  for ever.
- **A cap on connections**: past `max_connections` open ones, a new connection gets 503 and is
  closed at once, so the kernel's accept queue never fills with clients waiting to be served.
- **Header limits**: a head over `max_header_bytes` or with more than `max_headers` fields is
  a 431 (h11 bounds only a head that arrives in pieces, and only at 16 KiB).
- **No ambiguous framing** (RFC 9112 section 6.3): `Content-Length` beside
  `Transfer-Encoding`, more than one `Content-Length`, and obsolete line folding are a 400,
  since a proxy in front may frame such a request differently (request smuggling); h11 would
  accept each. Every refusal closes the connection (after a short drain, `_refuse`).

Refusals carry OpenAI's error body, like the application's own.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from inflight.server import protocol as p
from inflight.server.errors import error_type

LINGER_S = 2.0  # how long a refused connection is drained before it is closed
_HEAD_END = re.compile(rb"\r?\n\r?\n")  # h11 accepts bare LF line endings too


@dataclass(frozen=True)
class EdgeLimits:
    read_timeout: float = 10.0  # seconds for one request's head and body together
    max_connections: int = 1000  # open connections; past it new ones get 503 and are closed
    max_header_bytes: int = 32 * 1024  # the request line and header fields together
    max_headers: int = 100  # header fields


@dataclass(frozen=True)
class Refusal:
    status: int
    message: str
    code: str | None = None


def refusal_bytes(refusal: Refusal) -> bytes:
    """A whole HTTP response that closes the connection, written without h11, since a refusal
    may come before any request head was parsed."""
    body = json.dumps(
        p.error_body(refusal.message, error_type(refusal.status), refusal.code, None)
    ).encode()
    headers = [
        f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if refusal.status == 503:
        headers.append("retry-after: 1")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def head_problem(buffer: bytes, limits: EdgeLimits) -> Refusal | None:
    """What is wrong with the request head at the start of `buffer` (the bytes h11 has not
    parsed yet), or None while it is fine or incomplete but within bounds."""
    buffer = buffer.lstrip(b"\r\n")  # blank lines before a request line are allowed
    end = _HEAD_END.search(buffer)
    head = buffer if end is None else buffer[: end.end()]
    if len(head) > limits.max_header_bytes:
        return Refusal(431, f"the request head exceeds {limits.max_header_bytes} bytes",
                       "request_header_fields_too_large")  # fmt: skip
    if end is None:
        return None
    fields = [line for line in head.split(b"\n")[1:] if line.strip(b"\r")]
    if len(fields) > limits.max_headers:
        return Refusal(431, f"the request has more than {limits.max_headers} header fields",
                       "request_header_fields_too_large")  # fmt: skip
    if any(line[:1] in (b" ", b"\t") for line in fields):
        return Refusal(400, "obsolete line folding in a header field", "invalid_http_request")
    names = [line.split(b":", 1)[0].strip().lower() for line in fields]
    if names.count(b"content-length") > 1:
        return Refusal(400, "more than one Content-Length header", "invalid_http_request")
    if b"content-length" in names and b"transfer-encoding" in names:
        return Refusal(400, "Content-Length and Transfer-Encoding together frame a request "
                       "ambiguously", "invalid_http_request")  # fmt: skip
    return None


def edge_protocol(limits: EdgeLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the limits of the module docstring."""

    class EdgeProtocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            crowded = len(self.connections) >= limits.max_connections
            super().connection_made(transport)
            if crowded:
                self._refuse(Refusal(503, f"the server holds its maximum of "
                                     f"{limits.max_connections} connections; retry later",
                                     "too_many_connections"))  # fmt: skip
                return
            self._arm()

        def handle_events(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                refusal = head_problem(self.conn.trailing_data[0], limits)
                if refusal is not None:
                    self._refuse(refusal)
                    return
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                self._disarm()  # the whole request arrived in time

        def send_400_response(self, msg: str) -> None:
            self._refuse(Refusal(400, "malformed HTTP request", "invalid_http_request"))

        def on_response_complete(self) -> None:
            self._arm()  # first: a pipelined request handled inside disarms it again
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.read_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _timed_out(self) -> None:
            self._deadline = None
            cycle = self.cycle
            if cycle is not None and cycle.response_started and not cycle.response_complete:
                self.transport.close()  # the app is answering already (a 413 mid-body)
                return
            self._refuse(Refusal(408, f"the request was not received within "
                                 f"{limits.read_timeout:g} s", "request_timeout"))  # fmt: skip

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def _refuse(self, refusal: Refusal) -> None:
            """Answers and half-closes, then reads and drops what the client still sends for
            `LINGER_S` before closing: closing with its bytes unread would reset the connection
            and could destroy the answer before the client reads it."""
            if self._refused or self.transport.is_closing():
                return
            self._refused = True
            self._disarm()
            self.transport.write(refusal_bytes(refusal))
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

    return EdgeProtocol
