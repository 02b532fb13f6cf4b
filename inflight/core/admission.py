"""Admission: whether the blocks let a waiting request start, the scheduler's one contract for it.

The scheduler owns seats, the token budget and the queue order; an `Admission` answers for the
KV blocks. Three implementations, picked once from the config by `make_admission`:

- `OnDemand` (the default): a request starts when the blocks of its first chunk can be
  allocated; running requests take blocks as they grow and are preempted when none are left.
- `Reserve`: a request starts only when the blocks of its whole length (prompt + max_tokens)
  are free beside what running requests are still owed (`KVForecast`), so no running request
  ever runs out of blocks.
- `Predictive(base)`: wraps either. A request the base turns away starts anyway when blocks
  that requests certain to end within the horizon hand back cover it. It is then on probation:
  it takes only blocks no ordinary request will need within the horizon, is the first victim
  when blocks run short, and becomes ordinary once the base would have admitted it (on demand:
  its prompt is in; reserve: every reservation fits again).

Nothing here schedules; each hook is a question or a notice from `Scheduler.schedule()` and
`update_from_output()`.
"""

from __future__ import annotations

from typing import Protocol

from inflight.config import SchedulerConfig
from inflight.core.kv_cache_manager import NO_HIT, KVCacheManager, PrefixHit
from inflight.core.kv_forecast import KVForecast
from inflight.core.kv_groups import NULL_BLOCK
from inflight.metrics.stats import AdmissionStats
from inflight.request import Request


class Admission(Protocol):
    """The scheduler's questions and notices about blocks, in the order a step asks them."""

    kv: KVCacheManager
    stats: AdmissionStats

    def start_step(self, running: list[Request]) -> None:
        """Called before anything is scheduled."""

    def token_limit(self, request: Request, running: list[Request]) -> int | None:
        """The most tokens a running request may compute this step (None: no limit)."""

    def preferred_victim(self, running: list[Request], first: int) -> int | None:
        """Index (>= `first`) of the running request to preempt before the policy's choice."""

    def blocks_short(self, request: Request, running: list[Request]) -> bool:
        """Whether blocks stop the request's admission (prefix hits aside): priority
        preemption frees room for it while this holds."""

    def fits(self, request: Request, hit: PrefixHit, running: list[Request]) -> bool:
        """Whether the request may start, beside allocating its first chunk."""

    def when_blocked(
        self, request: Request, hit: PrefixHit, num_new: int, running: list[Request]
    ) -> int:
        """A last chance for a request that does not fit: tokens it starts with (0: it waits)."""

    def on_preempted(self, request: Request) -> None: ...

    def on_sampled(self, request: Request) -> None:
        """The request sampled a token: its prompt is in."""

    def on_finished(self, request: Request) -> None: ...

    def check(self, running: list[Request]) -> None:
        """Asserts this mode's invariant at the end of `schedule()`."""


class OnDemand:
    """Admits on the blocks of the first chunk; the other hooks are no-ops."""

    reserves = False  # whether running requests are owed blocks they have not taken yet

    def __init__(self, kv: KVCacheManager, config: SchedulerConfig) -> None:
        self.kv = kv
        self.stats = AdmissionStats()  # stays zero: only predictive admission counts
        self.config = config
        self.forecast = KVForecast(kv, config.max_model_len, config.chunk_limit)

    def start_step(self, running: list[Request]) -> None: ...

    def fits(self, request: Request, hit: PrefixHit, running: list[Request]) -> bool:
        return True  # the first chunk's allocation decides

    def blocks_short(self, request: Request, running: list[Request]) -> bool:
        first_chunk = min(request.num_tokens - request.num_computed_tokens,
                          self.config.chunk_limit)  # fmt: skip
        return self.kv.pool.num_free_blocks < self.kv.pages_for_span(0, first_chunk)

    def when_blocked(
        self, request: Request, hit: PrefixHit, num_new: int, running: list[Request]
    ) -> int:
        return 0

    def token_limit(self, request: Request, running: list[Request]) -> int | None:
        return None

    def preferred_victim(self, running: list[Request], first: int) -> int | None:
        return None

    def on_preempted(self, request: Request) -> None: ...

    def on_sampled(self, request: Request) -> None: ...

    def on_finished(self, request: Request) -> None: ...

    def covered_by_returns(
        self, request: Request, hit: PrefixHit, running: list[Request], horizon: int
    ) -> bool:
        """Whether blocks handed back within `horizon` steps cover the whole prompt."""
        prompt_left = request.num_tokens - hit.num_blocks * self.kv.block_size
        needed = self.kv.pages_needed(request, prompt_left, hit)
        freed = self.forecast.net_freed_blocks(running, horizon)
        return self.kv.pool.num_free_blocks + freed >= needed

    def check(self, running: list[Request]) -> None: ...


