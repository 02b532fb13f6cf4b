"""ASGI middleware that bounds what one client can cost the server, before any route runs.

- `RequestLimits`: the whole body is read here, so a body over `max_bytes` is a 413 whether its
  length was declared or it arrives in chunks, and a body that stalls for `read_timeout` seconds
  is a 408; the route then gets the body in one piece.
- `AllowedHosts`: a Host header outside the allowed names is a 400 (DNS rebinding: a web page
  whose name resolves to 127.0.0.1 must not reach a server that has no API key).
- `Draining`: once the server is shutting down, every route but /metrics answers 503.
- `RequestId`: every response carries `x-request-id`, the client's own (when it is a short
  printable token) or a fresh one, so a client's log line and the server's meet.

Every refusal is OpenAI's error body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import uuid
from collections.abc import Callable, Iterable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inflight.server import protocol as p
from inflight.server.errors import error_type

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def error_response(
    status: int, message: str, code: str | None = None, param: str | None = None,
    retry_after: int = 1,
) -> JSONResponse:  # fmt: skip
    """OpenAI's error body, its `type` by status (`errors.error_type`); a 429 or 503 says when
    to retry (`Retry-After`, seconds)."""
    headers = {"Retry-After": str(retry_after)} if status in (429, 503) else None
    body = p.error_body(message, error_type(status), code, param)
    return JSONResponse(body, status, headers=headers)


class RequestLimits:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float) -> None:
        self.app, self.max_bytes, self.read_timeout = app, max_bytes, read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = error_response(
            413, f"request body exceeds {self.max_bytes} bytes", "request_too_large"
        )
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await too_large(scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout)
            except TimeoutError:
                timeout = error_response(
                    408, f"the request body stalled for {self.read_timeout:g} s", "request_timeout"
                )
                return await timeout(scope, receive, send)
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                return await too_large(scope, receive, send)
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole: Message | None = {"type": "http.request", "body": b"".join(chunks)}

        async def replay() -> Message:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()  # later calls wait for the disconnect, as streams do

        await self.app(scope, replay, send)


def default_allowed_hosts(host: str, api_key: str | None) -> list[str]:
    """Any Host when a key guards the server or it listens beyond this machine; otherwise only
    loopback names, since that is what DNS rebinding attacks reach."""
    if api_key is not None:
        return ["*"]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    return list(LOOPBACK_NAMES) if loopback else ["*"]


class AllowedHosts:
    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = [h.lower() for h in hosts]
        self.any = "*" in self.hosts

    def allows(self, host_header: str) -> bool:
        if self.any:
            return True
        host = host_header.lower()
        if host.startswith("["):  # [::1]:8000
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return any(name == h or (h.startswith("*.") and name.endswith(h[1:])) for h in self.hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
            if not self.allows(host):
                refusal = error_response(
                    400, f"the Host header {host!r} is not allowed (see --allowed-hosts)",
                    "host_not_allowed",
                )  # fmt: skip
                return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


class Draining:
    """503 for every route except /metrics while `is_draining()`."""

    def __init__(self, app: ASGIApp, is_draining: Callable[[], bool]) -> None:
        self.app, self.is_draining = app, is_draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.is_draining() and scope["path"] != "/metrics":
            refusal = error_response(503, "the server is shutting down", "shutting_down")
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


REQUEST_ID_HEADER = b"x-request-id"
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")


class RequestId:
    """Sets `x-request-id` on every response: the request's own if it is a plain token of at most
    128 characters (anything else could smuggle text into logs), else a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(REQUEST_ID_HEADER, b"")
        request_id = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != REQUEST_ID_HEADER]  # fmt: skip
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
