"""The API-key guards: route dependencies that raise `Unauthorized` (a 401 in OpenAI's shape)."""

# No `from __future__ import annotations`: FastAPI reads these signatures again in a Ray Serve
# gateway, from functions pickled by value whose globals hold only the names their code uses.

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request

from inflight.server.tenants import TENANT_HEADER, Tenancy


class Unauthorized(Exception):
    pass


Guard = Callable[[Request], Awaitable[None]]


def _matches(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def api_key_guard(api_key: str | None, tenancy: Tenancy | None = None) -> Guard:
    """`Authorization: Bearer <key>`, the `api_key` or one of the keys file's (none configured:
    every request passes); tells `tenancy` what the request says of its tenant."""
    keys = tenancy.keys if tenancy is not None else {}

    async def require_api_key(request: Request) -> None:
        given = request.headers.get("authorization", "")
        key = given.removeprefix("Bearer ") if given.startswith("Bearer ") else None
        if api_key is not None or keys:
            known = api_key is not None and _matches(given, f"Bearer {api_key}")
            # every listed key is compared, so the time taken tells nothing of which matched
            listed = [k for k in keys if key is not None and _matches(key, k)]
            if not (known or listed):
                raise Unauthorized
            key = listed[0] if listed else None
        if tenancy is not None:
            tenancy.on_request(key, request.headers.get(TENANT_HEADER))

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
