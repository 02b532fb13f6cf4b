"""The transformers peers: a request that transformers' continuous batching fails (it logs the
error and hands back what it has, e.g. nothing after running out of GPU memory) fails the run
instead of being reported as an instant, empty result."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inflight.bench import peers
from inflight.workload.requests import WorkloadRequest


class FakeManager:
    """Hands back, for each request, the tokens `produce(max_tokens)` and `error`."""

    def __init__(self, produce, error=None) -> None:
        self.produce, self.error, self.queue = produce, error, []

    def start(self) -> None:
        pass

    def stop(self, block: bool) -> None:
        pass

    def add_request(self, prompt, request_id, max_new_tokens) -> None:
        self.queue.append((request_id, max_new_tokens))

    def get_result(self, timeout):
        request_id, n = self.queue.pop(0)
        return SimpleNamespace(
            request_id=request_id, generated_tokens=self.produce(n), error=self.error
        )


def run_with(monkeypatch, manager):
    def init_continuous_batching(generation_config, continuous_batching_config):
        manager.cache = continuous_batching_config
        return manager

    model = SimpleNamespace(init_continuous_batching=init_continuous_batching)
    monkeypatch.setattr(peers, "load_hf_model", lambda path, dtype, device: model)
    workload = [WorkloadRequest([1, 2, 3], 4, 0.0), WorkloadRequest([4, 5], 6, 0.0)]
    return peers.run_hf_continuous(None, workload, "float32", progress=False)


def test_complete_results_are_recorded(monkeypatch):
    manager = FakeManager(lambda n: [7] * n)
    run = run_with(monkeypatch, manager)
    assert [r.output_tokens for r in run.requests] == [4, 6]
    # a block of 256 tokens each holds a whole request: the cache holds both, no more
    assert manager.cache.num_blocks == 2 and manager.cache.page_size == 256


@pytest.mark.parametrize(
    ("produce", "error", "match"),
    [
        (lambda n: [], "CUDA error: out of memory", "0 of 4 tokens.*out of memory"),
        (lambda n: [7] * (n - 1), None, "3 of 4 tokens"),
    ],
)
def test_failed_or_short_requests_fail_the_run(monkeypatch, produce, error, match):
    with pytest.raises(RuntimeError, match=match):
        run_with(monkeypatch, FakeManager(produce, error))
