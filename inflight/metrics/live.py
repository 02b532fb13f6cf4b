"""LiveFeed: what the dashboard shows, handed from the engine thread to the event loop without
either waiting on the other.

The engine thread appends each step's record (`StepStats`) and, while someone watches, refreshes
the block map and the table of live requests at most `DETAIL_HZ` times a second. The event loop
records finished requests and refusals. Readers copy under a lock held for microseconds, and
`state` turns the last `window_s` seconds into the dashboard's numbers (percentiles by rank).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from inflight.metrics.stats import CoreSnapshot, StepStats

DETAIL_HZ = 4


@dataclass(frozen=True, slots=True)
class FinishedSample:
    t: float
    queue_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None
    prompt_tokens: int
    output_tokens: int


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


class LiveFeed:
    def __init__(self, max_steps: int = 4000, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._steps: deque[StepStats] = deque(maxlen=max_steps)
        self._finished: deque[FinishedSample] = deque(maxlen=20_000)
        self._refusals: deque[tuple[float, str]] = deque(maxlen=20_000)
        self.watchers = 0  # open dashboards; details are refreshed only while > 0
        self._detail_t = float("-inf")
        self.block_map = ""
        self.swap_map = ""
        self.requests: list[list[Any]] = []

    def __getstate__(self) -> dict[str, Any]:
        """A consistent copy without the lock (a replica's feed is shipped to the gateway)."""
        with self._lock:
            state = {k: v for k, v in self.__dict__.items() if k != "_lock"}
            for name in ("_steps", "_finished", "_refusals"):
                state[name] = deque(state[name], maxlen=state[name].maxlen)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writers
    def add_step(self, step: StepStats) -> None:
        with self._lock:
            self._steps.append(step)

    def wants_detail(self, now: float) -> bool:
        return self.watchers > 0 and now - self._detail_t >= 1 / DETAIL_HZ

    def set_detail(self, snapshot: CoreSnapshot, now: float) -> None:
        self.block_map, self.swap_map = snapshot.block_map, snapshot.swap_map
        self.requests = snapshot.requests
        self._detail_t = now

    def add_finished(self, sample: FinishedSample) -> None:
        with self._lock:
            self._finished.append(sample)

    def add_refusal(self, t: float, reason: str) -> None:
        with self._lock:
            self._refusals.append((t, reason))

    # ------------------------------------------------------------------ reader
    def steps_after(self, t: float, limit: int) -> list[StepStats]:
        with self._lock:
            steps = [s for s in self._steps if s.t > t]
        return steps[-limit:]

    def state(self, now: float) -> dict[str, Any]:
        """The dashboard's numbers over the last `window_s` seconds."""
        start = now - self.window_s
        with self._lock:
            steps = [s for s in self._steps if s.t > start]
            finished = [f for f in self._finished if f.t > start]
            refusals = [r for _, r in self._refusals if _ > start]
        span = min(self.window_s, now - steps[0].t + steps[0].duration_s) if steps else 1.0
        span = max(span, 1e-3)
        latest = steps[-1] if steps else None
        queries = sum(s.prefix_cache.queries for s in steps)
        hits = sum(s.prefix_cache.hits for s in steps)
        drafted = sum(s.speculation.drafted for s in steps)

        def quantiles(attr: str) -> dict[str, float | None]:
            values = [v for f in finished if (v := getattr(f, attr)) is not None]
            return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}

        tenants: dict[str, dict[str, float]] = {}
        for s in steps:
            for field_name, counts in (("tokens", s.tenant_tokens), ("met", s.slo_met),
                                       ("missed", s.slo_missed)):  # fmt: skip
                for tenant, n in counts.items():
                    row = tenants.setdefault(tenant, {"tokens": 0, "met": 0, "missed": 0})
                    row[field_name] += n
        tenant_rows = [[tenant, round(row["tokens"] / span, 1), row["met"], row["missed"],
                        round(row["met"] / span, 3)]
                       for tenant, row in sorted(tenants.items())]  # fmt: skip

        return {
            "queue": {
                "running": latest.num_running if latest else 0,
                "waiting": latest.num_waiting if latest else 0,
                "swapped": latest.num_swapped if latest else 0,
                "wait_s": quantiles("queue_s"),
            },
            "latency": {"ttft_s": quantiles("ttft_s"), "tpot_s": quantiles("tpot_s"),
                        "e2e_s": quantiles("e2e_s"), "finished": len(finished)},
            "throughput": {
                "prompt_tok_per_s": sum(s.num_prefill_tokens for s in steps) / span,
                "generated_tok_per_s": sum(s.num_sampled_tokens for s in steps) / span,
                "steps_per_s": len(steps) / span,
            },
            "events": {
                "preemptions_per_s": sum(s.num_preempted for s in steps) / span,
                "prefix_hit_rate": hits / queries if queries else None,
                "draft_acceptance": (sum(s.speculation.accepted for s in steps) / drafted
                                     if drafted else None),
                "drafts_declined": sum(s.speculation.declined for s in steps),
                "rejected": refusals.count("queue_full"),
                "slo_refused": refusals.count("slo_unmet"),
                "timeouts": refusals.count("timeout"),
            },
            "kv": {"usage": latest.kv_usage if latest else 0.0, "blocks": self.block_map,
                   "swapped": self.swap_map},
            "requests": self.requests,
            # [tenant, tokens/s, met targets, missed, goodput req/s], by name
            "tenants": tenant_rows,
        }  # fmt: skip
