"""Draft-model speculation, the runner's side: a small model sharing the target's tokenizer
writes the drafts the scheduler made room for, just before the target's forward pass.

The drafter has its own KV tensors, laid out block for block like the target's pool, and reads
and writes them through the target's block tables and slots: no block accounting of its own.
Its KV is filled lazily: when a request drafts, a first pass runs the drafter over the tokens it
has not seen yet (the whole prompt the first time, after that the last sampled token and any
kept draft it never ran), and each further pass feeds one draft back in. So `k` drafts cost `k`
drafter passes, batched over every drafting request.

Drafts are the drafter's greedy choice, a deterministic function of the tokens so far, so the
verifier keeps the target's distribution exactly as it does for n-gram drafts. What the drafter
computes can only make drafts better or worse, never change an output: a stale or shared
block's drafter KV costs acceptance, not correctness.
"""

from __future__ import annotations

import dataclasses

import torch

from inflight.attention import AttentionBackend
from inflight.core.outputs import ScheduledRequest
from inflight.model.llama import LlamaModel
from inflight.runner.kv_cache import KVCache
from inflight.runner.step_inputs import build_step_inputs


class Drafter:
    def __init__(
        self, model: LlamaModel, kv_cache: KVCache, attn_backend: AttentionBackend,
        device: torch.device,
    ) -> None:  # fmt: skip
        self.model = model
        self.kv_cache = kv_cache
        self.attn_backend = attn_backend
        self.device = device
        # request -> how many of its leading tokens have valid drafter KV
        self._computed: dict[str, int] = {}

    def drop(self, request_ids: list[str]) -> None:
        """Forgets requests that finished or were preempted (their blocks, and so the drafter
        KV in them, are gone or moved)."""
        for request_id in request_ids:
            self._computed.pop(request_id, None)

    def fill(self, scheduled: list[ScheduledRequest]) -> list[ScheduledRequest]:
        """`scheduled` with every drafting request's placeholder drafts replaced by the
        drafter's. Nothing is remembered until `commit`: a step that fails and runs again
        recomputes the same drafts into the same slots."""
        drafting = [s for s in scheduled if s.draft_token_ids]
        if not drafting:
            return scheduled
        passes = [self._catch_up(s) for s in drafting]
        drafts: list[list[int]] = [[] for _ in drafting]
        rows = list(range(len(drafting)))  # the requests that still draft
        while rows:
            tokens = self._run([passes[row] for row in rows])
            still = []
            for row, token in zip(rows, tokens, strict=True):
                drafts[row].append(token)
                if len(drafts[row]) < len(drafting[row].draft_token_ids):
                    passes[row] = self._next(passes[row], token)
                    still.append(row)
            rows = still
        filled = {s.request_id: d for s, d in zip(drafting, drafts, strict=True)}
        return [
            dataclasses.replace(
                s, token_ids=s.token_ids[: -len(d)] + d, draft_token_ids=d
            ) if (d := filled.get(s.request_id)) else s
            for s in scheduled
        ]  # fmt: skip

    def warm_up(self, scheduled: list[ScheduledRequest]) -> None:
        """The runner's warm-up batch through the drafter too (its K/V in the scratch block)."""
        self._run(scheduled)

    def commit(self, s: ScheduledRequest, num_kept: int) -> None:
        """After verification: the drafter's KV is valid up to the last sampled token and the
        kept drafts it ran (the last draft is only ever an output)."""
        last = s.start_pos + 1  # tokens up to and including the last sampled one
        self._computed[s.request_id] = last + min(num_kept, len(s.draft_token_ids) - 1)

    def _catch_up(self, s: ScheduledRequest) -> ScheduledRequest:
        """The first pass of a drafting request: every token the drafter has not run, up to the
        last sampled one (`s.start_pos`, a decode's position)."""
        done = min(self._computed.get(s.request_id, 0), s.start_pos)
        end, n_prompt = s.start_pos + 1, len(s.prompt_token_ids)
        outputs = s.output_token_ids[max(0, done - n_prompt) : max(0, end - n_prompt)]
        tokens = s.prompt_token_ids[done:end] + outputs
        return dataclasses.replace(s, token_ids=tokens, start_pos=done, draft_token_ids=[])

    @staticmethod
    def _next(s: ScheduledRequest, token: int) -> ScheduledRequest:
        return dataclasses.replace(s, token_ids=[token], start_pos=s.start_pos + s.num_tokens)

    def _run(self, passes: list[ScheduledRequest]) -> list[int]:
        inputs = build_step_inputs(passes, self.kv_cache.block_size, self.attn_backend,
                                   self.device, score_prompts=False)  # fmt: skip
        logits = self.model(inputs.input_ids, inputs.positions, self.kv_cache.layers,
                            inputs.attn_metadata, inputs.logits_indices)  # fmt: skip
        return logits.argmax(dim=-1).tolist()
