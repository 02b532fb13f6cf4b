"""Scheduler: decides, every step, which requests compute how many tokens.

One token budget, no phases. Running requests come first, in admission order: a decode wants 1
token, a prefill the rest of its known tokens clamped to the budget and `prefill_chunk_size`;
a prefill chunk never takes the budget that decodes behind it still need. When blocks run out,
the newest running request is preempted by recompute (blocks freed, progress reset, re-queued
at the head) or, in swap mode, by swapping its blocks to CPU memory, and nobody new is admitted
that step. Otherwise waiting requests are admitted while seats (`max_num_seqs`), budget and
blocks last: on demand (the default), the blocks of the first chunk; under
`kv_admission="reserve"`, the blocks of the whole prompt + max_tokens beside what running
requests are still owed (`KVForecast`), so no running request ever runs out of blocks.
Predictive admission lets a request in early on blocks that requests about to end will free.

A waiting request starts from the longest prefix of its tokens found in the prefix cache.

Invariants checked at the end of `schedule()`: the budget holds, running <= max_num_seqs, and
the blocks held by block tables are exactly the pool's references (shared blocks once a holder).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inflight.config import SchedulerConfig
from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.kv_forecast import KVForecast
from inflight.core.outputs import (
    EngineCoreOutput,
    ModelRunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from inflight.core.policy import StaticBatchGate, make_queue, victim_index
from inflight.core.sizing import cdiv
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
        self.forecast = KVForecast(kv_cache_manager, config.max_model_len)
        self.clock = clock
        self.requests: dict[str, Request] = {}
        self.waiting = make_queue(config.scheduling_policy, config.aging_s)
        self.running: list[Request] = []
        self.static_gate = (
            StaticBatchGate(config.max_num_seqs) if config.batching == "static" else None
        )
        self._finished_ids: list[str] = []
        self._swap_out: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self.num_preemptions = 0
        self.num_swaps = 0  # preemptions served by swapping rather than recompute
        self.num_predictive_admissions = 0
        self.num_prediction_failures = 0  # predictively admitted requests preempted mid-prompt

    # ------------------------------------------------------------------ intake
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
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
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        now = self.clock()
        self.waiting.prepare(now)
        self._end_probation()
        # Priority preemption happens before anything is scheduled, and does not stop admission:
        # freeing room for a more important request is its purpose.
        priority_preempted = self._preempt_for_priority(now)

        # Budget still owed to decodes not yet visited, so a prefill chunk never starves them.
        pending_decodes = sum(1 for r in self.running if r.is_decoding)
        i = 0
        while i < len(self.running):
            request = self.running[i]
            remaining = request.num_tokens - request.num_computed_tokens
            is_decode = remaining == 1
            if is_decode:
                pending_decodes -= 1
                num_new = min(1, budget)
            else:
                num_new = min(remaining, budget - pending_decodes, cfg.chunk_limit)
            if request.admitted_on_prediction:  # takes only room nobody needs; preempts nobody
                num_new = min(num_new, self._probation_room(request))
            if num_new <= 0:
                i += 1
                continue
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running.pop(self._victim_index(i))
                if victim is not request and victim.is_decoding:
                    pending_decodes -= 1
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            else:
                scheduled.append(self._scheduled(request, num_new, now))
                budget -= num_new
                i += 1

        if not preempted:
            budget = self._admit_waiting(budget, scheduled, now)

        out = SchedulerOutput(
            scheduled=scheduled,
            preempted_request_ids=priority_preempted + preempted,
            swap_out=self._swap_out,
            swap_in=self._swap_in,
            finished_request_ids=self._finished_ids,
            num_batched_tokens=cfg.max_num_batched_tokens - budget,
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=self.kv.usage,
        )
        self._finished_ids, self._swap_out, self._swap_in = [], [], []
        self._check_invariants(out)
        return out

    def _victim_index(self, first: int) -> int:
        return victim_index(self.running, first, self.config.scheduling_policy)

    def _preempt_for_priority(self, now: float) -> list[str]:
        """Under `priority`: while seats or blocks are short for the best waiting request and a
        running one has a strictly worse priority, preempt the worst running one. (Never in
        static batching, which by definition runs its batch to the end.)"""
        if (
            self.config.scheduling_policy != "priority"
            or self.static_gate is not None
            or not self.waiting
            or not self.running
        ):
            return []
        head = self.waiting.peek()
        preempted = []
        while self.running and (
            len(self.running) >= self.config.max_num_seqs or self._blocks_short(head)
        ):
            j = self._victim_index(0)
            if self.running[j].priority <= head.priority:
                break
            victim = self.running.pop(j)
            self._preempt(victim)
            preempted.append(victim.request_id)
        if preempted:
            self.waiting.prepare(now)  # victims went to the head; put them in their place
        return preempted

    def _blocks_short(self, request: Request) -> bool:
        """Whether blocks stop a waiting request's admission (prefix hits aside)."""
        if self.config.kv_admission == "reserve":
            return self._reservation_shortfall(request, []) > 0
        first_chunk = min(request.num_tokens - request.num_computed_tokens,
                          self.config.chunk_limit)  # fmt: skip
        return self.kv.pool.num_free_blocks < cdiv(first_chunk, self.kv.block_size)

    def _reservation_shortfall(self, request: Request, computed_blocks: list[int]) -> int:
        """Under `reserve`: blocks missing for the request's whole length beside what running
        requests are owed (<= 0: it fits)."""
        need = self.forecast.final_blocks(request) - len(computed_blocks)
        need += self.kv.num_revived(computed_blocks)
        return need - self.forecast.unreserved_blocks(self.running)

    def _fits(self, request: Request, computed_blocks: list[int]) -> bool:
        return self.config.kv_admission != "reserve" or (
            self._reservation_shortfall(request, computed_blocks) <= 0
        )

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest], now: float) -> int:
        """Admits in queue order and stops at the first request that does not fit (no skipping
        ahead), except that static batching passes over requests outside the current batch."""
        for request in list(self.waiting):
            if not budget or len(self.running) >= self.config.max_num_seqs:
                break
            if self.static_gate is not None and not self.static_gate.admits(request, self.waiting):
                continue
            if self.kv.is_swapped(request):  # resume from swap space: its KV comes back
                if not self._fits(request, []):
                    break
                num_new = min(request.num_tokens - request.num_computed_tokens, budget,
                              self.config.chunk_limit)  # fmt: skip
                copies = self.kv.swap_in(request, num_new)
                if copies is None:
                    break
                self._swap_in += copies
            else:
                computed_blocks = self.kv.get_computed_blocks(request)
                num_cached = len(computed_blocks) * self.kv.block_size
                remaining = request.num_tokens - request.num_computed_tokens - num_cached
                num_new = min(remaining, budget, self.config.chunk_limit)
                if not (
                    self._fits(request, computed_blocks)
                    and self.kv.allocate_slots(request, num_new, computed_blocks)
                ):
                    num_new = self._admit_on_prediction(request, computed_blocks, num_new)
                    if not num_new:
                        break
                if request.num_computed_tokens == 0:
                    self.kv.record_lookup(request.num_tokens, num_cached)
                request.num_computed_tokens += num_cached
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
            scheduled.append(self._scheduled(request, num_new, now))
            budget -= num_new
        return budget

    def _admit_on_prediction(
        self, request: Request, computed_blocks: list[int], num_new: int
    ) -> int:
        """Admits a request that blocks stop, if what running requests certain to end within
        the horizon hand back covers it: on demand, its whole prompt; under `reserve`, its
        reservation. It goes on probation: it takes only blocks no ordinary request will need
        within the horizon, and is the first preempted if the guess fails. Returns the tokens
        scheduled (0: not admitted)."""
        cfg, kv, forecast = self.config, self.kv, self.forecast
        # A request that was preempted (a failed guess, or anything else) waits for real room:
        # guessing again for it could preempt it again and again.
        if not cfg.predictive_admission or request.num_preemptions:
            return 0
        horizon, bs = cfg.prediction_horizon, kv.block_size
        revived = kv.num_revived(computed_blocks)
        if cfg.kv_admission == "reserve":
            shortfall = self._reservation_shortfall(request, computed_blocks)
            covered = forecast.returned_reservation(self.running, horizon) >= shortfall
        else:
            needed = cdiv(request.num_tokens - len(computed_blocks) * bs, bs) + revived
            freed = forecast.net_freed_blocks(self.running, horizon)
            covered = kv.pool.num_free_blocks + freed >= needed
        room = forecast.lowest_free_blocks(self.running, horizon) - revived
        if not covered or room < 1:
            return 0
        num_new = min(num_new, room * bs)
        if not self.kv.allocate_slots(request, num_new, computed_blocks):
            return 0
        request.admitted_on_prediction = True
        self.num_predictive_admissions += 1
        return num_new

    def _probation_room(self, request: Request) -> int:
        """Tokens a request admitted on a prediction may add now: its own blocks and the free
        ones no ordinary request will need within the horizon."""
        held = len(self.kv.get_block_table(request.request_id))
        lowest = self.forecast.lowest_free_blocks(self.running, self.config.prediction_horizon)
        return (held + lowest) * self.kv.block_size - request.num_computed_tokens

    def _end_probation(self) -> None:
        """Under `reserve`, requests admitted on a prediction become ordinary once every
        running request's reservation fits again (on demand: once their prompt is in). With
        no ordinary request left to hand blocks back, the oldest on probation becomes ordinary:
        it may then preempt the younger ones, so the batch cannot stall."""
        if self.config.kv_admission != "reserve":
            return
        on_probation = [r for r in self.running if r.admitted_on_prediction]
        if not on_probation:
            return
        if self.forecast.unreserved_blocks(self.running) >= 0:
            for r in on_probation:
                r.admitted_on_prediction = False
        elif len(on_probation) == len(self.running):
            on_probation[0].admitted_on_prediction = False

    def _scheduled(self, request: Request, num_new: int, now: float) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        n_prompt = request.num_prompt_tokens
        if start >= n_prompt:
            token_ids = request.output_token_ids[start - n_prompt : end - n_prompt]
        elif end <= n_prompt:
            token_ids = request.prompt_token_ids[start:end]
        else:  # a recompute spanning prompt and earlier outputs
            token_ids = request.all_token_ids[start:end]
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=token_ids,
            start_pos=start,
            block_table=self.kv.get_block_table(request.request_id),
            sample=end == request.num_tokens,
            sampling_params=request.sampling_params,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            eos_token_ids=request.eos_token_ids,
            grammar=request.grammar,
        )

    def _preempt(self, request: Request) -> None:
        """Swap the KV out to CPU blocks when in swap mode and they suffice; otherwise recompute:
        drop the KV, keep the tokens. Either way the request goes back to the head of the queue."""
        if request.admitted_on_prediction:
            request.admitted_on_prediction = False
            self.num_prediction_failures += 1
        if self.config.preemption_mode == "swap" and self.kv.can_swap_out(request):
            self._swap_out += self.kv.swap_out(request)
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
        held = sum(len(t) for t in self.kv.block_tables.values())
        pool = self.kv.pool
        assert held == pool.num_refs, (held, pool.num_refs)  # shared blocks count once a holder
        assert pool.num_used_blocks <= held
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
        if cfg.kv_admission == "reserve" and not any(
            r.admitted_on_prediction for r in self.running
        ):
            assert self.forecast.unreserved_blocks(self.running) >= 0

    # ------------------------------------------------------------------ update
    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Advances progress, appends sampled tokens, finishes requests that hit a stop or that
        the runner failed on."""
        outputs: list[EngineCoreOutput] = []
        now = self.clock()
        for s in scheduler_output.scheduled:
            request = self.requests[s.request_id]
            error = runner_output.failed.get(s.request_id)
            if error is not None:  # its KV is not cached: the blocks go back as they are
                self._finish(request, FinishReason.ERROR, error, now)
                outputs.append(self._core_output(request, [], []))
                continue
            request.num_computed_tokens += s.num_tokens
            self.kv.cache_full_blocks(request)
            token_id = runner_output.sampled_token_ids.get(s.request_id)
            if token_id is None:
                continue  # mid-prefill: nothing sampled yet
            request.output_token_ids.append(token_id)
            if self.config.kv_admission == "on-demand":  # its prompt is in: an ordinary runner
                request.admitted_on_prediction = False
            if request.first_token_time is None:
                request.first_token_time = now
            reason, stop_reason = self._check_stop(request, token_id)
            if s.request_id in runner_output.grammar_complete:  # even under ignore_eos
                reason, stop_reason = FinishReason.STOP, None
            logprobs = runner_output.logprobs.get(s.request_id)
            if reason is not None:
                self._finish(request, reason, stop_reason, now)
            outputs.append(self._core_output(request, [token_id], [logprobs] if logprobs else []))
        return outputs

    def _check_stop(
        self, request: Request, token_id: int
    ) -> tuple[FinishReason | None, int | None]:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return FinishReason.STOP, None
            if token_id in params.stop_token_ids:
                return FinishReason.STOP, token_id
        if request.num_output_tokens >= params.max_tokens:
            return FinishReason.LENGTH, None
        if request.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

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
            outputs.append(self._core_output(request, [], []))
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
        self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)
        if self.static_gate is not None:
            self.static_gate.on_finished(request.request_id)

    @staticmethod
    def _core_output(
        request: Request, new_token_ids: list[int], logprobs: list
    ) -> EngineCoreOutput:
        return EngineCoreOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            new_logprobs=logprobs,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
            num_preemptions=request.num_preemptions,
            arrival_time=request.arrival_time,
            first_scheduled_time=request.first_scheduled_time,
            first_token_time=request.first_token_time,
            finished_time=request.finished_time,
        )
