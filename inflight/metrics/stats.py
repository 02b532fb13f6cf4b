"""The step record: what one scheduler step did, and running totals over steps.

One record for every reader: `Scheduler.make_stats()` builds it after a step's update from the
gauges and from the events each component counted (prefix cache, admission, speculation: each
keeps its own `EventCounts`), the engine adds its wall time and phases, and the Prometheus
metrics, the dashboard's feed, `inflight bench` and the simulator all read the same fields.
Pure data (core and engine import it; it imports nothing of theirs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Self


@dataclass
class EventCounts:
    """Running totals of one component's events, kept by the component that counts them. A
    step's record takes what was counted since the previous take (`take()`); the totals stay
    for whoever reads them whole (tests, the simulator's summary)."""

    _taken: Self | None = field(default=None, init=False, repr=False, compare=False)

    def take(self) -> Self:
        """The counts since the last take (the first take: since the start)."""
        before = self._taken
        counted = [f.name for f in fields(self) if f.init]
        delta = type(self)(**{
            n: getattr(self, n) - (getattr(before, n) if before is not None else 0)
            for n in counted
        })  # fmt: skip
        self._taken = replace(self)
        return delta


@dataclass
class PrefixCacheStats(EventCounts):
    """Counted by the KV cache manager."""

    queries: int = 0  # prompt tokens looked up in the prefix cache
    hits: int = 0  # of those, found cached


@dataclass
class AdmissionStats(EventCounts):
    """Counted by predictive admission (on-demand and reserve admission count nothing)."""

    predictive_admissions: int = 0  # requests admitted early on blocks about to be freed
    prediction_failures: int = 0  # of requests so admitted, preempted


@dataclass
class SpeculationStats(EventCounts):
    """Counted by speculative decoding."""

    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of those, kept
    declined: int = 0  # lookups that found a draft not worth its step time


@dataclass(slots=True)
class StepStats:
    """Every count is 0 unless the step did it (a step that scheduled nothing is all zeros)."""

    t: float = 0.0  # the scheduler's clock when the step ended (a simulation's: simulated)
    duration_s: float = 0.0  # wall time of the step (a simulation's: simulated)
    num_batched_tokens: int = 0
    num_decode_tokens: int = 0  # of those, decodes (one new token of a request past its prompt)
    num_sampled_tokens: int = 0  # tokens sampled (decodes, and prompt chunks that end a prompt)
    num_scheduled_seqs: int = 0
    # gauges after the update (finished requests already gone)
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    kv_usage: float = 0.0
    kv_blocks_used: int = 0
    # events of this step
    num_preempted: int = 0
    # each component's events, made by the component (`EventCounts.take`)
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    admission: AdmissionStats = field(default_factory=AdmissionStats)
    speculation: SpeculationStats = field(default_factory=SpeculationStats)
    tenant_tokens: dict[str, int] = field(default_factory=dict)  # computed, per tenant
    # requests that finished this step within / past their latency targets, per tenant
    slo_met: dict[str, int] = field(default_factory=dict)
    slo_missed: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase, when profiled

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_batched_tokens - self.num_decode_tokens

    def belt_row(self) -> list[float]:
        """The dashboard's belt: [t, step ms, prefill tokens, decode tokens, sequences, KV
        usage]."""
        return [round(self.t, 3), round(self.duration_s * 1000, 2), self.num_prefill_tokens,
                self.num_decode_tokens, self.num_scheduled_seqs,
                round(self.kv_usage, 4)]  # fmt: skip


@dataclass(slots=True)
class StepTotals:
    """Running sums over steps (a simulated fleet's utilizations)."""

    num_steps: int = 0
    num_preemptions: int = 0
    busy_s: float = 0.0
    seat_s: float = 0.0  # sequences x seconds: busy seats over time

    def add(self, step: StepStats) -> None:
        self.num_steps += 1
        self.num_preemptions += step.num_preempted
        self.busy_s += step.duration_s
        self.seat_s += step.num_scheduled_seqs * step.duration_s


@dataclass(frozen=True, slots=True)
class CoreGauges:
    """An engine core's sequences and blocks at one moment."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_usage: float
    kv_blocks_used: int
    kv_blocks_total: int


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    """What a dashboard shows of a core: its gauges, each pool block's state (one character a
    block), the swap space's used blocks, and a row per request ([id, state, priority, prompt
    tokens, output tokens, blocks, age s])."""

    gauges: CoreGauges
    block_map: str
    swap_map: str
    requests: list[list[Any]]
