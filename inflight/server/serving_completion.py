"""POST /v1/completions: prompts as a string, strings, token ids or lists of token ids."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

from inflight.core.outputs import Logprobs
from inflight.errors import InvalidRequestError
from inflight.outputs import RequestOutput
from inflight.server import protocol as p
from inflight.server.serving import (
    DeltaTracker,
    OpenAIServing,
    final_outputs,
    merge_streams,
    prompt_list,
    usage_of,
)


class CompletionServing(OpenAIServing):
    async def _start(self, req: p.CompletionRequest):
        self.check_model(req.model)
        if req.best_of is not None and req.best_of != req.n:
            raise InvalidRequestError(
                f"best_of={req.best_of} is not supported: only best_of equal to n ({req.n})",
                "best_of", "invalid_combination",
            )  # fmt: skip
        if req.echo and req.stream and req.n > 1:
            raise InvalidRequestError("echo with n > 1 is not supported when streaming", "echo",
                                      "invalid_combination")  # fmt: skip
        params = self.sampling_params(req, req.max_tokens or 16, req.logprobs)
        if req.echo and req.logprobs is not None:  # the echoed prompt is scored as well
            scored = max(req.logprobs, req.prompt_logprobs or 0)
            params = dataclasses.replace(params, prompt_logprobs=scored)
        return await self.start(prompt_list(req.prompt), params, req)

    def _prompt_text(self, out: RequestOutput) -> str:
        return out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)

    def _echoed_logprobs(
        self, req: p.CompletionRequest, out: RequestOutput
    ) -> p.CompletionLogprobs:
        """The echoed prompt's part of a choice's logprobs: each prompt token with its score
        (null for the first, as OpenAI's) and its `logprobs` best alternatives."""
        lp = p.CompletionLogprobs()
        if not req.echo or req.logprobs is None or out.prompt_logprobs is None:
            return lp
        offset = 0
        for token_id, entry in zip(out.prompt_token_ids, out.prompt_logprobs, strict=True):
            offset = self._add_position(lp, token_id, entry, offset, req.logprobs)
        return lp

    def _logprobs(
        self, entries: list[Logprobs] | None, offset: int, lp: p.CompletionLogprobs | None = None
    ) -> p.CompletionLogprobs | None:
        """`offset`: where the first entry's token starts in the choice's text (echo included);
        `lp`: entries to go on from (the echoed prompt's). As OpenAI's, each position's
        `top_logprobs` holds the sampled token too (up to `logprobs` + 1 entries)."""
        if entries is None:
            return None
        lp = p.CompletionLogprobs() if lp is None else lp
        for entry in entries:
            offset = self._add_position(lp, entry.token_id, entry, offset, len(entry.top))
        return lp

    def _add_position(
        self, lp: p.CompletionLogprobs, token_id: int, entry: Logprobs | None, offset: int,
        num_top: int,
    ) -> int:  # fmt: skip
        """Appends one token at `offset` with its logprob and its `num_top` best alternatives
        (its own among them); nulls where nothing scores it. Returns the next token's offset."""
        text = self.token_text(token_id)
        lp.tokens.append(text)
        lp.text_offset.append(offset)
        if entry is None:
            lp.token_logprobs.append(None)
            lp.top_logprobs.append(None)
        else:
            lp.token_logprobs.append(entry.logprob)
            top = {self.token_text(t): v for t, v in entry.top[:num_top]}
            top.setdefault(text, entry.logprob)
            lp.top_logprobs.append(top)
        return offset + len(text)

    async def create(self, req: p.CompletionRequest) -> p.CompletionResponse:
        outputs = await final_outputs(await self._start(req))
        choices = []
        for i, out in enumerate(outputs):
            prefix = self._prompt_text(out) if req.echo else ""
            for c in out.outputs:
                echoed = self._echoed_logprobs(req, out)
                choices.append(
                    p.CompletionChoice(
                        index=i * req.n + c.index,
                        text=prefix + c.text,
                        logprobs=self._logprobs(c.logprobs, len(prefix), echoed),
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                        prompt_logprobs=self.prompt_logprobs(req, out),
                    )
                )
        return p.CompletionResponse(
            id=p.new_id("cmpl"), model=self.model_name, choices=choices, usage=usage_of(outputs)
        )

    async def stream(self, req: p.CompletionRequest) -> AsyncGenerator[dict[str, Any], None]:
        """Starts the requests now (errors raise before any byte is sent), streams later."""
        return self._chunks(req, await self._start(req))

    async def _chunks(
        self, req: p.CompletionRequest, streams
    ) -> AsyncGenerator[dict[str, Any], None]:
        rid, tracker, finals = p.new_id("cmpl"), DeltaTracker(), {}
        async for i, out in merge_streams(streams):
            for index, c, text, logprobs, first in tracker.deltas(out, i * req.n):
                echoed = self._prompt_text(out) if req.echo else ""
                offset = len(echoed) + len(c.text) - len(text)  # of the delta's first token
                scored, prompt_logprobs = None, None
                if first:
                    text = echoed + text
                    scored = self._echoed_logprobs(req, out)
                    prompt_logprobs = self.prompt_logprobs(req, out)
                choice = p.CompletionChoice(
                    index=index, text=text, logprobs=self._logprobs(logprobs, offset, scored)
                    if c.logprobs is not None else None,
                    finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                    prompt_logprobs=prompt_logprobs,
                )  # fmt: skip
                yield p.CompletionResponse(
                    id=rid, model=self.model_name, choices=[choice]
                ).model_dump()
            if out.finished:
                finals[i] = out
        if self.wants_usage_chunk(req):
            usage = usage_of(list(finals.values()))
            yield p.CompletionResponse(
                id=rid, model=self.model_name, choices=[], usage=usage
            ).model_dump()
