"""Engine metrics, exported in the Prometheus text format (names prefixed `inflight_`)."""

from inflight.metrics.prometheus import EngineMetrics

__all__ = ["EngineMetrics"]
