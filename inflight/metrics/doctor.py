"""The doctor: rules of thumb over a metrics history, each hint with its evidence and the flag.

A history is a list of `Snapshot`s (every `inflight_` sample at one time, parsed from the
Prometheus text, so a running server's `/metrics` and the engine's own registry read alike).
`window` turns a history into what the rules read: counters and histograms as deltas between
the first and the last snapshot, gauges averaged over all of them. Each rule is a pure function
of a `Window` returning a `Hint` or None; `diagnose` runs them all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Snapshot:
    t: float  # seconds, any clock shared by the history
    samples: dict[SampleKey, float]

    @classmethod
    def parse(cls, t: float, text: str) -> Snapshot:
        samples: dict[SampleKey, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return cls(t, samples)

    def value(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def labelled(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {labels: v for (n, labels), v in self.samples.items() if n == name}


@dataclass(frozen=True)
class Hint:
    rule: str
    severity: str  # "warning" (costs throughput or latency now) or "info"
    message: str
    flag: str  # what to change, as the flag to pass
    evidence: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Window:
    """What the rules read: a history's counters as deltas, its gauges as means."""

    seconds: float
    steps: float
    knobs: dict[str, str]
    kv_usage_max: float
    kv_usage_mean: float
    running_mean: float
    waiting_mean: float
    preemptions: float
    batch_seqs_mean: float
    batch_tokens_mean: float
    queue_time_mean: float
    ttft_mean: float
    itl_p50: float
    itl_p99: float
    prefix_queries: float
    prefix_hits: float
    rejected: float
    tenant_tokens: dict[str, float] = field(default_factory=dict)  # computed, per tenant
    slo_met: float = 0.0  # finished within their latency targets
    slo_missed: float = 0.0  # finished past one

    def knob(self, name: str, default: float) -> float:
        try:
            return float(self.knobs[name])
        except (KeyError, ValueError):
            return default


def _delta(first: Snapshot, last: Snapshot, name: str) -> float:
    return last.value(name) - first.value(name)


def _labelled_delta(first: Snapshot, last: Snapshot, name: str) -> float:
    """A labelled counter's growth, summed over its labels."""
    return sum(v - first.samples.get((name, k), 0.0) for k, v in last.labelled(name).items())


def _mean_of(first: Snapshot, last: Snapshot, histogram: str) -> float:
    count = _delta(first, last, histogram + "_count")
    return _delta(first, last, histogram + "_sum") / count if count else 0.0


def histogram_quantile(q: float, first: Snapshot, last: Snapshot, histogram: str) -> float:
    """The q-quantile of the observations between two snapshots, interpolated inside its
    bucket as Prometheus' `histogram_quantile` does (0 without observations)."""
    buckets = []
    for labels, value in last.labelled(histogram + "_bucket").items():
        bound = float(dict(labels)["le"])
        buckets.append((bound, value - first.samples.get((histogram + "_bucket", labels), 0.0)))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return 0.0
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            inside = count - lower_count
            fraction = (rank - lower_count) / inside if inside else 1.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = bound, count
    return lower_bound


def window(history: list[Snapshot]) -> Window:
    if len(history) < 2:
        raise ValueError("a window needs at least two snapshots")
    first, last = history[0], history[-1]

    def gauge(name: str) -> list[float]:
        return [s.value(name) for s in history]

    usage = gauge("inflight_kv_cache_usage")
    info = last.labelled("inflight_config_info")
    knobs = dict(next(iter(info))) if info else {}
    return Window(
        seconds=last.t - first.t,
        steps=_delta(first, last, "inflight_batch_sequences_count"),
        knobs=knobs,
        kv_usage_max=max(usage),
        kv_usage_mean=sum(usage) / len(usage),
        running_mean=sum(gauge("inflight_requests_running")) / len(history),
        waiting_mean=sum(gauge("inflight_requests_waiting")) / len(history),
        preemptions=_delta(first, last, "inflight_preemptions_total"),
        batch_seqs_mean=_mean_of(first, last, "inflight_batch_sequences"),
        batch_tokens_mean=_mean_of(first, last, "inflight_batch_tokens"),
        queue_time_mean=_mean_of(first, last, "inflight_request_queue_time_seconds"),
        ttft_mean=_mean_of(first, last, "inflight_time_to_first_token_seconds"),
        itl_p50=histogram_quantile(0.5, first, last, "inflight_inter_token_latency_seconds"),
        itl_p99=histogram_quantile(0.99, first, last, "inflight_inter_token_latency_seconds"),
        prefix_queries=_delta(first, last, "inflight_prefix_cache_queries_total"),
        prefix_hits=_delta(first, last, "inflight_prefix_cache_hits_total"),
        rejected=_labelled_delta(first, last, "inflight_requests_rejected_total"),
        slo_met=_labelled_delta(first, last, "inflight_requests_slo_met_total"),
        slo_missed=_labelled_delta(first, last, "inflight_requests_slo_missed_total"),
        tenant_tokens={dict(k)["tenant"]:
                       v - first.samples.get(("inflight_tenant_tokens_total", k), 0.0)
                       for k, v in last.labelled("inflight_tenant_tokens_total").items()},
    )  # fmt: skip


