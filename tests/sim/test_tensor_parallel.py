"""The simulator's tensor parallelism: each rank's share of weights, FLOPs and KV heads, the
exchanges among ranks over a link, the memory that decides what fits, sizes that do not split."""

from __future__ import annotations

import dataclasses
import json

import pytest

from inflight.cli import main
from inflight.core.outputs import ScheduledRequest, SchedulerOutput
from inflight.errors import ConfigError
from inflight.sampling_params import SamplingParams
from inflight.sim.cost_model import CostModel
from inflight.sim.hardware import LINKS, PROFILES, Link
from inflight.sim.model_profile import ModelProfile, load_model_profile
from inflight.sim.simulator import build_setup, simulate
from inflight.workload.requests import WorkloadRequest
from tests.sim.helpers import toy_hardware, toy_model

TOY_LINK = Link("toy", bandwidth=100.0, latency_s=0.5, source="test")


def split(model: ModelProfile, size: int) -> ModelProfile:
    return dataclasses.replace(model, tensor_parallel=size)


def step(start: int, n: int, sample: bool = True) -> SchedulerOutput:
    request = ScheduledRequest("r", [0] * n, start, [], sample, SamplingParams(), [], [])
    return SchedulerOutput(scheduled=[request])


def test_one_rank_exchanges_nothing():
    out = step(4, 3)
    alone = CostModel(toy_hardware(), toy_model(), 4).step_cost(out)
    with_link = CostModel(toy_hardware(), toy_model(), 4, TOY_LINK).step_cost(out)
    assert with_link == alone and alone.link_bytes == 0


def test_two_ranks_halve_weights_and_flops_and_pay_the_link():
    """The toy model (2 layers, hidden 4, 1 KV head, vocab 10) on 2 ranks: weights and FLOPs
    halve, the single KV head is replicated, and a step of 3 tokens, one sampling, sends
    4 ring all-reduces of 3 x 4 bf16 values (2 (2 - 1) / 2 x 24 bytes each) and half of 10
    float32 logits."""
    one, two = toy_model(), split(toy_model(), 2)
    assert two.kv_heads_per_rank == 1 and two.kv_bytes_per_token == one.kv_bytes_per_token
    assert two.rank_weight_bytes == one.weight_bytes_total / 2
    hw = toy_hardware(combine="sum")
    alone = CostModel(hw, one, 4).step_cost(step(4, 3))
    ranks = CostModel(hw, two, 4, TOY_LINK).step_cost(step(4, 3))
    assert ranks.weight_bytes == alone.weight_bytes / 2 and ranks.flops == alone.flops / 2
    assert ranks.kv_bytes == alone.kv_bytes
    sent = 4 * 24 + 20
    assert ranks.link_bytes == sent
    device = (ranks.weight_bytes + ranks.kv_bytes) / hw.memory_bw + ranks.flops / 1e3
    assert ranks.seconds == pytest.approx(device + 5 * 0.5 + sent / 100.0)
    no_sample = CostModel(hw, two, 4, TOY_LINK).step_cost(step(4, 3, sample=False))
    assert no_sample.link_bytes == 4 * 24  # no logits to gather, and no gather's latency


def test_kv_heads_split_where_they_divide():
    model = load_model_profile("llama-3.3-70b", "fp8")  # 8 KV heads
    for size, heads in ((2, 4), (8, 1), (16, 1)):  # 16 ranks: each KV head on two
        ranked = split(model, size)
        assert ranked.kv_heads_per_rank == heads
        assert ranked.kv_bytes_per_token == model.kv_bytes_per_token * heads // 8


@pytest.mark.parametrize(
    ("changes", "size", "message"),
    [
        ({}, 3, "does not divide the model's 64 attention heads"),
        ({"num_heads": 12, "num_kv_heads": 3}, 2, "neither divides the model's 3 KV heads"),
        ({"vocab_size": 128257}, 2, "does not divide the model's 128257 vocabulary entries"),
        ({}, 0, "must be >= 1"),
    ],
)
def test_sizes_that_do_not_split_the_model_are_refused(changes, size, message):
    model = load_model_profile("llama-3.3-70b", "fp8")
    arch = dataclasses.replace(model.arch, **changes)
    with pytest.raises(ValueError, match=message):
        ModelProfile("m", arch, "fp8", "bf16", size)


