"""EngineMetrics: every metric the engine exports, on a registry of its own (no global state).

Gauges of the engine's state (running, waiting and swapped requests, KV usage and blocks in use)
are set by the engine thread whenever that state changes: after a step, and after requests are
added, aborted or finished with no step to follow, so an idle engine's gauges read idle.
Per step: scheduled sequences and tokens (histograms and running-average gauges: the effective
batch size), preemptions, prefix-cache lookups, predictive admissions and their failures, step
duration.
Per request (updated when it finishes): queue time, TTFT, inter-token latency, end-to-end
latency, prompt and generated tokens (counters and per-request histograms), finish reason;
requests refused (queue full) or timed
out. The knobs in effect are one info metric.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from inflight.metrics.stats import CoreGauges, StepStats
from inflight.outputs import RequestOutput

PREFIX = "inflight"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
LENGTH_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
EMA_WEIGHT = 0.05  # running average over roughly the last 20 steps


MAX_TENANT_LABELS = 100  # distinct tenant labels before the rest share "other"


class EngineMetrics:
    def __init__(self, knobs: dict[str, Any]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def name(s: str) -> str:
            return f"{PREFIX}_{s}"

        self.running = Gauge(name("requests_running"), "Requests in the running batch", registry=r)
        self.waiting = Gauge(name("requests_waiting"), "Requests waiting (queue depth)", registry=r)
        self.swapped = Gauge(
            name("requests_swapped"), "Waiting requests whose KV is swapped to CPU", registry=r
        )
        self.kv_usage = Gauge(name("kv_cache_usage"), "Fraction of KV blocks in use", registry=r)
        self.kv_blocks_used = Gauge(name("kv_cache_blocks_used"), "KV blocks in use", registry=r)
        self.kv_blocks_total = Gauge(name("kv_cache_blocks_total"), "KV blocks in all", registry=r)
        self.batch_seqs = Histogram(
            name("batch_sequences"), "Sequences scheduled per step", buckets=BATCH_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.batch_tokens = Histogram(
            name("batch_tokens"), "Tokens scheduled per step", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_seqs_avg = Gauge(
            name("batch_sequences_avg"), "Running average of sequences per step", registry=r
        )
        self.batch_tokens_avg = Gauge(
            name("batch_tokens_avg"), "Running average of tokens per step", registry=r
        )
        self.step_duration = Histogram(
            name("step_duration_seconds"), "Duration of one engine step", buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.preemptions = Counter(name("preemptions"), "Requests preempted", registry=r)
        self.prefix_queries = Counter(
            name("prefix_cache_queries"), "Prompt tokens looked up in the prefix cache", registry=r
        )
        self.prefix_hits = Counter(
            name("prefix_cache_hits"), "Prompt tokens found in the prefix cache", registry=r
        )
        self.predictive_admissions = Counter(
            name("predictive_admissions"), "Requests admitted on blocks about to be freed",
            registry=r,
        )  # fmt: skip
        self.prediction_failures = Counter(
            name("prediction_failures"), "Requests admitted on a prediction, then preempted",
            registry=r,
        )  # fmt: skip
        self.spec_drafted = Counter(
            name("spec_draft_tokens"), "Speculative tokens verified", registry=r
        )
        self.spec_accepted = Counter(
            name("spec_accepted_tokens"), "Speculative tokens kept", registry=r
        )
        self.spec_declined = Counter(
            name("spec_drafts_declined"),
            "Lookups whose draft was not worth the step time it adds (speculation off for it)",
            registry=r,
        )
        self.queue_time = Histogram(
            name("request_queue_time_seconds"), "Arrival to first scheduled",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            name("time_to_first_token_seconds"), "Arrival to first token",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            name("inter_token_latency_seconds"), "Time between tokens of one request",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            name("request_latency_seconds"), "Arrival to finish", buckets=LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(name("prompt_tokens"), "Prompt tokens processed", registry=r)
        self.prompt_length = Histogram(
            name("request_prompt_tokens"), "Prompt tokens per finished request",
            buckets=LENGTH_BUCKETS, registry=r,
        )  # fmt: skip
        self.output_length = Histogram(
            name("request_generation_tokens"), "Tokens generated per finished sequence",
            buckets=LENGTH_BUCKETS, registry=r,
        )  # fmt: skip
        self.generation_tokens = Counter(name("generation_tokens"), "Tokens generated", registry=r)
        self.finished = Counter(
            name("requests_finished"), "Finished requests", ["finish_reason"], registry=r
        )
        self.rejected = Counter(
            name("requests_rejected"), "Requests refused (queue full, slo_unmet) or ended by "
            "the request timeout", ["reason"], registry=r,
        )  # fmt: skip
        self.tenant_tokens = Counter(
            name("tenant_tokens"), "Tokens computed for each tenant (prompt and output)",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.slo_met = Counter(
            name("requests_slo_met"), "Finished requests within their TTFT and TPOT targets "
            "(goodput), per tenant", ["tenant"], registry=r,
        )  # fmt: skip
        self.slo_missed = Counter(
            name("requests_slo_missed"), "Finished requests past a TTFT or TPOT target, per "
            "tenant", ["tenant"], registry=r,
        )  # fmt: skip
        self._tenant_labels: set[str] = set()
        self.weight_bytes = Gauge(
            name("model_weights_bytes"), "Bytes of the model's weights in memory", registry=r
        )
        self.kv_cache_bytes = Gauge(name("kv_cache_bytes"), "Bytes of the KV pool", registry=r)
        self.sequence_state_bytes = Gauge(
            name("sequence_state_bytes"), "Bytes of the state some layers carry for each running "
            "sequence in place of KV (convolution inputs, DeltaNet matrices), and of the states "
            "saved for prefix-cache hits", registry=r,
        )  # fmt: skip
        self.config = Info(name("config"), "Engine knobs in effect", registry=r)
        self.config.info({k: str(v) for k, v in knobs.items()})
        self._avg_seqs: float | None = None
        self._avg_tokens: float | None = None

    def observe_state(self, gauges: CoreGauges) -> None:
        """The engine's state now; called from the engine thread (prometheus-client is
        thread-safe) after every change."""
        self.running.set(gauges.num_running)
        self.waiting.set(gauges.num_waiting)
        self.swapped.set(gauges.num_swapped)
        self.kv_usage.set(gauges.kv_usage)
        self.kv_blocks_used.set(gauges.kv_blocks_used)
        self.kv_blocks_total.set(gauges.kv_blocks_total)

    def observe_step(self, step: StepStats) -> None:
        """Called from the engine thread after every step."""
        if step.num_preempted:
            self.preemptions.inc(step.num_preempted)
        self.prefix_queries.inc(step.prefix_cache.queries)
        self.prefix_hits.inc(step.prefix_cache.hits)
        self.predictive_admissions.inc(step.admission.predictive_admissions)
        self.prediction_failures.inc(step.admission.prediction_failures)
        self.spec_drafted.inc(step.speculation.drafted)
        self.spec_accepted.inc(step.speculation.accepted)
        self.spec_declined.inc(step.speculation.declined)
        for tenant, num_tokens in step.tenant_tokens.items():
            self.tenant_tokens.labels(tenant=self._tenant_label(tenant)).inc(num_tokens)
        for counter, counts in ((self.slo_met, step.slo_met), (self.slo_missed, step.slo_missed)):
            for tenant, num in counts.items():
                counter.labels(tenant=self._tenant_label(tenant)).inc(num)
        if not step.num_scheduled_seqs:
            return
        self.batch_seqs.observe(step.num_scheduled_seqs)
        self.batch_tokens.observe(step.num_batched_tokens)
        self.step_duration.observe(step.duration_s)
        self._avg_seqs = _ema(self._avg_seqs, step.num_scheduled_seqs)
        self._avg_tokens = _ema(self._avg_tokens, step.num_batched_tokens)
        self.batch_seqs_avg.set(self._avg_seqs)
        self.batch_tokens_avg.set(self._avg_tokens)

    def _tenant_label(self, tenant: str) -> str:
        """The tenant's own label for the first `MAX_TENANT_LABELS` tenants, "other" after:
        clients may name tenants (`--tenant-from-user`), and each label is a series kept
        forever."""
        if tenant not in self._tenant_labels and len(self._tenant_labels) < MAX_TENANT_LABELS:
            self._tenant_labels.add(tenant)
        return tenant if tenant in self._tenant_labels else "other"

    def observe_tokens(self, gap_s: float, num_tokens: int) -> None:
        """New tokens of one request arrived `gap_s` after its previous ones."""
        for _ in range(num_tokens):
            self.itl.observe(gap_s / num_tokens)

    def observe_finished(self, out: RequestOutput) -> None:
        m = out.metrics
        if m.queue_time is not None:
            self.queue_time.observe(m.queue_time)
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        if m.e2e_latency is not None:
            self.e2e.observe(m.e2e_latency)
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        self.prompt_length.observe(len(out.prompt_token_ids))
        for completion in out.outputs:
            self.generation_tokens.inc(len(completion.token_ids))
            self.output_length.observe(len(completion.token_ids))
            self.finished.labels(finish_reason=completion.finish_reason or "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _ema(previous: float | None, value: float) -> float:
    return value if previous is None else (1 - EMA_WEIGHT) * previous + EMA_WEIGHT * value