def _bytes(n: float) -> str:
    return f"{n / 2**30:g}GiB" if n >= 2**30 else f"{n / 2**20:g}MiB"


# ------------------------------------------------------------------------------- the rules
def kv_pressure(w: Window) -> Hint | None:
    """The KV cache is full and requests are preempted: give it more memory or fewer seats."""
    if not (w.kv_usage_max > 0.95 and w.preemptions > 0):
        return None
    budget = w.knob("kv_cache_memory_bytes", 2 * 2**30)
    blocks = w.knob("num_kv_blocks", 0)
    return Hint(
        "kv_pressure", "warning",
        f"the KV cache reached {w.kv_usage_max:.0%} and {w.preemptions:g} requests were "
        f"preempted in {w.seconds:.0f} s; their tokens are computed again",
        f"--kv-cache-memory-bytes {_bytes(2 * budget)} (--num-kv-blocks {2 * blocks:.0f} if "
        "you set the blocks), or a lower --max-num-seqs",
        {"kv_usage_max": w.kv_usage_max, "preemptions": w.preemptions},
    )  # fmt: skip


def token_budget_limits_batch(w: Window) -> Hint | None:
    """Requests wait while steps are full of tokens: the step budget, not the seats, binds."""
    budget = w.knob("max_num_batched_tokens", 2048)
    if not (w.waiting_mean >= 1 and w.steps and w.batch_tokens_mean >= 0.9 * budget):
        return None
    return Hint(
        "token_budget", "warning",
        f"{w.waiting_mean:.1f} requests wait on average while steps carry "
        f"{w.batch_tokens_mean:.0f} of {budget:.0f} tokens",
        f"--max-num-batched-tokens {int(2 * budget)}",
        {"waiting_mean": w.waiting_mean, "batch_tokens_mean": w.batch_tokens_mean},
    )  # fmt: skip


def seats_limit_batch(w: Window) -> Hint | None:
    """Requests wait while every seat is taken and the KV cache still has room."""
    seats = w.knob("max_num_seqs", 64)
    if not (w.waiting_mean >= 1 and w.running_mean >= 0.95 * seats and w.kv_usage_max < 0.8):
        return None
    return Hint(
        "seats", "warning",
        f"{w.waiting_mean:.1f} requests wait on average with all {seats:.0f} seats taken and "
        f"the KV cache at most {w.kv_usage_max:.0%} full",
        f"--max-num-seqs {int(2 * seats)}",
        {"waiting_mean": w.waiting_mean, "running_mean": w.running_mean,
         "kv_usage_max": w.kv_usage_max},
    )  # fmt: skip


def queue_dominates_ttft(w: Window) -> Hint | None:
    """Time to first token is mostly queueing at a full batch: the machine is saturated."""
    seats = w.knob("max_num_seqs", 64)
    full = w.running_mean >= 0.9 * seats or w.kv_usage_max > 0.95
    if not (w.ttft_mean > 0.1 and w.queue_time_mean > 0.5 * w.ttft_mean and full):
        return None
    return Hint(
        "saturated", "warning",
        f"TTFT averages {w.ttft_mean:.2f} s, {w.queue_time_mean:.2f} s of it in the queue, "
        f"with the batch full",
        "more replicas (another `inflight serve` behind the load balancer)",
        {"ttft_mean_s": w.ttft_mean, "queue_time_mean_s": w.queue_time_mean,
         "running_mean": w.running_mean},
    )  # fmt: skip


def prefill_stalls_decodes(w: Window) -> Hint | None:
    """Inter-token latency spikes while steps carry prompt chunks: smaller chunks spread them."""
    budget = w.knob("max_num_batched_tokens", 2048)
    chunk = w.knob("prefill_chunk_size", budget)
    if not (w.itl_p99 > 0.05 and w.itl_p99 > 3 * w.itl_p50 > 0
            and w.batch_tokens_mean > 2 * w.batch_seqs_mean):  # fmt: skip
        return None
    return Hint(
        "prefill_stalls", "warning",
        f"inter-token latency p99 {w.itl_p99 * 1000:.0f} ms is {w.itl_p99 / w.itl_p50:.1f}x "
        f"its median while steps carry prompt chunks ({w.batch_tokens_mean:.0f} tokens for "
        f"{w.batch_seqs_mean:.1f} sequences)",
        f"--prefill-chunk-size {max(16, int(chunk // 4))}",
        {"itl_p50_s": w.itl_p50, "itl_p99_s": w.itl_p99,
         "batch_tokens_mean": w.batch_tokens_mean},
    )  # fmt: skip


