"""What one engine step did, and running totals over steps: read by the engine's metrics, the
dashboard's feed and `inflight bench` (below the engine, so metrics never import it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepStats:
    """What one step did, for metrics and benchmarks."""

    num_batched_tokens: int
    num_decode_tokens: int  # of those, decodes (one new token of a request past its prompt)
    num_sampled_tokens: int  # tokens sampled (decodes, and prompt chunks that end a prompt)
    num_scheduled_seqs: int
    num_running: int
    num_waiting: int
    kv_usage: float
    kv_blocks_used: int
    num_preempted: int
    num_prefix_queries: int  # prompt tokens looked up in the prefix cache this step
    num_prefix_hits: int  # of those, found cached
    num_predictive_admissions: int  # requests admitted early on blocks about to be freed
    num_prediction_failures: int  # of requests so admitted, preempted this step
    duration_s: float


@dataclass(slots=True)
class StepTotals:
    """Running sums over every step that scheduled work (effective batch size = seqs / steps)."""

    num_steps: int = 0
    num_scheduled_seqs: int = 0
    num_batched_tokens: int = 0
    num_preemptions: int = 0
    busy_s: float = 0.0

    def add(self, step: StepStats) -> None:
        self.num_steps += 1
        self.num_scheduled_seqs += step.num_scheduled_seqs
        self.num_batched_tokens += step.num_batched_tokens
        self.num_preemptions += step.num_preempted
        self.busy_s += step.duration_s

    @property
    def mean_batch_seqs(self) -> float:
        return self.num_scheduled_seqs / max(1, self.num_steps)
