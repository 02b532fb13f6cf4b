"""Benchmark maths: per-request latencies, percentiles, time-weighted means, run summaries."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inflight.metrics.stats import StepStats


@dataclass(frozen=True)
class RequestRecord:
    prompt_tokens: int
    output_tokens: int
    ttft: float | None  # arrival -> first token, seconds
    e2e: float | None  # arrival -> last token

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def within(self, ttft: float, tpot: float) -> bool:
        """Whether it met both latency targets (seconds): goodput's count."""
        return (self.ttft is not None and self.ttft <= ttft
                and (self.tpot is None or self.tpot <= tpot))  # fmt: skip


@dataclass
class RunResult:
    name: str
    wall_s: float
    requests: list[RequestRecord]
    timeline: list[StepStats] = field(default_factory=list)  # `t`: seconds since the run began
    preemptions: int = 0
    peak_rss_mb: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)  # mode-specific figures, merged into the summary


def percentiles(values: list[float | None], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    present = [v for v in values if v is not None]
    if not present:
        return {}
    return {f"p{q}": float(np.percentile(present, q)) for q in qs} | {
        "mean": float(np.mean(present))
    }


def time_weighted_mean(values: list[float], durations: list[float]) -> float:
    """Mean of a piecewise-constant signal: each value holds for its duration."""
    total = sum(durations)
    if total <= 0:
        return 0.0
    return sum(v * d for v, d in zip(values, durations, strict=True)) / total


def summarize(run: RunResult) -> dict:
    out_tokens = sum(r.output_tokens for r in run.requests)
    all_tokens = out_tokens + sum(r.prompt_tokens for r in run.requests)
    wall = max(run.wall_s, 1e-9)
    summary = {
        "name": run.name,
        "requests": len(run.requests),
        "wall_s": round(run.wall_s, 3),
        "requests_per_s": round(len(run.requests) / wall, 3),
        "output_tokens": out_tokens,
        "output_tok_per_s": round(out_tokens / wall, 2),
        "total_tok_per_s": round(all_tokens / wall, 2),
        "ttft_s": percentiles([r.ttft for r in run.requests]),
        "tpot_s": percentiles([r.tpot for r in run.requests]),
        "e2e_s": percentiles([r.e2e for r in run.requests]),
        "preemptions": run.preemptions,
        "peak_rss_mb": run.peak_rss_mb,
    }
    steps = [s for s in run.timeline if s.num_scheduled_seqs]
    if steps:
        summary["steps"] = len(steps)
        summary["mean_batch_seqs"] = round(float(np.mean([s.num_scheduled_seqs for s in steps])), 2)
        summary["mean_batch_tokens"] = round(
            float(np.mean([s.num_batched_tokens for s in steps])), 2
        )
        summary["kv_usage_time_weighted"] = round(
            time_weighted_mean([s.kv_usage for s in steps], [s.duration_s for s in steps]), 4
        )
        # Padding, recompute after preemption (> 1) and prefix-cache hits (< 1) in one figure: a
        # request needs its prompt and all but its last output token run through the model.
        needed = sum(r.prompt_tokens + r.output_tokens - 1 for r in run.requests)
        if needed > 0:
            computed = sum(s.num_batched_tokens for s in steps)
            summary["computed_per_needed_token"] = round(computed / needed, 3)
    summary.update(run.extra)
    if run.error:
        summary["error"] = run.error
    return summary
