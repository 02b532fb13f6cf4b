"""The fleet's metrics: each engine's /metrics text and live feed, pushed to one actor; the
gateway merges them with a `replica` label, and counts its router's decisions."""

from __future__ import annotations

import time

import ray
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inflight.metrics.live import LiveFeed

HUB_NAME = "inflight-metrics-hub"
REPORT_PERIOD_S = 1.0
REPLICA_FRESH_S = 5.0  # an engine not heard from for this long counts as down

# Ray Serve imports the router from its path and pickles its module by value: that module keeps
# no state of its own, and counts into these (in the gateway's process, where the router of the
# gateway's engine handle runs).
ROUTER_REGISTRY = CollectorRegistry()
ROUTED = Counter("inflight_router_decisions", "Engines the router chose, by why (Ray Serve may "
                 "route a request again when an engine refuses it)", ["routed"],
                 registry=ROUTER_REGISTRY)  # fmt: skip


@ray.remote(num_cpus=0)
class MetricsHub:
    """The engines' latest /metrics texts and, while a dashboard watches, their live feeds."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[float, str]] = {}
        self.feeds: dict[str, tuple[float, LiveFeed, float]] = {}  # at, feed, engine's clock
        self.watched_until = 0.0

    def report(self, replica: str, text: str, feed: LiveFeed | None, clock: float) -> bool:
        """Stores an engine's report; answers whether a dashboard wants its live feed."""
        now = time.time()
        self.reports[replica] = (now, text)
        if feed is not None:
            self.feeds[replica] = (now, feed, clock)
        return now < self.watched_until

    def collect(self, watched: bool = False) -> dict[str, tuple[float, str]]:
        now = time.time()
        if watched:  # a page is open at the gateway: engines send their feeds for a while
            self.watched_until = now + 3 * REPORT_PERIOD_S
        return {r: (now - t, text) for r, (t, text) in self.reports.items()}

    def collect_feeds(self) -> dict[str, tuple[float, LiveFeed, float]]:
        now = time.time()
        return {r: (now - t, feed, clock) for r, (t, feed, clock) in self.feeds.items()}


def merge_metrics(texts: dict[str, str]) -> str:
    """Prometheus texts of several engines -> one text, every sample labelled `replica`."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            entry = families.setdefault(family.name, (family.type, family.documentation, []))
            for s in family.samples:
                labels = {"replica": replica, **s.labels}
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                entry[2].append(f"{s.name}{{{body}}} {_number(s.value)}")
    lines = []
    for name, (kind, doc, samples) in families.items():
        lines += [f"# HELP {name} {_escape(doc)}", f"# TYPE {name} {kind}", *samples]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if value == value else "NaN"


class MergedMetrics:
    """`engine.metrics` for the gateway: the engines' series plus the router's counters."""

    def __init__(self) -> None:
        self.text = ""  # the engines' merged series, refreshed once a second

    def render(self) -> bytes:
        return (self.text + generate_latest(ROUTER_REGISTRY).decode()).encode()