def prefix_misses(w: Window) -> Hint | None:
    """Prompts are looked up in the prefix cache and almost never found."""
    if w.knobs.get("enable_prefix_caching") == "False" or w.prefix_queries < 1000:
        return None
    rate = w.prefix_hits / w.prefix_queries
    if rate >= 0.02:
        return None
    return Hint(
        "prefix_misses", "info",
        f"{rate:.1%} of {w.prefix_queries:.0f} prompt tokens were found in the prefix cache; if "
        "requests share a prefix (a system prompt), they must send the same cache_salt (or none)",
        "cache_salt (per request)",
        {"prefix_hit_rate": rate, "prefix_queries": w.prefix_queries},
    )  # fmt: skip


def queue_full(w: Window) -> Hint | None:
    """Requests are turned away with 429."""
    if not w.rejected:
        return None
    bound = w.knobs.get("max_queued_requests", "None")
    return Hint(
        "queue_full", "warning",
        f"{w.rejected:g} requests were refused in {w.seconds:.0f} s (queue bound {bound})",
        "more replicas, or a higher --max-queued-requests if clients accept the wait",
        {"rejected": w.rejected},
    )  # fmt: skip


def one_tenant_dominates(w: Window) -> Hint | None:
    """Requests queue while one tenant takes most of the tokens and others are served too:
    arrival order lets a flood starve the rest; fair share orders by service."""
    if w.knobs.get("scheduling_policy") == "fair" or w.waiting_mean < 1:
        return None
    served = {t: n for t, n in w.tenant_tokens.items() if n > 0}
    total = sum(served.values())
    if len(served) < 2 or not total:
        return None
    top = max(served, key=lambda t: served[t])
    share = served[top] / total
    if share < 0.8:
        return None
    return Hint(
        "one_tenant", "warning",
        f"tenant {top!r} took {share:.0%} of the tokens computed among {len(served)} tenants "
        f"while {w.waiting_mean:.1f} requests waited on average",
        "--scheduling-policy fair",
        {"top_tenant_share": share, "tenants": float(len(served)),
         "waiting_mean": w.waiting_mean},
    )  # fmt: skip


def targets_missed(w: Window) -> Hint | None:
    """Finished requests miss their latency targets: queued anyway, they wait past them
    (refusing at once what would miss keeps the rest within theirs); refused already, the
    queue order or the machine is what is left."""
    judged = w.slo_met + w.slo_missed
    if judged < 5 or w.slo_missed / judged < 0.2:
        return None
    queued = w.knobs.get("slo_admission") == "queue"
    knob = ("--slo-admission refuse" if queued
            else "--scheduling-policy edf, or more replicas")  # fmt: skip
    return Hint(
        "targets_missed", "warning",
        f"{w.slo_missed:g} of {judged:g} requests finished past their TTFT or TPOT target",
        knob, {"slo_missed": w.slo_missed, "slo_met": w.slo_met},
    )  # fmt: skip


RULES: tuple[Callable[[Window], Hint | None], ...] = (
    kv_pressure, token_budget_limits_batch, seats_limit_batch, queue_dominates_ttft,
    prefill_stalls_decodes, prefix_misses, queue_full, one_tenant_dominates, targets_missed,
)  # fmt: skip


def diagnose(history: list[Snapshot]) -> list[Hint]:
    w = window(history)
    return [hint for rule in RULES if (hint := rule(w)) is not None]


class History:
    """The last `seconds` of snapshots, one taken per `take` call (the server takes one a
    second from its own registry)."""

    def __init__(self, seconds: float = 60.0) -> None:
        self.seconds = seconds
        self.snapshots: list[Snapshot] = []

    def take(self, t: float, text: str) -> None:
        self.snapshots.append(Snapshot.parse(t, text))
        # keep one snapshot at or before the window's start, so the window spans `seconds`
        while len(self.snapshots) > 1 and self.snapshots[1].t <= t - self.seconds:
            self.snapshots.pop(0)

    def report(self) -> dict[str, Any]:
        """`/doctor`'s answer: the window the rules read, and their hints."""
        if len(self.snapshots) < 2:
            return {"window_s": 0.0, "hints": [], "window": None}
        w = window(self.snapshots)
        evidence = {k: v for k, v in asdict(w).items() if k != "knobs"}
        hints = [h.as_dict() for rule in RULES if (h := rule(w)) is not None]
        return {"window_s": round(w.seconds, 1), "hints": hints, "window": evidence}


def format_hints(report: dict[str, Any]) -> str:
    """Hints as text, for `inflight doctor`."""
    if not report["hints"]:
        return f"no hints: nothing in the last {report['window_s']:g} s calls for a change"
    lines = []
    for h in report["hints"]:
        evidence = ", ".join(f"{k}={v:.4g}" for k, v in h["evidence"].items())
        lines.append(f"[{h['severity']}] {h['message']}\n    try: {h['flag']}\n    ({evidence})")
    return "\n".join(lines)
