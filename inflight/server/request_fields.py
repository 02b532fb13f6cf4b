"""The fields of a request body beyond those the handlers read.

OpenAI answers a field it does not know with a 400 ("Unrecognized request argument supplied"),
and so does this server: a misspelt `max_token` silently ignored would turn into a different
request. Three kinds of field OpenAI defines are not errors, each for its own reason:
- `IGNORED`: fields whose meaning lets a server ignore them (an end-user id, metadata for
  OpenAI's dashboard, storage and latency tiers, prompt-cache hints); accepted and dropped.
- `UNSUPPORTED`: fields whose meaning this server cannot honour (an insertion suffix, audio,
  web search): a 400 that names them, so a client can fall back (editors' completion extensions
  retry without `suffix`).
- The legacy `functions` / `function_call`, declared on the chat request and mapped onto
  `tools` / `tool_choice` there.

`--allow-unknown-fields` accepts unknown fields too, for clients that send extras of their own.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from inflight.errors import InvalidRequestError

IGNORED = frozenset({
    "user", "metadata", "store", "service_tier", "reasoning_effort", "prediction", "verbosity",
    "safety_identifier", "prompt_cache_key",
})  # fmt: skip

UNSUPPORTED = {
    "suffix": "insertion (suffix) is not supported by this server",
    "audio": "audio output is not supported by this server",
    "web_search_options": "web search is not supported by this server",
    # the Responses API's
    "background": "background responses are not supported by this server",
    "conversation": "conversations are not supported by this server (use previous_response_id)",
    "prompt": "prompt templates are not supported by this server",
    "max_tool_calls": "max_tool_calls is not supported by this server",
    "top_logprobs": "logprobs are not supported on /v1/responses by this server",
}


def check_extra_fields(request: BaseModel, allow_unknown: bool = False) -> None:
    """Raises InvalidRequestError for the first field of `request` (a model that keeps extra
    fields) that is unsupported or, unless `allow_unknown`, unknown."""
    for name, value in (request.model_extra or {}).items():
        if name in IGNORED:
            continue
        if name in UNSUPPORTED:
            raise InvalidRequestError(UNSUPPORTED[name], param=name)
        if name == "modalities":
            _check_modalities(value)
            continue
        if not allow_unknown:
            shown = _shown(name)
            raise InvalidRequestError(f"Unrecognized request argument supplied: {shown}", shown)


def _shown(name: str, limit: int = 64) -> str:
    """A client's field name as an error may echo it: printable, and not a page long."""
    if name.isprintable() and len(name) <= limit:
        return name
    return repr(name[:limit]) + ("..." if len(name) > limit else "")


def _check_modalities(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise InvalidRequestError("modalities must be a list of strings", "modalities")
    others = sorted(set(value) - {"text"})
    if others:
        raise InvalidRequestError(
            f"modalities {', '.join(map(repr, others))} are not supported by this server "
            "(text only)", "modalities",
        )  # fmt: skip
