"""The step record: what one scheduler step did, and running totals over steps.

One record for every reader: `Scheduler.make_stats()` builds it after a step's update, the
engine adds its wall time and phases, and the Prometheus metrics, the dashboard's feed,
`inflight bench` and the simulator all read the same fields. Pure data (core and engine import
it; it imports nothing of theirs).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    num_prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    num_prefix_hits: int = 0  # of those, found cached
    num_predictive_admissions: int = 0  # requests admitted early on blocks about to be freed
    num_prediction_failures: int = 0  # of requests so admitted, preempted
    num_draft_tokens: int = 0  # speculative tokens verified
    num_accepted_tokens: int = 0  # of those, kept
    num_drafts_declined: int = 0  # lookups that found a draft not worth its step time
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
