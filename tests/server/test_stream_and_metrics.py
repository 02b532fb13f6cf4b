"""Streaming mechanics on the tiny model: disconnects abort and free blocks; /metrics moves."""

from __future__ import annotations

import json

import httpx

from inflight import LLM, SamplingParams
from inflight.engine.async_engine import AsyncLLM
from inflight.metrics.doctor import Snapshot
from inflight.metrics.prometheus import EngineMetrics
from tests.server.live import LiveServer, slow_steps


def metric_samples(text: str) -> dict[tuple[str, tuple], float]:
    return Snapshot.parse(0.0, text).samples


def test_disconnect_aborts_and_returns_blocks(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        slow_steps(engine, 0.02)
        pool = engine.core.kv_cache_manager.pool
        before = pool.num_used_blocks
        body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 120,
                "ignore_eos": True, "stream": True}  # fmt: skip
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            chunks = []
            for line in lines:
                if line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
                if len(chunks) == 3:
                    break
            assert pool.num_used_blocks > before  # the request holds blocks mid-stream
        s.wait_idle()  # closing the connection aborted it within a step or so
        assert pool.num_used_blocks == before
        finished = metric_samples(httpx.get(s.url + "/metrics").text)
        assert finished[("inflight_requests_finished_total", (("finish_reason", "abort"),))] == 1


def test_metrics_parse_and_move(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        before = metric_samples(httpx.get(s.url + "/metrics").text)
        assert before[("inflight_generation_tokens_total", ())] == 0
        info = [k for k in before if k[0] == "inflight_config_info"]
        assert dict(info[0][1])["max_num_seqs"] == "64"
        assert dict(info[0][1])["num_kv_blocks"] == "64"
        # the memory split: the pool's bytes exactly, the weights' as the model holds them
        assert before[("inflight_kv_cache_bytes", ())] == engine.core.kv_cache.num_bytes > 0
        assert before[("inflight_sequence_state_bytes", ())] == 0  # (no layer carries state)
        weights = sum(p.numel() * p.element_size() for p in engine.core.loaded.model.parameters())
        assert before[("inflight_model_weights_bytes", ())] >= weights > 0
        body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True, "n": 2}
        assert httpx.post(s.url + "/v1/completions", json=body, timeout=30).status_code == 200
        after = metric_samples(httpx.get(s.url + "/metrics").text)
        assert after[("inflight_generation_tokens_total", ())] == 10
        assert after[("inflight_prompt_tokens_total", ())] == 3
        length = ("inflight_requests_finished_total", (("finish_reason", "length"),))
        assert after[length] == 2
        for name in ("inflight_time_to_first_token_seconds_count",
                     "inflight_request_latency_seconds_count",
                     "inflight_request_queue_time_seconds_count"):  # fmt: skip
            assert after[(name, ())] == 1
        assert after[("inflight_inter_token_latency_seconds_count", ())] >= 4
        assert after[("inflight_batch_sequences_count", ())] >= 5
        assert after[("inflight_batch_sequences_avg", ())] >= 1
        assert after[("inflight_kv_cache_blocks_total", ())] == 64
        assert after[("inflight_kv_cache_blocks_used", ())] == 0
        assert after[("inflight_requests_running", ())] == 0


def test_predictive_admissions_reach_the_metrics(tiny_llama):
    # 40 blocks of 4 tokens; each request reserves 8-12 blocks, so admission waits on
    # reservations and requests near their end lend theirs.
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=128, kv_block_size=4,
              num_kv_blocks=40, kv_admission="reserve", predictive_admission=True)  # fmt: skip
    metrics = EngineMetrics({})
    step = llm.core.step

    def step_and_observe():
        result = step()
        metrics.observe_step(result.stats)
        return result

    llm.core.step = step_and_observe
    prompts = [[5 + i] * (12 + 4 * (i % 4)) for i in range(8)]
    llm.generate(prompts, SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)
    samples = metric_samples(metrics.render().decode())
    scheduler = llm.core.scheduler
    assert (
        samples[("inflight_predictive_admissions_total", ())]
        == scheduler.admission.stats.predictive_admissions
        > 0
    )
    assert (
        samples[("inflight_prediction_failures_total", ())]
        == scheduler.admission.stats.prediction_failures
    )
