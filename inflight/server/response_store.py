"""Stored responses of the Responses API: what `previous_response_id` continues from, and what
`GET` / `DELETE /v1/responses/{id}` read.

In memory and bounded twice, by count and by bytes (each entry's JSON size), the oldest evicted
first: a client that never deletes cannot grow the server. Each entry belongs to the API key that
created it (a digest of it, never the key itself); another key sees no such response, exactly as
for an unknown id.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from inflight.server.errors import ResponseNotFoundError


def owner_of(authorization: str | None) -> str:
    """The owner of what a request stores: a digest of its credentials ("" without any)."""
    return hashlib.sha256(authorization.encode()).hexdigest() if authorization else ""


@dataclass(frozen=True)
class StoredResponse:
    owner: str
    response: dict[str, Any]  # the Response object as it was returned
    messages: list[dict[str, Any]]  # the conversation so far, as chat messages, reply included
    size: int


class ResponseStore:
    def __init__(self, max_count: int = 1024, max_bytes: int = 64 * 2**20) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, owner: str, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        size = len(json.dumps([response, messages], ensure_ascii=False).encode())
        if size > self.max_bytes:
            return  # larger than the whole store: not kept (a later continuation gets a 404)
        self._drop(response["id"])
        self._entries[response["id"]] = StoredResponse(owner, response, messages, size)
        self.num_bytes += size
        while len(self._entries) > self.max_count or self.num_bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def get(self, owner: str, response_id: str, param: str | None = None) -> StoredResponse:
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            raise ResponseNotFoundError(f"no response with id {response_id!r}", param)
        return entry

    def delete(self, owner: str, response_id: str) -> None:
        self.get(owner, response_id)
        self._drop(response_id)

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.num_bytes -= entry.size
