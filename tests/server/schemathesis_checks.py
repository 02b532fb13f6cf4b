"""A schemathesis check, loaded through SCHEMATHESIS_HOOKS: a request that is valid by the
server's own /openapi.json is never refused with a 400, except for what depends on the model
(its vocabulary, its context length, its chat template) and for rules JSON Schema cannot state
(`best_of` equal to `n`, a named tool among `tools`, distinct tool names, a client's schema,
regex or grammar that compiles), which the document describes in words. Those refusals carry
their own `error.code`s.

schemathesis' own `positive_data_acceptance` cannot make that exception, and it trusts the
generator: an integer bound near 2**63 passes through a float there and comes out past the
bound. So the body is validated here again, exactly, before a 400 counts against the server.
"""

from __future__ import annotations

import functools
import json
import os

import httpx
import jsonschema_rs
import schemathesis

# `error.code`s of the refusals the document states in words only (see the docstring)
STATED_IN_WORDS = {
    "context_length_exceeded", "outside_vocabulary", "chat_template_error",
    "invalid_combination", "invalid_grammar", "model_not_supported",
}  # fmt: skip


@functools.cache
def document() -> dict:
    return httpx.get(os.environ["INFLIGHT_OPENAPI_URL"]).json()


@functools.cache
def body_validator(method: str, path: str) -> jsonschema_rs.Draft202012Validator | None:
    operation = document()["paths"][path][method.lower()]
    content = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if content is None:
        return None
    schema = {**content["schema"], "components": document()["components"]}
    return jsonschema_rs.Draft202012Validator(schema)


@schemathesis.check
def schema_valid_requests_are_accepted(ctx, response, case):
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return None
    if response.status_code != 400:
        return None
    validator = body_validator(case.operation.method, case.operation.path)
    sent = response.request.body  # what went out: the generator's floats are exact integers here
    if validator is not None and sent and not validator.is_valid(json.loads(sent)):
        return None  # the generator's slip, not a schema-valid request
    error = response.json()["error"]
    if error.get("code") in STATED_IN_WORDS:
        return None
    raise AssertionError(f"a schema-valid request got 400: {error['message']}")
