"""The OpenAPI document, as strict as the server: a client generated from it, or a fuzzer, is
never refused a request the document allows. Rules between fields are in `schema_rules`; the rules
JSON Schema cannot state carry `error.code`s of their own (docs/reliability.md lists them)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from inflight.sampling_params import MAX_INT64, MAX_SEED, MIN_SEED
from inflight.server.openai_routes import CHECKED_REQUESTS
from inflight.server.request_fields import IGNORED

_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BIG_BOUNDS = {float(b): b for b in (MAX_INT64, -MAX_INT64 - 1, MIN_SEED, MAX_SEED)}


def exact_bounds(node: Any) -> Any:
    """The document with integer bounds as integers: FastAPI's OpenAPI model stores every bound
    as a float, which turns 2**63 - 1 into 2**63, so a client or fuzzer reading the document
    would send a value one past what the server takes."""
    if isinstance(node, list):
        return [exact_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    fixed = {key: exact_bounds(value) for key, value in node.items()}
    for key in _BOUND_KEYS:
        value = fixed.get(key)
        if isinstance(value, float) and value.is_integer():
            fixed[key] = _BIG_BOUNDS.get(value, int(value)) if abs(value) >= 2**53 else int(value)
    return fixed


def openapi_document(app: FastAPI, allow_unknown_fields: bool = False) -> dict[str, Any]:
    """FastAPI's document, as strict as the server: less the 422 it adds to every route (this
    server answers 400), and with the generation requests' accepted extra fields declared."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for model in CHECKED_REQUESTS:
            document_fields(components[model.__name__], allow_unknown_fields)
        app.openapi_schema = exact_bounds(schema)
    return app.openapi_schema


def document_fields(schema: dict[str, Any], allow_unknown: bool = False) -> None:
    """Declares in a request model's JSON Schema (in place) the fields `check_extra_fields`
    accepts beyond the model's own, and, unless `allow_unknown`, that no other is allowed."""
    properties = schema.setdefault("properties", {})
    for name in sorted(IGNORED):
        properties.setdefault(name, {"description": "accepted and ignored"})
    properties.setdefault("modalities", {
        "anyOf": [{"type": "array", "items": {"const": "text"}}, {"type": "null"}],
        "description": "text only",
    })  # fmt: skip
    schema["additionalProperties"] = allow_unknown
