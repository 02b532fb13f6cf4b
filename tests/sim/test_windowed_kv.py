"""The simulator sizes a windowed model's pool in pages of its KV groups, as the engine does, and
its scheduler runs the engine's own KV manager over them: Gemma 3 270M holds several times the
32k-token sequences of one table for all layers."""

from __future__ import annotations

import dataclasses

from inflight.sim.hardware import PROFILES
from inflight.sim.model_profile import load_model_profile
from inflight.sim.simulator import build_setup, simulate
from inflight.workload.requests import WorkloadRequest

# whole-length reservations: a request runs only once its longest length fits, so the most
# running at once is what the pool holds
KNOBS = {"max_model_len": 32_768, "kv_cache_memory_bytes": 4 * 2**30, "max_num_seqs": 64,
         "max_num_batched_tokens": 65_536, "prefill_chunk_size": 512,
         "kv_admission": "reserve"}  # fmt: skip


def long_requests(n: int) -> list[WorkloadRequest]:
    return [WorkloadRequest([i + 2] + [1] * 31_999, 8, 0.0) for i in range(n)]  # none shared


def test_gemma3_pool_is_in_pages_of_its_groups():
    gemma = load_model_profile("gemma-3-270m", "bf16", "bf16")
    setup = build_setup(PROFILES["cpu-node-2c"], gemma, KNOBS)
    assert setup.group_windows == (None,) + (512,) * 5
    # a page: 16 tokens of 3 layers, 1 KV head of 256, keys and values in bf16
    page_bytes = 16 * 3 * 2 * 256 * 2
    assert setup.num_kv_blocks == 4 * 2**30 // page_bytes
    llama = load_model_profile("smollm2-135m", "bf16", "bf16")
    knobs = {**KNOBS, "max_model_len": 8192}
    assert build_setup(PROFILES["cpu-node-2c"], llama, knobs).group_windows == (None,)
    # on a GPU too (graphs hold every group's table), unless the knob keeps one table
    assert build_setup(PROFILES["h100-sxm"], gemma, KNOBS).group_windows == setup.group_windows
    one_table = {**KNOBS, "free_window_blocks": False}
    assert build_setup(PROFILES["h100-sxm"], gemma, one_table).group_windows == (None,)


def test_gemma3_runs_five_times_the_long_sequences_at_once():
    gemma = load_model_profile("gemma-3-270m", "bf16", "bf16")
    hardware = PROFILES["cpu-node-2c"]
    grouped = build_setup(hardware, gemma, KNOBS)
    # one table for every layer: what the pool held before, in blocks of all 18 layers
    one_table = dataclasses.replace(
        grouped, group_windows=(None,), num_kv_blocks=grouped.num_kv_blocks // 6
    )
    at_once = {}
    for name, setup in (("grouped", grouped), ("one table", one_table)):
        result = simulate(setup, long_requests(40), name)
        at_once[name] = max(s.num_running for s in result.timeline)
    assert at_once["one table"] == 7  # 4 GiB / (32k tokens x 18 layers x 1 KiB)
    # a sequence's pages: 2,001 of the global layers and at most 65 (512 + a chunk of 512)
    # of each of the 5 windowed groups
    assert at_once["grouped"] == 4 * 2**30 // (16 * 3 * 1024) // (2001 + 5 * 65) == 37
