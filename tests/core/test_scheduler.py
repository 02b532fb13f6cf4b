"""Scheduler behaviour on hand-made outputs: budget, chunking, seats, preemption, static mode."""

from __future__ import annotations

import pytest

from inflight.request import FinishReason, RequestStatus
from tests.core.helpers import (
    EOS,
    fake_model_output,
    make_request,
    make_scheduler,
    run_to_completion,
)


def test_prefill_chunks_and_decodes_share_one_step():
    s = make_scheduler(max_num_batched_tokens=10, prefill_chunk_size=6)
    s.add_request(make_request("a", prompt_len=3, max_tokens=5))
    out = s.schedule()
    s.update_from_output(out, fake_model_output(out))  # a: prefill done, 1 token sampled
    s.add_request(make_request("b", prompt_len=20, max_tokens=5))
    out = s.schedule()
    tokens = {x.request_id: x.num_tokens for x in out.scheduled}
    assert tokens == {"a": 1, "b": 6}  # a decodes while b's prompt is chunked to 6
    sample = {x.request_id: x.sample for x in out.scheduled}
    assert sample == {"a": True, "b": False}  # mid-prefill samples nothing


def test_chunk_is_clamped_by_budget_and_never_starves_decodes():
    s = make_scheduler(max_num_batched_tokens=8, max_num_seqs=8)
    for i in range(3):
        s.add_request(make_request(f"d{i}", prompt_len=2, max_tokens=50))
    out = s.schedule()
    s.update_from_output(out, fake_model_output(out))
    s.add_request(make_request("long", prompt_len=100, max_tokens=2))
    out = s.schedule()
    s.update_from_output(out, fake_model_output(out))
    # "long" is now running mid-prefill, admitted after the decodes; next step it must leave
    # room for the 3 decodes behind the budget of 8.
    out = s.schedule()
    tokens = {x.request_id: x.num_tokens for x in out.scheduled}
    assert tokens == {"d0": 1, "d1": 1, "d2": 1, "long": 5}
    assert out.num_batched_tokens == 8


def test_seats_cap_running_requests():
    s = make_scheduler(max_num_seqs=2)
    for i in range(5):
        s.add_request(make_request(f"r{i}", prompt_len=4, max_tokens=3))
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == ["r0", "r1"]
    assert (out.num_running, out.num_waiting) == (2, 3)


def test_preemption_takes_the_newest_and_admits_nobody_that_step():
    # 6 blocks of 4 tokens: two requests of 8-token prompts fill 4 blocks; decodes need more.
    s = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=4)
    s.add_request(make_request("old", prompt_len=8, max_tokens=20))
    s.add_request(make_request("new", prompt_len=8, max_tokens=20))
    out = s.schedule()
    assert {x.request_id for x in out.scheduled} == {"old", "new"}
    s.update_from_output(out, fake_model_output(out))
    out = s.schedule()  # both decode into a 3rd block each: 4 + 2 = 6 blocks
    s.update_from_output(out, fake_model_output(out))
    for _ in range(3):
        out = s.schedule()
        s.update_from_output(out, fake_model_output(out))
    s.add_request(make_request("late", prompt_len=1, max_tokens=1))  # would fit in seats/budget
    out = s.schedule()  # both cross into a 4th block: only one fits
    assert out.preempted_request_ids == ["new"]
    assert [x.request_id for x in out.scheduled] == ["old"]  # "late" is not admitted
    new = next(r for r in s.waiting)
    assert new.request_id == "new" and new.num_computed_tokens == 0
    assert new.status is RequestStatus.WAITING and new.num_preemptions == 1
    assert len(new.output_token_ids) > 0  # tokens kept; only the KV is recomputed


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_recompute_resumes_with_prompt_and_earlier_outputs(prefix_caching):
    """The newest request, preempted when the pool runs dry, comes back with its prompt and the
    tokens it had sampled, from the first position its still-cached blocks do not cover (the
    start, without prefix caching)."""
    s = make_scheduler(num_blocks=6, block_size=4, enable_prefix_caching=prefix_caching)
    s.add_request(make_request("old", prompt_len=6, max_tokens=14))
    req = make_request("r", prompt_len=6, max_tokens=10)
    s.add_request(req)
    preempted = False
    for _ in range(40):
        out = s.schedule()
        chunk = next((x for x in out.scheduled if x.request_id == "r"), None)
        if preempted and chunk is not None:
            break
        preempted |= "r" in out.preempted_request_ids
        s.update_from_output(out, fake_model_output(out))
    assert preempted and chunk is not None and req.num_preemptions == 1
    everything = [*req.prompt_token_ids, *req.output_token_ids]
    assert len(req.output_token_ids) > 0  # tokens kept; only the KV is recomputed
    assert chunk.token_ids == everything[chunk.start_pos :] and chunk.start_pos % 4 == 0
    if not prefix_caching:
        assert chunk.start_pos == 0
    assert chunk.sample


