"""POST /v1/responses (and GET / DELETE of stored ones): OpenAI's Responses API over the chat path.

A request becomes a chat completion (`responses_input.py`) and runs as one. The chat result
becomes the Response's output items: a `reasoning` item where the model thinks, a `message` with
`output_text`, and one `function_call` per call. Streamed, the chat chunks become the Responses
events (`response_events.py`), in the order the spec gives.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

from pydantic import BaseModel

from inflight.server import protocol as p
from inflight.server.response_events import (
    Events,
    call_item,
    message_item,
    new_id,
    reasoning_item,
    summary_part,
)
from inflight.server.response_store import ResponseStore
from inflight.server.responses_input import (
    ResponsesRequest,
    TextFormat,
    chat_request,
)
from inflight.server.serving_chat import ChatServing


class ResponsesServing:
    def __init__(self, chat: ChatServing, store: ResponseStore) -> None:
        self.chat, self.store = chat, store

    def _history(self, req: ResponsesRequest, owner: str) -> list[dict[str, Any]]:
        if req.previous_response_id is None:
            return []
        return self.store.get(owner, req.previous_response_id, "previous_response_id").messages

    def _response(
        self,
        req: ResponsesRequest,
        rid: str,
        created: int,
        status: str,
        output: list[dict[str, Any]],
        usage: p.UsageInfo | None,
    ) -> dict[str, Any]:
        fmt = req.text.format if req.text else TextFormat()
        choice = req.tool_choice or "auto"
        # the values the request ran with: unset ones are the model's, then OpenAI's defaults
        ran = self.chat.engine.sampling_defaults.sampling_params(
            temperature=req.temperature, top_p=req.top_p
        )
        response = {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "model": self.chat.model_name,
            "output": output,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "store": req.store,
            "temperature": ran.temperature,
            "top_p": ran.top_p,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)},
            "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else choice,
            "tools": [t.model_dump() for t in req.tools or []],  # strict: null where unsaid
            "metadata": {},
        }
        if usage is not None:  # absent until it is known: the spec's `usage` is never null
            thought = usage.completion_tokens_details
            reasoning_tokens = thought.reasoning_tokens if thought is not None else 0
            response["usage"] = {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
                "input_tokens_details": {
                    "cached_tokens": usage.prompt_tokens_details.cached_tokens,
                    "cache_write_tokens": 0,
                },
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            }
        return response

    def _keep(
        self,
        req: ResponsesRequest,
        owner: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
    ) -> None:
        if req.store:
            self.store.put(owner, response, [*messages, reply])

    async def create(self, req: ResponsesRequest, owner: str) -> dict[str, Any]:
        chat_req = chat_request(req, self._history(req, owner))
        chat = await self.chat.create(chat_req)
        choice = chat.choices[0]
        message = choice.message
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        output = []
        if message.reasoning_content:
            output.append(reasoning_item(new_id("rs"), message.reasoning_content))
        if message.content or not (message.tool_calls or message.reasoning_content):
            # an empty message only where there is nothing else to return, as when streamed
            output.append(message_item(new_id("msg"), message.content or "", status))
        for call in message.tool_calls or []:
            output.append(call_item(call.id, call.function.name, call.function.arguments))
        response = self._response(req, new_id("resp"), int(time.time()), status, output, chat.usage)
        reply = message.model_dump(exclude_none=True, exclude={"reasoning_content", "refusal"})
        self._keep(req, owner, response, _dumped(chat_req.messages), reply)
        return response

    async def stream(
        self, req: ResponsesRequest, owner: str
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Starts now (errors raise before any byte is sent); the events come later."""
        chat_req = chat_request(req, self._history(req, owner))
        chat_req.stream = True
        chat_req.stream_options = p.StreamOptions(include_usage=True)
        chunks = await self.chat.stream(chat_req)
        return self._events(req, owner, chat_req, chunks)

    async def _events(
        self,
        req: ResponsesRequest,
        owner: str,
        chat_req: p.ChatCompletionRequest,
        chunks: AsyncGenerator[dict[str, Any], None],
    ) -> AsyncGenerator[dict[str, Any], None]:
        rid, created, events = new_id("resp"), int(time.time()), Events()
        yield events.make(
            "response.created", response=self._response(req, rid, created, "in_progress", [], None)
        )
        yield events.make(
            "response.in_progress",
            response=self._response(req, rid, created, "in_progress", [], None),
        )
        text, thought, finish = "", "", None
        calls: dict[int, dict[str, Any]] = {}  # tool-call index -> its item
        message_id: str | None = None
        reasoning: dict[str, Any] | None = None  # the reasoning item while its summary streams
        output: list[dict[str, Any]] = []  # items done
        usage = None
        # closed as soon as this stream is (a client that left): its requests are aborted now
        async with contextlib.aclosing(chunks) as chat_chunks:
            async for chunk in chat_chunks:
                if chunk.get("usage"):
                    usage = p.UsageInfo(**chunk["usage"])
                for choice in chunk["choices"]:
                    delta, finish = choice["delta"], choice.get("finish_reason") or finish
                    if piece := delta.get("reasoning_content"):
                        if reasoning is None:
                            reasoning, thought = reasoning_item(new_id("rs"), ""), ""
                            for event in events.open_reasoning(reasoning["id"]):
                                yield event
                        thought += piece
                        yield events.reasoning_delta(reasoning["id"], piece)
                    if reasoning is not None and (delta.get("content") or delta.get("tool_calls")):
                        # the answer begins: the thinking is done
                        for event in self._close_reasoning(events, reasoning, thought, output):
                            yield event
                        reasoning = None
                    if delta.get("content"):
                        if message_id is None:
                            message_id = new_id("msg")
                            for event in events.open_message(message_id):
                                yield event
                        text += delta["content"]
                        yield events.make(
                            "response.output_text.delta",
                            item_id=message_id,
                            output_index=events.index_of(message_id),
                            content_index=0,
                            delta=delta["content"],
                            logprobs=[],
                        )
                    for call in delta.get("tool_calls") or []:
                        item = calls.get(call["index"])
                        if item is None:
                            item = calls[call["index"]] = call_item(
                                call["id"], call["function"]["name"], "", "in_progress"
                            )
                            yield events.added(item)
                        piece = call["function"].get("arguments") or ""
                        item["arguments"] += piece
                        if piece:
                            yield events.make(
                                "response.function_call_arguments.delta",
                                item_id=item["id"],
                                output_index=events.index_of(item["id"]),
                                delta=piece,
                            )
        status = "incomplete" if finish == "length" else "completed"
        if reasoning is not None:  # cut off (or ended) while thinking
            cut = finish == "length"
            for event in self._close_reasoning(events, reasoning, thought, output, cut):
                yield event
        if message_id is None and not calls and not output:  # nothing came: an empty answer
            message_id = new_id("msg")
            for event in events.open_message(message_id):
                yield event
        if message_id is not None:
            done = message_item(message_id, text, status)
            for event in events.close_message(done):
                yield event
            output.append(done)
        for item in calls.values():
            item["status"] = "completed"
            yield events.make(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=events.index_of(item["id"]),
                name=item["name"],
                arguments=item["arguments"],
            )
            yield events.make(
                "response.output_item.done", output_index=events.index_of(item["id"]), item=item
            )
            output.append(item)
        output.sort(key=lambda item: events.index_of(item["id"]))
        response = self._response(req, rid, created, status, output, usage)
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            reply["tool_calls"] = [
                {
                    "id": c["call_id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls.values()
            ]
        self._keep(req, owner, response, _dumped(chat_req.messages), reply)
        yield events.make(f"response.{status}", response=response)

    @staticmethod
    def _close_reasoning(
        events: Events,
        item: dict[str, Any],
        text: str,
        output: list[dict[str, Any]],
        cut: bool = False,
    ) -> list[dict[str, Any]]:
        item["summary"] = [summary_part(text)]
        output.append(item)
        return events.close_reasoning(item, cut)

    def retrieve(self, owner: str, response_id: str) -> dict[str, Any]:
        return self.store.get(owner, response_id).response

    def delete(self, owner: str, response_id: str) -> dict[str, Any]:
        self.store.delete(owner, response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}


def _dumped(messages: list[p.ChatMessage]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude_none=True) for m in messages]
