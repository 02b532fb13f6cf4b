"""Property-based scheduler invariants over random arrivals, lengths, aborts and pool sizes."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inflight.core.kv_cache_manager import cdiv
from inflight.core.kv_groups import NULL_BLOCK
from inflight.request import FinishReason, RequestStatus
from tests.core.helpers import fake_model_output, make_request, make_scheduler


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    max_model_len = draw(st.integers(8, 96))
    # KV groups: one full (most models), or windowed ones beside it (Gemma), or only windowed
    # ones (Mistral)
    window = st.integers(1, 40)
    group_windows = draw(st.sampled_from([[None], [None], [None, 0], [None, 0, 0], [0]]))
    group_windows = [w if w is None else draw(window) for w in group_windows]
    # The engine guarantees one max_model_len request always fits in the pool.
    need = len(group_windows) * cdiv(max_model_len, block_size)
    num_blocks = draw(st.integers(need, 3 * need))
    knobs = dict(
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(8, 128)),
        prefill_chunk_size=draw(st.one_of(st.none(), st.integers(1, 32))),
        batching=draw(st.sampled_from(["continuous", "static"])),
        # prompts all start with the same tokens, so prefix caching shares blocks heavily
        enable_prefix_caching=draw(st.booleans()),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority", "sjf"])),
        preemption_mode=draw(st.sampled_from(["recompute", "swap"])),
        num_cpu_blocks=draw(st.integers(0, num_blocks)),
        kv_admission=draw(st.sampled_from(["on-demand", "reserve"])),
        predictive_admission=draw(st.booleans()),
        prediction_horizon=draw(st.integers(1, 16)),
        num_speculative_tokens=draw(st.sampled_from([0, 0, 3])),
    )
    requests = []
    priorities = st.integers(0, 3)
    for i in range(draw(st.integers(1, 16))):
        prompt_len = draw(st.integers(1, max_model_len - 1))
        max_tokens = draw(st.integers(1, max_model_len - prompt_len))
        arrival_step = draw(st.integers(0, 30))
        abort_step = draw(st.one_of(st.none(), st.integers(0, 60)))
        requests.append((f"r{i}", prompt_len, max_tokens, arrival_step, abort_step,
                         draw(priorities)))  # fmt: skip
    return block_size, num_blocks, max_model_len, knobs, requests, group_windows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_scheduler_invariants_hold_every_step(workload):
    block_size, num_blocks, max_model_len, knobs, specs, group_windows = workload
    s = make_scheduler(num_blocks, block_size, max_model_len, group_windows=group_windows,
                       **knobs)  # fmt: skip
    reqs = {}
    finished: dict[str, FinishReason] = {}
    step = 0
    while step < 5000:
        for rid, prompt_len, max_tokens, arrival, _, priority in specs:
            if arrival == step:
                reqs[rid] = make_request(rid, prompt_len, max_tokens)
                reqs[rid].priority = priority
                s.add_request(reqs[rid])
        to_abort = [rid for rid, *_, abort, _ in specs if abort == step and rid in s.requests]
        for o in s.finish_requests(to_abort, FinishReason.ABORT):
            finished[o.request_id] = o.finish_reason

        out = s.schedule()
        assert out.num_batched_tokens <= knobs["max_num_batched_tokens"]
        assert sum(x.num_tokens for x in out.scheduled) == out.num_batched_tokens
        assert len(s.running) <= knobs["max_num_seqs"]
        assert len({x.request_id for x in out.scheduled}) == len(out.scheduled)
        chunk = knobs["prefill_chunk_size"] or knobs["max_num_batched_tokens"]
        assert all(x.num_tokens <= chunk or x.num_tokens == 1 + len(x.draft_token_ids)
                   for x in out.scheduled)  # fmt: skip
        # each group holds exactly the blocks from the first its window reaches from the
        # step's first query to the last scheduled token (every block, in a full group)
        for x in out.scheduled:
            end = cdiv(x.start_pos + x.num_tokens, block_size)
            for g, table in enumerate(s.kv.get_block_tables(x.request_id)):
                first = s.kv.first_block(g, x.start_pos)
                assert len(table) == end and table[:first] == [NULL_BLOCK] * first
                assert NULL_BLOCK not in table[first:]

        for o in s.update_from_output(out, fake_model_output(out)):
            if o.finished:
                finished[o.request_id] = o.finish_reason

        pool = s.kv.pool
        assert pool.num_free_blocks + pool.num_used_blocks == num_blocks
        # Exact accounting with sharing: every block's ref count is the number of tables holding
        # it, and the used blocks are exactly the blocks some table holds.
        holders = Counter(b for r in s.kv.block_tables for b in s.kv.held_pages(r))
        assert len(holders) == pool.num_used_blocks
        assert all(pool.blocks[b].ref_count == n for b, n in holders.items())
        for r in s.running:
            tables = s.kv.get_block_tables(r.request_id)
            assert len(tables) == len(group_windows)
            assert all(len(t) == cdiv(r.num_computed_tokens, block_size) for t in tables)
        for r in s.waiting:
            assert r.status is RequestStatus.WAITING and not s.kv.get_block_table(r.request_id)
            if s.kv.is_swapped(r):  # swapped requests keep their progress in CPU blocks
                assert all(len(t) == cdiv(r.num_computed_tokens, block_size)
                           for t in s.kv.swapped[r.request_id])  # fmt: skip
        if s.kv.cpu_pool is not None:
            assert s.kv.cpu_pool.num_used_blocks == sum(
                len(t) - t.count(NULL_BLOCK) for ts in s.kv.swapped.values() for t in ts
            )
        pool.check_invariants()

        step += 1
        if step > 30 and not s.has_unfinished_requests():
            break

    if knobs["kv_admission"] == "reserve" and knobs["scheduling_policy"] != "priority":
        # Reservations leave no running request short of blocks: the only preemptions are
        # of requests admitted on a prediction that failed.
        assert s.num_preemptions == s.admission.stats.prediction_failures
    assert set(finished) == set(reqs), "every request must finish"
    for rid, _prompt_len, max_tokens, *_ in specs:
        if finished[rid] is not FinishReason.ABORT:
            assert reqs[rid].num_output_tokens == max_tokens
    assert s.kv.pool.num_free_blocks == num_blocks, "all blocks must be back in the pool"
    if s.speculation is not None:
        assert s.speculation.stats.accepted <= s.speculation.stats.drafted
    assert s.kv.cpu_pool is None or s.kv.cpu_pool.num_used_blocks == 0