class Reserve(OnDemand):
    """Admits only when the request's whole length fits beside every running reservation."""

    reserves = True

    def shortfall(self, request: Request, hit: PrefixHit, running: list[Request]) -> int:
        """Blocks missing for the request's whole length beside what running requests are owed
        (<= 0: it fits): its longest length's pages, less the hit's pages in full groups that
        other requests hold (its for life, taken from nobody). A windowed group's page counts
        as held only by a sole holder (`num_held_for_reservation`: a window gives a shared
        one back without freeing it): a hit's pages there count as taken from the pool, and
        one that another request held alone until now is owed to that one again."""
        blocks, windows = self.kv.pool.blocks, self.kv.group_windows
        shared = unshared_now = 0
        for table, window in zip(hit.tables, windows, strict=False):
            for b in table:
                if window is None:
                    shared += blocks[b].ref_count > 0
                elif b != NULL_BLOCK:
                    unshared_now += blocks[b].ref_count == 1
        need = self.forecast.final_blocks(request) - shared + unshared_now
        return need - self.forecast.unreserved_blocks(running)

    def fits(self, request: Request, hit: PrefixHit, running: list[Request]) -> bool:
        return self.shortfall(request, hit, running) <= 0

    def blocks_short(self, request: Request, running: list[Request]) -> bool:
        return self.shortfall(request, NO_HIT, running) > 0

    def covered_by_returns(
        self, request: Request, hit: PrefixHit, running: list[Request], horizon: int
    ) -> bool:
        """Whether the reservations of requests ending within `horizon` steps cover it."""
        shortfall = self.shortfall(request, hit, running)
        return self.forecast.returned_reservation(running, horizon) >= shortfall

    def check(self, running: list[Request]) -> None:
        if not self.forecast.probation:
            assert self.forecast.unreserved_blocks(running) >= 0


class Predictive:
    """Admission on a prediction, around a base mode that decides everything else."""

    def __init__(self, base: OnDemand, horizon: int) -> None:
        self.base = base
        self.horizon = horizon
        self.kv, self.forecast = base.kv, base.forecast
        # ids of requests on probation; the forecast leaves them out of what it is sure of
        self.probation: set[str] = base.forecast.probation
        self.stats = AdmissionStats()

    def fits(self, request: Request, hit: PrefixHit, running: list[Request]) -> bool:
        return self.base.fits(request, hit, running)

    def blocks_short(self, request: Request, running: list[Request]) -> bool:
        return self.base.blocks_short(request, running)

    def check(self, running: list[Request]) -> None:
        self.base.check(running)

    def start_step(self, running: list[Request]) -> None:
        """Under a reserving base, probation ends for all once every running reservation fits
        again. With no ordinary request left to hand blocks back, the oldest on probation
        becomes ordinary: it may then preempt the younger ones, so the batch cannot stall."""
        if not self.base.reserves or not self.probation:
            return
        if self.forecast.unreserved_blocks(running) >= 0:
            self.probation.clear()
        elif len(self.probation) == len(running):
            self.probation.discard(running[0].request_id)

    def when_blocked(
        self, request: Request, hit: PrefixHit, num_new: int, running: list[Request]
    ) -> int:
        # A request that was preempted (a failed guess, or anything else) waits for real room:
        # guessing again for it could preempt it again and again.
        if request.num_preemptions or not self.base.covered_by_returns(
            request, hit, running, self.horizon
        ):
            return 0
        room = self.forecast.lowest_free_blocks(running, self.horizon)
        room -= self.kv.num_revived(hit)
        if room < 1:
            return 0
        num_new = min(num_new, self.kv.max_new_tokens(request, room, hit))
        if num_new < 1 or not self.kv.allocate_slots(request, num_new, hit):
            return 0
        self.probation.add(request.request_id)
        self.stats.predictive_admissions += 1
        return num_new

    def token_limit(self, request: Request, running: list[Request]) -> int | None:
        """On probation: its own blocks and the free ones no ordinary request will need within
        the horizon (it takes only room nobody needs, so it preempts nobody)."""
        if request.request_id not in self.probation:
            return None
        lowest = self.forecast.lowest_free_blocks(running, self.horizon)
        return self.kv.max_new_tokens(request, lowest)

    def preferred_victim(self, running: list[Request], first: int) -> int | None:
        """The newest request on probation: a failed guess costs the guess, not a runner."""
        on_probation = [j for j in range(first, len(running))
                        if running[j].request_id in self.probation]  # fmt: skip
        return on_probation[-1] if on_probation else None

    def on_preempted(self, request: Request) -> None:
        if request.request_id in self.probation:
            self.probation.discard(request.request_id)
            self.stats.prediction_failures += 1

    def on_sampled(self, request: Request) -> None:
        if not self.base.reserves:  # on demand: its prompt is in, as if admitted for real
            self.probation.discard(request.request_id)

    def on_finished(self, request: Request) -> None:
        self.probation.discard(request.request_id)


def make_admission(kv: KVCacheManager, config: SchedulerConfig) -> Admission:
    base = (Reserve if config.kv_admission == "reserve" else OnDemand)(kv, config)
    return Predictive(base, config.prediction_horizon) if config.predictive_admission else base
