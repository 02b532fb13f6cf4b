"""Scheduler: decides, every step, which requests compute how many tokens.

One token budget, no phases. Running requests come first, in admission order: a decode wants 1
token, a prefill the rest of its known tokens clamped to the budget and `prefill_chunk_size`;
a prefill chunk never takes the budget that decodes behind it still need. When blocks run out,
the newest running request is preempted by recompute (blocks freed, progress reset, re-queued
at the head) or, in swap mode, by swapping its blocks to CPU memory, and nobody new is admitted
that step. Otherwise waiting requests are admitted while seats (`max_num_seqs`), budget and
blocks last. Whether the blocks let a request in is the admission module's answer
(`admission.py`: on demand, reserve, predictive); the queue order is `policy.py`'s. Where
running requests have a TPOT target, a step's tokens are capped so their decodes keep it
(`slo.py`); `queue_state` is the queue as SLO admission's forecasts read it.

A waiting request starts from the longest prefix of its tokens found in the prefix cache. With
speculation on, a decode may carry draft tokens (`speculation.py`) within the budget that later
decodes do not need; the drafts the model rejects give their blocks back in the update.

Invariants checked at the end of `schedule()`: the budget holds, running <= max_num_seqs, and
the blocks held by block tables are exactly the pool's references (shared blocks once a holder).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable

from inflight.config import SchedulerConfig
from inflight.core.admission import make_admission
from inflight.core.fair_share import FairQueue, TenantShares, fair_victim_index, share_victim
from inflight.core.kv_cache_manager import NO_HIT, KVCacheManager
from inflight.core.outputs import (
    EngineCoreOutput,
    Logprobs,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from inflight.core.policy import RequestQueue, StaticBatchGate, make_queue, victim_index
from inflight.core.slo import (
    MAX_FORECAST_WAITING,
    OutputLengths,
    QueueState,
    check_slo,
    expected_work,
    met_target,
    needs_forecast,
    tpot_token_cap,
)
from inflight.core.speculation import Speculation
from inflight.core.step_cost import StepCostFit
from inflight.metrics.stats import SpeculationStats, StepStats
from inflight.request import FinishReason, Request, RequestStatus


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` is the time source for aging and timestamps (the simulator passes its own)."""
        if config.max_model_len < 1:
            raise ValueError("SchedulerConfig.max_model_len must be resolved before scheduling")
        self.config = config
        self.kv = kv_cache_manager
        self.admission = make_admission(kv_cache_manager, config)
        # step time on tokens, fitted to this engine's steps: speculation weighs drafts with it,
        # SLO admission predicts first tokens with it
        self.step_cost = StepCostFit()
        self.output_lengths = OutputLengths()  # what a request is expected to sample
        by_model = config.speculative_model is not None
        self.speculation = (
            Speculation(config.num_speculative_tokens, by_model, self.step_cost)
            if config.num_speculative_tokens
            else None
        )
        self.clock = clock
        self.requests: dict[str, Request] = {}
        # the tenants' weighted service (what `fair` orders by; counted under every policy, for
        # the metrics), and their requests in the core
        self.shares = TenantShares(dict(config.tenant_weights))
        self._tenant_requests: Counter[str] = Counter()
        # finished requests that met / missed their SLO, per tenant, since the last step record
        self._slo_met: Counter[str] = Counter()
        self._slo_missed: Counter[str] = Counter()
        self.num_added = 0  # requests taken in since the start (the SLO forecast's count)
        if config.scheduling_policy == "fair":
            self.waiting: RequestQueue = FairQueue(self.shares)
        else:
            self.waiting = make_queue(config.scheduling_policy, config.aging_s)
        self.running: list[Request] = []
        self.static_gate = (
            StaticBatchGate(config.max_num_seqs) if config.batching == "static" else None
        )
        self._finished_ids: list[str] = []
        self._swap_out: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self._swapped_ids: list[str] = []
        self.num_preemptions = 0
        self.num_swaps = 0  # preemptions served by swapping rather than recompute

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.num_added += 1
        request.slo = request.slo.over(self.config.default_slo)
        if not self._tenant_requests[request.tenant]:
            self.shares.on_active(request.tenant, +self._tenant_requests)
        self._tenant_requests[request.tenant] += 1
        self.waiting.add(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        self.waiting.prepare(now)
        self.admission.start_step(self.running)
        # Priority preemption happens before anything is scheduled, and does not stop admission:
        # freeing room for a more important request is its purpose.
        priority_preempted = self._preempt_for_priority(now) + self._preempt_for_share(now)
        scheduled: list[ScheduledRequest] = []
        budget, preempted = self._schedule_running(scheduled, self._step_budget(now))
        if not preempted:  # blocks that ran short for a runner are no room for a newcomer
            budget = self._admit_waiting(budget, scheduled, now)
        out = SchedulerOutput(
            scheduled=scheduled,
            preempted_request_ids=priority_preempted + preempted,
            swapped_request_ids=self._swapped_ids,
            swap_out=self._swap_out,
            swap_in=self._swap_in,
            finished_request_ids=self._finished_ids,
            num_batched_tokens=sum(s.num_tokens for s in scheduled),
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=self.kv.usage,
        )
        self._finished_ids, self._swap_out, self._swap_in, self._swapped_ids = [], [], [], []
        self._check_invariants(out)
        return out

    def _step_budget(self, now: float) -> int:
        """The step's tokens: the budget, capped so that decodes with a TPOT target keep it
        (`slo.tpot_token_cap`; prompt chunks always get at least one block)."""
        budget = self.config.max_num_batched_tokens
        floor = sum(1 for r in self.running if r.is_decoding) + self.kv.block_size
        cap = tpot_token_cap(self.running, now, self.step_cost.line(), floor)
        return budget if cap is None else min(budget, cap)

    def _schedule_running(
        self, scheduled: list[ScheduledRequest], budget: int
    ) -> tuple[int, list[str]]:
        """Schedules running requests in admission order within `budget` tokens, preempting
        when blocks run out; returns the budget left and the ids preempted."""
        cfg, preempted = self.config, []
        # Budget still owed to decodes not yet visited, so a prefill chunk never starves them.
        pending_decodes = sum(1 for r in self.running if r.is_decoding)
        i = 0
        while i < len(self.running):
            request = self.running[i]
            remaining = request.num_tokens - request.num_computed_tokens
            if remaining == 1:  # a decode
                pending_decodes -= 1
                num_new = min(1, budget)
            else:
                num_new = min(remaining, budget - pending_decodes, cfg.chunk_limit)
                num_new = self._to_a_saved_state(request, request.num_computed_tokens, num_new)
            limit = self.admission.token_limit(request, self.running)
            if limit is not None:
                num_new = min(num_new, limit)
            if num_new <= 0:
                i += 1
                continue
            drafts = []
            if self.speculation is not None and remaining == 1:
                # within the budget later decodes are owed, and what the request may sample
                room = min(budget - 1 - pending_decodes, request.tokens_left(cfg.max_model_len) - 1,
                           limit - 1 if limit is not None else budget)  # fmt: skip
                drafts = self.speculation.propose(request, room)
                if drafts and not self.kv.allocate_slots(request, 1 + len(drafts)):
                    drafts = []  # no blocks to spare: a plain decode
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop(self._victim_index(i))
                if victim is not request and victim.is_decoding:
                    pending_decodes -= 1
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                scheduled.append(self._scheduled(request, num_new, drafts))
                budget -= num_new + len(drafts)
                i += 1
        return budget, preempted

    def record_step_time(self, out: SchedulerOutput, duration_s: float) -> None:
        """How long the step `out` scheduled took: the step-cost fit learns from it."""
        self.step_cost.observe(out.num_batched_tokens, len(out.scheduled), duration_s,
                               out.num_draft_tokens)  # fmt: skip

    def queue_state(self) -> QueueState:
        """The queue as the SLO forecast reads it (`slo.forecast_ttft`)."""
        cfg, lengths = self.config, self.output_lengths
        return QueueState(
            t=self.clock(),
            running=tuple(expected_work(r, lengths.mean, cfg.max_model_len) for r in self.running),
            waiting=tuple(expected_work(r, lengths.mean, cfg.max_model_len)
                          for r in itertools.islice(self.waiting, MAX_FORECAST_WAITING)),
            line=self.step_cost.line(), max_num_seqs=cfg.max_num_seqs,
            token_budget=cfg.max_num_batched_tokens, chunk_limit=cfg.chunk_limit,
            policy=cfg.scheduling_policy, num_added=self.num_added,
            mean_output=lengths.mean,
        )  # fmt: skip

    def check_slo(self, requests: list[Request], now: float,
                  pending: Iterable[Request] = ()) -> None:  # fmt: skip
        """SLO admission on this scheduler's own queue (the offline engine, the simulator):
        raises SLOUnmetError when one of `requests`, arriving at `now` behind `pending`, would
        miss its TTFT target. The queue is read only where a request has a target to miss."""
        if needs_forecast(requests, self.config):
            check_slo(self.queue_state(), requests, now, self.config, pending)

    def make_stats(self, out: SchedulerOutput, num_sampled: int, duration_s: float) -> StepStats:
        """The record of the step `out` scheduled, after its update: gauges as they are now,
        and the events each component counted since the previous record."""
        spec = self.speculation
        return StepStats(
            t=self.clock(),
            duration_s=duration_s,
            num_batched_tokens=out.num_batched_tokens,
            num_decode_tokens=sum(
                s.num_tokens
                for s in out.scheduled
                if s.num_tokens == 1 + len(s.draft_token_ids)
                and s.start_pos >= len(s.prompt_token_ids)
            ),
            num_sampled_tokens=num_sampled,
            num_scheduled_seqs=len(out.scheduled),
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_swapped=len(self.kv.swapped),
            kv_usage=self.kv.usage,
            kv_blocks_used=self.kv.pool.num_used_blocks,
            num_preempted=len(out.preempted_request_ids),
            prefix_cache=self.kv.prefix_stats.take(),
            admission=self.admission.stats.take(),
            speculation=spec.stats.take() if spec is not None else SpeculationStats(),
            tenant_tokens=self.shares.take(),
            slo_met=self._take(self._slo_met),
            slo_missed=self._take(self._slo_missed),
        )

    @staticmethod
    def _take(counts: Counter[str]) -> dict[str, int]:
        taken = dict(counts)
        counts.clear()
        return taken

    def _victim_index(self, first: int) -> int:
        preferred = self.admission.preferred_victim(self.running, first)
        if preferred is not None:
            return preferred
        if self.config.scheduling_policy == "fair":
            return fair_victim_index(self.running, first, self.shares)
        return victim_index(self.running, first, self.config.scheduling_policy)

    def _preempt_for_priority(self, now: float) -> list[str]:
        """Under `priority`: while seats or blocks are short for the best waiting request and a
        running one has a strictly worse priority, preempt the worst running one. (Never in
        static batching, which by definition runs its batch to the end.)"""
        seats = self.config.max_num_seqs

        def short(head: Request) -> bool:
            return len(self.running) >= seats or self.admission.blocks_short(head, self.running)

        def victim(head: Request) -> int | None:
            j = self._victim_index(0)
            return j if self.running[j].priority > head.priority else None

        return self._preempt_for_head("priority", now, short, victim)

    def _preempt_for_share(self, now: float) -> list[str]:
        """Under `fair`: while every seat is taken and the least-served tenant's waiting request
        belongs to a tenant holding fewer seats than its share (by weight, among tenants with
        work), preempt the newest request of the tenant most over its share (no better a
        priority class). Without it a tenant that returns to a saturated engine waits for a
        flood's requests to end before its first seat."""
        seats = self.config.max_num_seqs

        def victim(head: Request) -> int | None:
            j = share_victim(self.running, head, seats, self.waiting, self.shares)
            return j if j is not None and self.running[j].priority >= head.priority else None

        return self._preempt_for_head("fair", now, lambda _: len(self.running) >= seats, victim)

    def _preempt_for_head(
        self, policy: str, now: float, short: Callable[[Request], bool],
        victim: Callable[[Request], int | None],
    ) -> list[str]:  # fmt: skip
        """Under `policy`, before anything is scheduled: while room is `short` for the head of
        the waiting queue and `victim` names a running request to make it, preempt that one.
        (Never in static batching, which by definition runs its batch to the end.)"""
        if self.config.scheduling_policy != policy or self.static_gate is not None:
            return []
        if not self.waiting or not self.running:
            return []
        head, preempted = self.waiting.peek(), []
        while self.running and short(head):
            j = victim(head)
            if j is None:
                break
            request = self.running.pop(j)
            self._preempt(request)
            preempted.append(request.request_id)
        if preempted:
            self.waiting.prepare(now)  # victims went to the head; put them in their place
        return preempted

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest], now: float) -> int:
        """Admits in queue order and stops at the first request that does not fit (no skipping
        ahead), except that static batching passes over requests outside the current batch."""
        for request in list(self.waiting):
            if not budget or len(self.running) >= self.config.max_num_seqs:
                break
            if self.static_gate is not None and not self.static_gate.admits(request, self.waiting):
                continue
            hit = NO_HIT
            if self.kv.is_swapped(request):  # resume from swap space: its KV comes back
                if not self.admission.fits(request, NO_HIT, self.running):
                    break
                num_new = min(request.num_tokens - request.num_computed_tokens, budget,
                              self.config.chunk_limit)  # fmt: skip
                copies = self.kv.swap_in(request, num_new)
                if copies is None:
                    break
                self._swap_in += copies
            else:
                hit = self.kv.get_computed_blocks(request)
                num_cached = hit.num_blocks * self.kv.block_size
                start = request.num_computed_tokens + num_cached
                num_new = min(request.num_tokens - start, budget, self.config.chunk_limit)
                num_new = self._to_a_saved_state(request, start, num_new)
                if not (
                    self.admission.fits(request, hit, self.running)
                    and self.kv.allocate_slots(request, num_new, hit)
                ):
                    num_new = self.admission.when_blocked(request, hit, num_new, self.running)
                    if not num_new:
                        break
                if request.num_computed_tokens == 0:
                    self.kv.record_lookup(request.num_tokens, num_cached)
                    request.num_cached_tokens = num_cached
                request.num_computed_tokens += num_cached
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            scheduled.append(self._scheduled(request, num_new, state_row=hit.state_row))
            budget -= num_new
        return budget

    def _to_a_saved_state(self, request: Request, start: int, num_new: int) -> int:
        """A prompt chunk of a state-carrying model (`KVCacheManager.snapshots`) that would run
        past one of the request's state boundaries (`KVCacheManager.state_boundaries`) ends
        there instead, so that the state after it is saved at the next step's start
        (`StateSnapshots`), unless it is already."""
        if self.kv.snapshots is None:
            return num_new
        for end in self.kv.state_boundaries(request):
            if start < end < start + num_new and not self.kv.state_saved_at(request, end):
                return end - start
        return num_new

    def _scheduled(
        self, request: Request, num_new: int, drafts: list[int] | None = None,
        state_row: int | None = None,
    ) -> ScheduledRequest:  # fmt: skip
        """The request's step, with the state a hit resumes from (`state_row`) and the state it
        saves first (`KVCacheManager.state_to_save`), where its model carries one."""
        step = ScheduledRequest.of(request, num_new, self.kv.get_block_tables(request.request_id),
                                   drafts)  # fmt: skip
        step.state_restore = state_row
        step.state_save = self.kv.state_to_save(request)
        return step

    def _preempt(self, request: Request) -> None:
        """Swap the KV out to CPU blocks when in swap mode and they suffice; otherwise recompute:
        drop the KV, keep the tokens. Either way the request goes back to the head of the queue."""
        self.admission.on_preempted(request)
        if self.config.preemption_mode == "swap" and self.kv.can_swap_out(request):
            self._swap_out += self.kv.swap_out(request)
            self._swapped_ids.append(request.request_id)
            self.num_swaps += 1
        else:
            self.kv.free(request)
            request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_front(request)

    def _check_invariants(self, out: SchedulerOutput) -> None:
        cfg = self.config
        assert out.num_batched_tokens == sum(s.num_tokens for s in out.scheduled)
        assert out.num_batched_tokens <= cfg.max_num_batched_tokens
        assert len(self.running) <= cfg.max_num_seqs
        held = sum(self.kv.num_held(request_id) for request_id in self.kv.block_tables)
        pool = self.kv.pool
        assert held == pool.num_refs, (held, pool.num_refs)  # shared blocks count once a holder
        assert pool.num_used_blocks <= held
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
        swap_space = self.kv.cpu_pool
        if swap_space is not None and (out.swap_out or out.swap_in or out.finished_request_ids):
            # a block there has one owner (counted again only where the space changed)
            assert swap_space.num_used_blocks == self.kv.num_swap_blocks_held
        assert set(out.swapped_request_ids) <= set(out.preempted_request_ids)
        self.admission.check(self.running)

    # ------------------------------------------------------------------ update
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Advances progress, appends sampled tokens, finishes requests that hit a stop or that
        the runner failed on."""
        outputs: list[EngineCoreOutput] = []
        now = self.clock()
        if runner_output.drafter_seconds and self.speculation is not None:
            self.speculation.cost.observe_drafter(
                runner_output.drafter_seconds, scheduler_output.num_draft_tokens
            )
        for s in scheduler_output.scheduled:
            request = self.requests[s.request_id]
            self.shares.on_served(request.tenant, s.num_tokens)  # computed, failed or not
            scored = runner_output.prompt_logprobs.get(s.request_id)
            if scored is not None:
                _add_prompt_logprobs(request, *scored)
            error = runner_output.failed.get(s.request_id)
            if error is not None:  # its KV is not cached: the blocks go back as they are
                self._finish(request, FinishReason.ERROR, error, now)
                outputs.append(EngineCoreOutput.of(request, [], []))
                continue
            embedding = runner_output.embeddings.get(s.request_id)
            if embedding is not None:  # an embedding model's request is done with its prompt
                request.num_computed_tokens += s.num_tokens
                request.first_token_time = now
                self._finish(request, FinishReason.STOP, None, now)
                outputs.append(EngineCoreOutput.of(request, [], [], embedding=embedding))
                continue
            token_id = runner_output.sampled_token_ids.get(s.request_id)
            if token_id is None:  # mid-prefill: nothing sampled yet
                request.num_computed_tokens += s.num_tokens
                self.kv.cache_full_blocks(request)
                continue
            new_token_ids, reason, stop_reason = self._append(
                request, s, runner_output.accepted_draft_ids.get(s.request_id, []), token_id
            )
            prompt_logprobs = None
            if request.first_token_time is None:
                request.first_token_time = now
                if request.sampling_params.prompt_logprobs is not None:
                    prompt_logprobs = request.prompt_logprobs
            if s.request_id in runner_output.grammar_complete:  # even under ignore_eos
                reason, stop_reason = FinishReason.STOP, None
            logprobs = runner_output.logprobs.get(s.request_id)
            if reason is not None:
                self._finish(request, reason, stop_reason, now)
            outputs.append(EngineCoreOutput.of(
                request, new_token_ids, [logprobs] if logprobs else [], prompt_logprobs
            ))  # fmt: skip
        return outputs

    def _append(
        self, request: Request, s: ScheduledRequest, accepted: list[int], token_id: int
    ) -> tuple[list[int], FinishReason | None, int | None]:
        """Appends the drafts the runner kept and its sampled token, up to the first stop; the
        KV of the kept tokens counts as computed, the rejected drafts' slots go back."""
        new_token_ids: list[int] = []
        reason, stop_reason = None, None
        for token in [*accepted, token_id]:
            request.output_token_ids.append(token)
            new_token_ids.append(token)
            reason, stop_reason = request.stop_after(token, self.config.max_model_len)
            if reason is not None:
                break
        drafted = len(s.draft_token_ids)
        # the last sampled token and every kept draft but the last appended token have KV now
        request.num_computed_tokens += s.num_tokens - drafted + len(new_token_ids) - 1
        if drafted:
            self.kv.trim(request)
            assert self.speculation is not None
            self.speculation.on_verified(request.request_id, drafted, len(accepted))
        self.kv.cache_full_blocks(request)
        self.admission.on_sampled(request)
        return new_token_ids, reason, stop_reason

    def finish_requests(
        self, request_ids: list[str], reason: FinishReason, stop_reason: str | None = None
    ) -> list[EngineCoreOutput]:
        """Ends requests from outside the step (abort, stop string); unknown ids are ignored."""
        outputs = []
        now = self.clock()
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            self._finish(request, reason, stop_reason, now)
            outputs.append(EngineCoreOutput.of(request, [], []))
        return outputs

    def _finish(
        self, request: Request, reason: FinishReason, stop_reason: int | str | None, now: float
    ) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.stop_reason = stop_reason
        request.finished_time = now
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.output_lengths.observe(request.num_output_tokens)
            met = met_target(request)
            if met is not None:
                (self._slo_met if met else self._slo_missed)[request.tenant] += 1
        self.kv.free(request)
        del self.requests[request.request_id]
        self._tenant_requests[request.tenant] -= 1
        self._finished_ids.append(request.request_id)
        self.admission.on_finished(request)
        if self.speculation is not None:
            self.speculation.on_finished(request.request_id)
        if self.static_gate is not None:
            self.static_gate.on_finished(request.request_id)


def _add_prompt_logprobs(request: Request, first_index: int, entries: list[Logprobs]) -> None:
    """Appends the scores of prompt tokens it lacks: a prompt computed again after a
    preemption scores its tokens again, and the first scores stand."""
    known = len(request.prompt_logprobs) + 1  # the first prompt token is never scored
    if first_index <= known:
        request.prompt_logprobs.extend(entries[known - first_index :])
