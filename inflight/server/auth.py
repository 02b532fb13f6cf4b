"""The API-key guards: route dependencies that raise `Unauthorized` (a 401 in OpenAI's shape)."""

# No `from __future__ import annotations`: FastAPI reads these signatures again in a Ray Serve
# gateway, from functions pickled by value whose globals hold only the names their code uses.

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request


class Unauthorized(Exception):
    pass


Guard = Callable[[Request], Awaitable[None]]


def _matches(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def api_key_guard(api_key: str | None) -> Guard:
    """`Authorization: Bearer <key>` (no key configured: every request passes)."""

    async def require_api_key(request: Request) -> None:
        if api_key is None:
            return
        if not _matches(request.headers.get("authorization", ""), f"Bearer {api_key}"):
            raise Unauthorized

    return require_api_key


def api_key_or_query_guard(api_key: str | None) -> Guard:
    """The dashboard's guard: a browser cannot add a header to a page or an EventSource, so the
    key may also come as `?api_key=`."""
    header_guard = api_key_guard(api_key)

    async def require_api_key_or_query(request: Request) -> None:
        if api_key is None:
            return
        if not _matches(request.query_params.get("api_key", ""), api_key):
            await header_guard(request)

    return require_api_key_or_query
