"""Writes the part of OpenAI's published OpenAPI document that the conformance test validates
against (`tests/server/test_openai_conformance.py`): the response and stream-event schemas of
the routes inflight serves, every schema they reference, without the prose.

    python scripts/openai_spec_subset.py PATH/TO/openapi.json COMMIT

The document is https://github.com/openai/openai-openapi (MIT licence, kept beside the subset
as tests/server/data/openai-openapi.LICENSE); COMMIT names the version it was read from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# what inflight's routes answer, in the document's names
ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
    "Response",
    "ResponseStreamEvent",
)
PROSE = {"description", "example", "examples", "x-oaiMeta", "x-oaiExpandable", "title"}
OUT = Path(__file__).resolve().parent.parent / "tests" / "server" / "data"


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"].rsplit("/", 1)[-1]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def _without_prose(node: Any, names: bool = False) -> Any:
    """`node` without its prose keywords; `names`: a `properties` map, whose keys are field
    names (a field may be called `description`), kept."""
    if isinstance(node, dict):
        return {k: _without_prose(v, names=k == "properties" and not names)
                for k, v in node.items() if names or k not in PROSE}  # fmt: skip
    if isinstance(node, list):
        return [_without_prose(v) for v in node]
    return node


def subset(document: dict[str, Any]) -> dict[str, Any]:
    schemas = document["components"]["schemas"]
    kept: dict[str, Any] = {}
    pending = list(ROOTS)
    while pending:
        name = pending.pop()
        if name not in kept:
            kept[name] = _without_prose(schemas[name])
            pending += _refs(schemas[name])
    return {"components": {"schemas": dict(sorted(kept.items()))}}


def main() -> None:
    source, commit = Path(sys.argv[1]), sys.argv[2]
    document = json.loads(source.read_text())
    out = subset(document)
    out["x-source"] = {"repository": "https://github.com/openai/openai-openapi",
                       "commit": commit, "info.version": document["info"]["version"]}  # fmt: skip
    path = OUT / "openai_openapi_subset.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    print(f"wrote {path}: {len(out['components']['schemas'])} schemas")


if __name__ == "__main__":
    main()
