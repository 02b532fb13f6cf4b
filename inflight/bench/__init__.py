"""Benchmarks: workloads and (later) `inflight bench` runs, reports and plots."""
