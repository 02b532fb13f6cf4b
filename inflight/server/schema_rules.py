"""JSON Schema for rules between a request's fields, so the OpenAPI document states what the
request models' validators and the handlers enforce (`openapi.py` is the rest of it)."""

from __future__ import annotations

from typing import Any

SET = {"not": {"type": "null"}}  # a field given, not null


def not_both(a: str, b: str) -> dict[str, Any]:
    """`a` and `b` are not both set (null counts as unset)."""
    return {"not": {"required": [a, b], "properties": {a: SET, b: SET}}}


def tools_for_tool_choice(*tools: str, choices: tuple[str, ...] = ("tool_choice",)) -> dict:
    """A tool_choice other than none needs a tool (`tool_calls.resolve_tool_choice`)."""
    unset = {"anyOf": [{"const": "none"}, {"type": "null"}]}
    return {"anyOf": [
        *({"required": [name], "properties": {name: {"type": "array", "minItems": 1}}}
          for name in tools),
        {"properties": dict.fromkeys(choices, unset)},
    ]}  # fmt: skip


def needs_when(field: str, values: list[str], needed: str) -> dict[str, Any]:
    """`needed` is an object unless `field` is one of `values`."""
    return {"anyOf": [
        {"properties": {field: {"enum": values}}},
        {"required": [needed], "properties": {needed: {"type": "object"}}},
    ]}  # fmt: skip


def only_with(field: str, other: str, value: Any) -> dict[str, Any]:
    """`field` is unset unless `other` is `value`."""
    return {"anyOf": [
        {"properties": {field: {"type": "null"}}},
        {"required": [other], "properties": {other: {"const": value}}},
    ]}  # fmt: skip