def test_stops_on_eos_stop_token_and_length():
    s = make_scheduler()
    eos = make_request("eos", prompt_len=3, max_tokens=10)
    eos.sampling_params.ignore_eos = False
    stop = make_request("stop", prompt_len=3, max_tokens=10, stop_token_ids=[9])
    length = make_request("len", prompt_len=3, max_tokens=1)
    for r in (eos, stop, length):
        s.add_request(r)
    out = s.schedule()
    runner_out = fake_model_output(out)
    runner_out.sampled_token_ids.update({"eos": EOS, "stop": 9})
    results = {o.request_id: o for o in s.update_from_output(out, runner_out)}
    assert results["eos"].finish_reason is FinishReason.STOP and results["eos"].stop_reason is None
    assert results["stop"].finish_reason is FinishReason.STOP and results["stop"].stop_reason == 9
    assert results["len"].finish_reason is FinishReason.LENGTH
    assert s.kv.pool.num_used_blocks == 0 and not s.has_unfinished_requests()


def test_min_tokens_defers_eos():
    s = make_scheduler()
    r = make_request("r", prompt_len=3, max_tokens=10, min_tokens=2)
    r.sampling_params.ignore_eos = False
    s.add_request(r)
    out = s.schedule()
    (o,) = s.update_from_output(out, fake_model_output(out, token=EOS))
    assert o.finish_reason is None
    out = s.schedule()
    (o,) = s.update_from_output(out, fake_model_output(out, token=EOS))
    assert o.finish_reason is FinishReason.STOP


def test_max_model_len_ends_a_request():
    s = make_scheduler(max_model_len=8)
    r = make_request("r", prompt_len=5, max_tokens=100)
    s.add_request(r)
    run_to_completion(s)
    assert r.num_output_tokens == 3  # 5 prompt + 3 outputs = max_model_len
    assert r.finish_reason is FinishReason.LENGTH


def test_abort_frees_blocks_of_running_and_waiting_requests():
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make_request("run", prompt_len=9, max_tokens=5))
    s.add_request(make_request("wait", prompt_len=9, max_tokens=5))
    out = s.schedule()
    assert s.kv.pool.num_used_blocks == 3
    outs = s.finish_requests(["run", "wait", "unknown"], FinishReason.ABORT)
    assert [o.request_id for o in outs] == ["run", "wait"]
    assert all(o.finish_reason is FinishReason.ABORT for o in outs)
    assert s.kv.pool.num_used_blocks == 0 and not s.has_unfinished_requests()
    assert s.schedule().finished_request_ids == ["run", "wait"]
    del out


def test_static_mode_admits_only_into_an_empty_batch():
    s = make_scheduler(max_num_seqs=2, batching="static")
    s.add_request(make_request("a", prompt_len=2, max_tokens=1))
    s.add_request(make_request("b", prompt_len=2, max_tokens=4))
    s.add_request(make_request("c", prompt_len=2, max_tokens=1))
    admitted_while_b_runs = set()
    while s.has_unfinished_requests():
        out = s.schedule()
        ids = {x.request_id for x in out.scheduled}
        if "b" in ids:
            admitted_while_b_runs |= ids
        s.update_from_output(out, fake_model_output(out))
    assert "c" not in admitted_while_b_runs  # a's seat stayed empty until b finished


def test_duplicate_request_id_is_rejected():
    s = make_scheduler()
    s.add_request(make_request("x", prompt_len=1, max_tokens=1))
    with pytest.raises(ValueError, match="duplicate"):
        s.add_request(make_request("x", prompt_len=1, max_tokens=1))
