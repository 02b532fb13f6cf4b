"""Workload generation (laws, seeds, arrivals, JSONL) and the benchmark maths."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
from transformers import AutoTokenizer

from inflight.metrics.stats import StepStats
from inflight.workload import requests as w
from inflight.workload.results import (
    RequestRecord,
    RunResult,
    percentiles,
    summarize,
    time_weighted_mean,
)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def test_length_laws_respect_their_bounds_and_shapes():
    rng = random.Random(0)
    assert {w.fixed(7)(rng) for _ in range(10)} == {7}
    u = [w.uniform(3, 9)(rng) for _ in range(2000)]
    assert min(u) == 3 and max(u) == 9
    ln = [w.lognormal(32, 1.0, 8, 512)(rng) for _ in range(5000)]
    assert min(ln) >= 8 and max(ln) <= 512
    assert 28 <= statistics.median(ln) <= 36  # median near 32
    assert statistics.mean(ln) > statistics.median(ln) * 1.3  # the long right tail
    mix = [w.mixture((0.8, w.fixed(1)), (0.2, w.fixed(2)))(rng) for _ in range(5000)]
    assert 0.77 < mix.count(1) / len(mix) < 0.83


def test_arrivals():
    rng = random.Random(0)
    assert w.arrivals("all", 5, rng) == [0.0] * 5
    poisson = w.arrivals("poisson", 4000, rng, rate=10.0)
    gaps = [b - a for a, b in itertools.pairwise(poisson)]
    assert poisson == sorted(poisson) and poisson[0] == 0.0
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.08)
    gamma = w.arrivals("gamma", 4000, rng, rate=10.0, cv=3.0)
    ggaps = [b - a for a, b in itertools.pairwise(gamma)]
    assert statistics.mean(ggaps) == pytest.approx(0.1, rel=0.25)
    assert statistics.stdev(ggaps) / statistics.mean(ggaps) > 2  # bursty
    with pytest.raises(ValueError, match="unknown arrival"):
        w.arrivals("uniform", 3, rng)


def test_named_workloads_are_seeded_and_round_trip_jsonl(tokenizer, tmp_path):
    a = w.named("longtail", tokenizer, seed=3, num_requests=20, arrival="poisson", rate=2.0)
    b = w.named("longtail", tokenizer, seed=3, num_requests=20, arrival="poisson", rate=2.0)
    c = w.named("longtail", tokenizer, seed=4, num_requests=20)
    assert a == b and a != c and len(a) == 20
    assert all(20 <= len(r.prompt_token_ids) <= 400 and 8 <= r.max_tokens <= 512 for r in a)
    path = tmp_path / "load.jsonl"
    w.save_jsonl(a, path)
    assert w.load_jsonl(path) == a
    path.write_text('{"prompt": "The quick brown fox", "max_tokens": 4, "priority": 2}\n')
    (r,) = w.load_jsonl(path, tokenizer)
    assert r.prompt_token_ids == tokenizer("The quick brown fox").input_ids
    assert (r.max_tokens, r.arrival_time, r.priority) == (4, 0.0, 2)


def test_pad_batches_pads_each_batch_to_its_own_longest_prompt_and_output():
    reqs = [w.WorkloadRequest([7] * p, n) for p, n in ((1, 5), (3, 9), (2, 2), (1, 7), (4, 3))]
    padded = w.pad_batches(reqs, 2, pad_id=0)
    assert [r.max_tokens for r in padded] == [9, 9, 7, 7, 3]
    assert [r.prompt_token_ids for r in padded] == [[0, 0, 7], [7, 7, 7], [7, 7], [0, 7],
                                                    [7, 7, 7, 7]]  # fmt: skip
    assert w.pad_batches(reqs, 5, pad_id=0)[2].prompt_token_ids == [0, 0, 7, 7]


def test_percentiles_and_time_weighted_means():
    p = percentiles([1.0, 2.0, 3.0, 4.0, None])
    assert p == {"p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97), "mean": 2.5}
    assert percentiles([None]) == {}
    # 0.5 for 1 s, then 1.0 for 3 s -> 0.875
    assert time_weighted_mean([0.5, 1.0], [1.0, 3.0]) == 0.875
    assert time_weighted_mean([], []) == 0.0


def test_summary_on_a_hand_made_run():
    # fmt: off
    run = RunResult(
        name="x",
        wall_s=2.0,
        requests=[RequestRecord(10, 5, 0.1, 0.5), RequestRecord(20, 1, 0.2, 0.2)],
        timeline=[
            StepStats(t=1.0, duration_s=1.0, num_scheduled_seqs=2, num_batched_tokens=30,
                      num_running=2, kv_usage=0.25),
            StepStats(t=2.0, duration_s=1.0, num_scheduled_seqs=1, num_batched_tokens=1,
                      num_running=1, kv_usage=0.75),
        ],
    )
    # fmt: on
    s = summarize(run)
    assert s["output_tok_per_s"] == 3.0 and s["total_tok_per_s"] == 18.0
    assert s["requests_per_s"] == 1.0 and s["steps"] == 2 and s["mean_batch_seqs"] == 1.5
    assert s["kv_usage_time_weighted"] == 0.5
    assert s["computed_per_needed_token"] == round(31 / 34, 3)  # 14 + 20 needed, 30 + 1 run
    assert s["tpot_s"]["mean"] == pytest.approx(0.1)  # (0.5 - 0.1) / 4; the 1-token one has none


def test_repeated_runs_are_summed_up_per_run_with_ratios_taken_within_rounds():
    from inflight.workload.report import markdown, repeat_stats

    tok_s = {"a #1": 100.0, "b #1": 50.0, "a #2": 80.0, "b #2": 50.0, "a #3": 90.0, "b #3": 45.0}
    stats = repeat_stats([{"name": n, "output_tok_per_s": v} for n, v in tok_s.items()])
    assert stats[0] == {"name": "a", "rounds": 3, "median": 90.0, "min": 80.0, "max": 100.0}
    # round by round: 100/50, 80/50, 90/45 -> 2.0, 1.6, 2.0 (not the ratio of the medians, 1.8)
    assert stats[1]["median"] == 50.0
    assert stats[1]["ratio_of_first"] == {"median": 2.0, "min": 1.6, "max": 2.0}
    report = {"title": "t", "meta": {}, "runs": [], "ratios": {}, "repeats": stats}
    assert "| b | 3 | 50.00 (45.00 - 50.00) | **2.0x** (1.6 - 2.0) |" in markdown(report)
    # runs without rounds, or each once, are not repeats
    assert repeat_stats([{"name": "a", "output_tok_per_s": 1.0}]) == []
    assert repeat_stats([{"name": "a #1", "output_tok_per_s": 1.0}]) == []