def test_70b_fits_h100s_only_split_and_each_rank_holds_more_kv_as_it_grows():
    h100, nvlink = PROFILES["h100-sxm"], LINKS["nvlink4"]
    model = load_model_profile("llama-3.3-70b", "fp8")
    knobs = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
    with pytest.raises(ConfigError, match="no room for a KV cache"):
        build_setup(h100, model, knobs)
    with pytest.raises(ValueError, match="needs a link"):
        build_setup(h100, split(model, 2), knobs)
    tokens = [build_setup(h100, split(model, n), knobs, link=nvlink).describe()["kv_tokens"]
              for n in (2, 4, 8)]  # fmt: skip
    # the weights' share shrinks and each rank caches fewer heads: more than double each time
    assert tokens[0] > 0 and tokens[1] > 2 * tokens[0] and tokens[2] > 2 * tokens[1]


def test_a_split_run_is_faster_on_a_fast_link_and_slower_on_a_slow_one():
    """The same decode-heavy run on one rank and on two: a free link halves what each rank
    reads, a slow one costs more than that saves."""
    workload = [WorkloadRequest(list(range(1, 9)), 16) for _ in range(4)]
    hw = toy_hardware(memory_bytes=10**10)
    knobs = {"max_num_seqs": 4, "num_kv_blocks": 64, "max_model_len": 64}

    def wall(model: ModelProfile, link: Link | None) -> tuple[float, dict]:
        run = simulate(build_setup(hw, model, knobs, link=link), workload, "run")
        return run.wall_s, run.extra

    alone, _ = wall(toy_model(), None)
    fast, extra = wall(split(toy_model(), 2), Link("free", 1e30, 0.0, "test"))
    slow, _ = wall(split(toy_model(), 2), Link("slow", 1.0, 1.0, "test"))
    assert fast < alone < slow
    assert extra["link_gb_sent_per_rank"] == 0  # rounded: the toy sends a few hundred bytes


def test_cli_simulates_a_tensor_parallel_replica(tmp_path):
    out = tmp_path / "tp"
    args = ["simulate", "run", "--model", "llama-3.3-70b", "--weights", "fp8",
            "--hardware", "h100-sxm", "--workload", "chat", "--num-requests", "16",
            "--max-num-seqs", "16", "--out", str(out)]  # fmt: skip
    assert main(args) == 2  # does not fit one H100
    assert main([*args, "--tensor-parallel-size", "2"]) == 0
    report = json.loads((out / "results.json").read_text())
    meta, (run,) = report["meta"], report["runs"]
    assert meta["tensor_parallel"] == 2 and meta["link"] == "nvlink4"
    assert "NVLink" in meta["link source"]
    assert run["requests"] == 16 and run["link_gb_sent_per_rank"] > 0
    assert main([*args, "--tensor-parallel-size", "3"]) == 2  # 64 heads do not split in 3


def test_a_cpu_node_refuses_weights_and_pool_beyond_its_memory():
    """70B in 4 bits (39.5 GB with its 16-bit embedding and head) on CPU nodes of 24 GiB: not
    on one, on two with a 2 GiB pool each."""
    node = dataclasses.replace(toy_hardware(), name="node", memory_bytes=24 * 2**30,
                               is_cpu=True)  # fmt: skip
    model = load_model_profile("llama-3.3-70b", "int4")
    knobs = {"kv_cache_memory_bytes": 2 * 2**30}
    with pytest.raises(ConfigError, match=r"needs 39\.5 GB for weights and 2\.1 GB"):
        build_setup(node, model, knobs)
    setup = build_setup(node, split(model, 2), knobs, link=LINKS["eth25"])
    block_bytes = 16 * split(model, 2).kv_bytes_per_token  # 4 of its 8 KV heads
    assert setup.describe()["kv_tokens"] == 2 * 2**30 // block_bytes * 16
