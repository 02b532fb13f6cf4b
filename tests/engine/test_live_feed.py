"""The dashboard's numbers from step records: per-tenant service, targets met and missed."""

from __future__ import annotations

from inflight.metrics.live import LiveFeed
from inflight.metrics.stats import StepStats


def test_the_tenants_table_sums_the_window_per_tenant():
    feed = LiveFeed(window_s=60.0)
    feed.add_step(StepStats(t=1.0, duration_s=1.0, tenant_tokens={"b": 30, "a": 100},
                            slo_met={"a": 2}))  # fmt: skip
    feed.add_step(StepStats(t=2.0, duration_s=1.0, tenant_tokens={"a": 20},
                            slo_met={"a": 1}, slo_missed={"b": 1}))  # fmt: skip
    feed.add_step(StepStats(t=-100.0, tenant_tokens={"old": 5}))  # outside the window
    feed.add_refusal(2.5, "slo_unmet")
    feed.add_refusal(2.5, "queue_full")
    state = feed.state(now=3.0)  # the window spans 0.0 .. 3.0: 3 s
    assert state["tenants"] == [["a", 40.0, 3, 0, 1.0], ["b", 10.0, 0, 1, 0.0]]
    assert state["events"]["slo_refused"] == 1 and state["events"]["rejected"] == 1
