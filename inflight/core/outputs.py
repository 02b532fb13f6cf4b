"""Messages between scheduler, model runner and engine front (plain data, no tensors).

Lists inside these messages (token ids, block tables) are shared with the core's own state to
keep a step cheap: receivers read them and never mutate them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inflight.request import FinishReason, Logprobs, Request
from inflight.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: compute `token_ids` at positions `start_pos...`."""

    request_id: str
    token_ids: list[int]  # the tokens to run this step (a prompt chunk, or the last sampled one)
    start_pos: int  # == num_computed_tokens before this step
    block_table: list[int]
    sample: bool  # True when this chunk reaches the end of the known tokens
    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: frozenset[int] = frozenset()
    grammar: Any = None  # its compiled constraint (xgrammar), or None
    # speculative tokens after the request's last sampled one (a decode's `token_ids` end with
    # them): logits come back for every position from the last sampled token on
    draft_token_ids: list[int] = field(default_factory=list)
    # the tables of the other KV groups (core/kv_groups.py), after `block_table`'s group 0;
    # empty for a model of one group
    group_tables: list[list[int]] = field(default_factory=list)
    # a state-carrying model's (core/state_snapshots.py): the snapshot row its state resumes
    # from (a prefix hit's), and the one its state so far is saved into, before the step runs
    state_restore: int | None = None
    state_save: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_logprob_positions(self) -> range:
        """Positions of this step whose logits score a prompt token (the next position's), for
        a request that wants prompt logprobs; empty otherwise."""
        if self.sampling_params.prompt_logprobs is None:
            return range(0)
        last_scoring = len(self.prompt_token_ids) - 1  # its logits score the first output
        return range(self.start_pos, min(self.start_pos + self.num_tokens, last_scoring))

    @classmethod
    def of(
        cls, request: Request, num_new: int, block_tables: list[list[int]],
        drafts: list[int] | None = None,
    ) -> ScheduledRequest:  # fmt: skip
        """The request's next `num_new` tokens from its progress (a recompute may span prompt
        and earlier outputs), then `drafts` to verify."""
        start = request.num_computed_tokens
        end = start + num_new
        n_prompt = request.num_prompt_tokens
        if start >= n_prompt:
            token_ids = request.output_token_ids[start - n_prompt : end - n_prompt]
        elif end <= n_prompt:
            token_ids = request.prompt_token_ids[start:end]
        else:
            token_ids = request.all_token_ids[start:end]
        return cls(
            request_id=request.request_id,
            token_ids=token_ids + drafts if drafts else token_ids,
            start_pos=start,
            block_table=block_tables[0],
            sample=end == request.num_tokens,
            sampling_params=request.sampling_params,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            eos_token_ids=request.eos_token_ids,
            grammar=request.grammar,
            draft_token_ids=drafts or [],
            group_tables=block_tables[1:],
        )


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    # those of them whose KV went to swap space (a state-carrying model's runner keeps their
    # state in host memory beside it, `ConvState.swap_out`); the others start again
    swapped_request_ids: list[str] = field(default_factory=list)
    # KV copies to run before the forward, in this order: (device, cpu) out, then (cpu, device) in
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Requests that left the core since the last step; the runner drops their per-request state.
    finished_request_ids: list[str] = field(default_factory=list)
    num_batched_tokens: int = 0
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0

    @property
    def num_draft_tokens(self) -> int:
        """Draft tokens verified this step (what drafting adds to it)."""
        return sum(len(s.draft_token_ids) for s in self.scheduled)


@dataclass(slots=True)
class ModelRunnerOutput:
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    # requests the step failed on when run alone: id -> the error, for their client
    failed: dict[str, str] = field(default_factory=dict)
    # constrained requests whose grammar is complete with this step's token: they stop
    grammar_complete: set[str] = field(default_factory=set)
    # speculating requests: the drafts kept, which come before their sampled token
    accepted_draft_ids: dict[str, list[int]] = field(default_factory=dict)
    drafter_seconds: float = 0.0  # the draft model's passes this step (what drafting costs)
    # requests that want prompt logprobs: (index of the prompt token the first entry scores,
    # an entry per prompt token of this step's chunk from there)
    prompt_logprobs: dict[str, tuple[int, list[Logprobs]]] = field(default_factory=dict)
    # an embedding model's requests whose prompts are done: their pooled, normalized vectors
    embeddings: dict[str, list[float]] = field(default_factory=dict)

    def merge(self, other: ModelRunnerOutput) -> None:
        self.drafter_seconds += other.drafter_seconds
        self.embeddings.update(other.embeddings)
        self.prompt_logprobs.update(other.prompt_logprobs)
        self.sampled_token_ids.update(other.sampled_token_ids)
        self.accepted_draft_ids.update(other.accepted_draft_ids)
        self.logprobs.update(other.logprobs)
        self.failed.update(other.failed)
        self.grammar_complete.update(other.grammar_complete)


@dataclass(slots=True)
class EngineCoreOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[Logprobs] = field(default_factory=list)
    # with its first token, when asked for: the logprob of every prompt token after the first
    prompt_logprobs: list[Logprobs] | None = None
    embedding: list[float] | None = None  # an embedding model's request, once it is done
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def of(
        cls, request: Request, new_token_ids: list[int], logprobs: list[Logprobs],
        prompt_logprobs: list[Logprobs] | None = None, embedding: list[float] | None = None,
    ) -> EngineCoreOutput:  # fmt: skip
        return cls(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            new_logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            embedding=embedding,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
            num_preemptions=request.num_preemptions,
            num_cached_tokens=request.num_cached_tokens,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
        )
