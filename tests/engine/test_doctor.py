"""The doctor's rules on synthetic metric histories, and on the engine's real metric names."""

from __future__ import annotations

import pytest

from inflight.metrics.doctor import Snapshot, diagnose, histogram_quantile, window
from inflight.metrics.prometheus import EngineMetrics
from inflight.metrics.stats import CoreGauges

KNOBS = {"max_num_seqs": "64", "max_num_batched_tokens": "2048", "prefill_chunk_size": "None",
         "kv_cache_memory_bytes": str(2 * 2**30), "enable_prefix_caching": "True",
         "max_queued_requests": "64", "num_kv_blocks": "5825"}  # fmt: skip
ITL_BOUNDS = ("0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "+Inf")


def snap(t: float, *, running=0.0, waiting=0.0, kv=0.0, preemptions=0.0, steps=0.0,
         seqs=0.0, tokens=0.0, queue=(0.0, 0.0), ttft=(0.0, 0.0), itl=(0,) * 8,
         prefix=(0.0, 0.0), rejected=0.0, knobs=KNOBS, tenants=None,
         slo=None) -> Snapshot:  # fmt: skip
    """Cumulative values at time t; `queue`/`ttft` are (sum, count), `itl` cumulative bucket
    counts for ITL_BOUNDS, `prefix` (queries, hits)."""
    s: dict = {
        ("inflight_requests_running", ()): running,
        ("inflight_requests_waiting", ()): waiting,
        ("inflight_kv_cache_usage", ()): kv,
        ("inflight_preemptions_total", ()): preemptions,
        ("inflight_batch_sequences_count", ()): steps,
        ("inflight_batch_sequences_sum", ()): seqs,
        ("inflight_batch_tokens_count", ()): steps,
        ("inflight_batch_tokens_sum", ()): tokens,
        ("inflight_request_queue_time_seconds_sum", ()): queue[0],
        ("inflight_request_queue_time_seconds_count", ()): queue[1],
        ("inflight_time_to_first_token_seconds_sum", ()): ttft[0],
        ("inflight_time_to_first_token_seconds_count", ()): ttft[1],
        ("inflight_prefix_cache_queries_total", ()): prefix[0],
        ("inflight_prefix_cache_hits_total", ()): prefix[1],
        ("inflight_requests_rejected_total", (("reason", "queue_full"),)): rejected,
        ("inflight_config_info", tuple(sorted(knobs.items()))): 1.0,
    }
    for bound, count in zip(ITL_BOUNDS, itl, strict=True):
        s[("inflight_inter_token_latency_seconds_bucket", (("le", bound),))] = count
    for tenant, count in (tenants or {}).items():
        s[("inflight_tenant_tokens_total", (("tenant", tenant),))] = count
    for (kind, tenant), count in (slo or {}).items():  # ("met" | "missed", tenant): count
        s[(f"inflight_requests_slo_{kind}_total", (("tenant", tenant),))] = count
    return Snapshot(t, s)


QUIET = [
    snap(0),
    snap(
        30,
        running=4,
        steps=300,
        seqs=1200,
        tokens=1500,
        ttft=(1.0, 20),
        queue=(0.1, 20),
        itl=(0, 100, 800, 1000, 1000, 1000, 1000, 1000),
    ),
]


def rules(history) -> list[str]:
    return [h.rule for h in diagnose(history)]


def test_a_healthy_window_has_no_hints():
    assert rules(QUIET) == []


def test_kv_pressure_names_the_memory_flag():
    history = [snap(0), snap(10, kv=0.97, running=40, preemptions=12, steps=100, seqs=3000)]
    (hint,) = [h for h in diagnose(history) if h.rule == "kv_pressure"]
    assert hint.flag.startswith("--kv-cache-memory-bytes 4GiB (--num-kv-blocks 11650 if")
    assert hint.evidence == {"kv_usage_max": 0.97, "preemptions": 12}
    assert "12 requests were preempted in 10 s" in hint.message


def test_full_token_budget_with_a_queue_names_max_num_batched_tokens():
    history = [snap(0, waiting=5), snap(10, waiting=7, running=10, steps=50, seqs=500,
                                        tokens=50 * 2000)]  # fmt: skip
    hints = {h.rule: h for h in diagnose(history)}
    assert hints["token_budget"].flag == "--max-num-batched-tokens 4096"
    assert hints["token_budget"].evidence["waiting_mean"] == 6


def test_all_seats_taken_with_kv_to_spare_names_max_num_seqs():
    history = [
        snap(0, running=64, waiting=10, kv=0.3),
        snap(10, running=64, waiting=12, kv=0.4, steps=100, seqs=6400, tokens=6400),
    ]
    hints = {h.rule: h for h in diagnose(history)}
    assert hints["seats"].flag == "--max-num-seqs 128"
    assert "kv_pressure" not in hints


def test_queueing_at_a_full_batch_calls_for_replicas():
    history = [snap(0, running=64), snap(10, running=64, steps=100, seqs=6400, tokens=6400,
                                         ttft=(40.0, 20), queue=(36.0, 20))]  # fmt: skip
    (hint,) = [h for h in diagnose(history) if h.rule == "saturated"]
    assert "replicas" in hint.flag
    assert hint.evidence["ttft_mean_s"] == 2.0 and hint.evidence["queue_time_mean_s"] == 1.8


def test_itl_spikes_with_prompt_chunks_name_a_smaller_chunk():
    # 90% of tokens within 20 ms, 2% above 200 ms; steps carry 400 tokens for 8 sequences
    itl = (0, 100, 900, 950, 970, 980, 1000, 1000)
    history = [snap(0), snap(10, running=8, steps=100, seqs=800, tokens=40_000, itl=itl)]
    (hint,) = [h for h in diagnose(history) if h.rule == "prefill_stalls"]
    assert hint.flag == "--prefill-chunk-size 512"  # a quarter of the default (the budget)
    assert hint.evidence["itl_p99_s"] > 3 * hint.evidence["itl_p50_s"]


def test_prefix_misses_point_at_cache_salt_and_rejections_are_reported():
    history = [snap(0), snap(10, prefix=(50_000, 100), rejected=7)]
    hints = {h.rule: h for h in diagnose(history)}
    assert hints["prefix_misses"].severity == "info" and "cache_salt" in hints["prefix_misses"].flag
    assert hints["queue_full"].evidence == {"rejected": 7}
    off = {**KNOBS, "enable_prefix_caching": "False"}
    assert "prefix_misses" not in rules([snap(0, knobs=off), snap(10, prefix=(50_000, 0),
                                                                 knobs=off)])  # fmt: skip


def test_one_tenant_taking_most_tokens_while_others_wait_names_fair_scheduling():
    def history(knobs=KNOBS, waiting=3.0, flood=9000.0):
        return [snap(0, tenants={"flood": 0.0, "steady": 0.0}, knobs=knobs),
                snap(30, running=4, waiting=waiting, steps=300, seqs=1200, tokens=1500,
                     tenants={"flood": flood, "steady": 500.0}, knobs=knobs)]  # fmt: skip

    (hint,) = [h for h in diagnose(history()) if h.rule == "one_tenant"]
    assert hint.flag == "--scheduling-policy fair" and "'flood' took 95%" in hint.message
    assert "one_tenant" not in rules(history(waiting=0.0))  # nobody waits: no starvation
    assert "one_tenant" not in rules(history(flood=1500.0))  # 75%: a share, not a flood
    fair = {**KNOBS, "scheduling_policy": "fair"}
    assert "one_tenant" not in rules(history(knobs=fair))  # already fair


def test_requests_past_their_targets_name_refusing_or_the_queue_order():
    def history(knobs=KNOBS, missed=8.0):
        return [
            snap(0, knobs=knobs, slo={("met", "a"): 0.0, ("missed", "a"): 0.0}),
            snap(
                30,
                steps=300,
                seqs=1200,
                tokens=1500,
                knobs=knobs,
                slo={("met", "a"): 10.0, ("met", "b"): 2.0, ("missed", "a"): missed},
            ),
        ]

    queued = {**KNOBS, "slo_admission": "queue"}
    (hint,) = [h for h in diagnose(history(queued)) if h.rule == "targets_missed"]
    assert hint.flag == "--slo-admission refuse" and "8 of 20 requests" in hint.message
    (hint,) = [h for h in diagnose(history()) if h.rule == "targets_missed"]
    assert "edf" in hint.flag
    assert "targets_missed" not in rules(history(missed=2.0))  # 2 of 14: within the norm


def test_histogram_quantile_interpolates_inside_the_bucket():
    first, last = snap(0), snap(1, itl=(0, 0, 50, 100, 100, 100, 100, 100))
    name = "inflight_inter_token_latency_seconds"
    assert histogram_quantile(0.5, first, last, name) == pytest.approx(0.02)
    assert histogram_quantile(0.75, first, last, name) == pytest.approx(0.035)
    assert histogram_quantile(0.5, first, first, name) == 0.0


def test_the_engine_metrics_names_are_the_ones_the_doctor_reads():
    metrics = EngineMetrics(KNOBS)
    before = Snapshot.parse(0, metrics.render().decode())
    metrics.observe_state(CoreGauges(num_running=3, num_waiting=2, num_swapped=0, kv_usage=0.5,
                                     kv_blocks_used=10, kv_blocks_total=20))  # fmt: skip
    metrics.observe_tokens(0.03, 2)
    metrics.rejected.labels(reason="queue_full").inc(4)
    w = window([before, Snapshot.parse(1, metrics.render().decode())])
    assert (w.running_mean, w.waiting_mean, w.kv_usage_max) == (1.5, 1.0, 0.5)
    assert w.rejected == 4 and w.knob("max_num_seqs", 0) == 64
    assert 0.01 < w.itl_p50 <= 0.02  # two tokens 30 ms after the last: 15 ms each
