"""The Responses API's output items, and the events that stream them in the spec's order:
created, in_progress, then per item added / deltas / done, then completed (or incomplete). A
reasoning item streams as its summary's text (the model's thinking, as it comes)."""

from __future__ import annotations

import uuid
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": new_id("fc"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "summary": [summary_part(text)]}


def summary_part(text: str) -> dict[str, Any]:
    return {"type": "summary_text", "text": text}


class Events:
    """Numbers events in order and keeps each output item's index."""

    def __init__(self) -> None:
        self.sequence = 0
        self._indices: dict[str, int] = {}

    def make(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def index_of(self, item_id: str) -> int:
        return self._indices[item_id]

    def added(self, item: dict[str, Any]) -> dict[str, Any]:
        self._indices[item["id"]] = len(self._indices)
        return self.make(
            "response.output_item.added", output_index=self._indices[item["id"]], item=item
        )

    def open_message(self, item_id: str) -> list[dict[str, Any]]:
        item = message_item(item_id, "", "in_progress")
        item["content"] = []
        part = output_text("")
        return [
            self.added(item),
            self.make(
                "response.content_part.added",
                item_id=item_id,
                output_index=self._indices[item_id],
                content_index=0,
                part=part,
            ),
        ]

    def close_message(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        index, part = self._indices[item["id"]], item["content"][0]
        return [
            self.make(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            ),
            self.make(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            ),
            self.make("response.output_item.done", output_index=index, item=item),
        ]

    def open_reasoning(self, item_id: str) -> list[dict[str, Any]]:
        item = {"id": item_id, "type": "reasoning", "summary": []}
        added = self.added(item)
        return [added, self.make("response.reasoning_summary_part.added", item_id=item_id,
                                 output_index=self._indices[item_id], summary_index=0,
                                 part=summary_part(""))]  # fmt: skip

    def reasoning_delta(self, item_id: str, delta: str) -> dict[str, Any]:
        return self.make("response.reasoning_summary_text.delta", item_id=item_id,
                         output_index=self._indices[item_id], summary_index=0,
                         delta=delta)  # fmt: skip

    def close_reasoning(self, item: dict[str, Any], cut: bool = False) -> list[dict[str, Any]]:
        """`cut`: generation stopped while the model was thinking (the part is incomplete)."""
        index, part = self._indices[item["id"]], item["summary"][0]
        where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        status = {"status": "incomplete"} if cut else {}
        return [
            self.make("response.reasoning_summary_text.done", **where, text=part["text"]),
            self.make("response.reasoning_summary_part.done", **where, part=part, **status),
            self.make("response.output_item.done", output_index=index, item=item),
        ]
