"""`kv_admission="reserve"`: a request is admitted only when its whole length (prompt +
max_tokens) fits beside what running requests are still owed, so nothing is ever preempted for
blocks; on demand admits on the first chunk's blocks and preempts when they run out."""

from __future__ import annotations

from tests.core.helpers import (
    fake_model_output,
    first_steps_to_completion,
    make_request,
    make_scheduler,
)


def run(kv_admission: str, **knobs):
    """10 blocks of 4 tokens. "a" and "b" each need 5 blocks at their longest (8 + 12 tokens,
    the last never computed), "c" needs 4 (4 + 12): all three fit at first, not at their
    longest."""
    s = make_scheduler(num_blocks=10, block_size=4, max_num_seqs=4, enable_prefix_caching=False,
                       kv_admission=kv_admission, **knobs)  # fmt: skip
    for rid, prompt_len, max_tokens in [("a", 8, 12), ("b", 8, 12), ("c", 4, 12)]:
        s.add_request(make_request(rid, prompt_len, max_tokens))
    first_step = first_steps_to_completion(s, max_steps=100)
    assert s.kv.pool.num_free_blocks == 10
    return s, first_step


def test_reserve_waits_for_the_whole_length_and_never_preempts():
    on_demand, started = run("on-demand")
    assert started == {"a": 0, "b": 0, "c": 0}
    assert on_demand.num_preemptions > 0  # 5 + 5 + 4 blocks do not fit in 10

    reserve, started = run("reserve")
    assert reserve.num_preemptions == 0
    # "c" starts the step after "a" and "b" sampled their 12th token and ended (step 11).
    assert started == {"a": 0, "b": 0, "c": 12}


def test_a_request_longer_than_the_free_reservation_waits_even_with_blocks_free():
    s = make_scheduler(num_blocks=10, block_size=4, kv_admission="reserve",
                       enable_prefix_caching=False)  # fmt: skip
    s.add_request(make_request("long", prompt_len=4, max_tokens=29))  # 8 blocks at its longest
    s.add_request(make_request("next", prompt_len=4, max_tokens=9))  # 3 blocks
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == ["long"]
    assert s.kv.pool.num_free_blocks == 9  # blocks are still allocated on demand
    assert s.admission.forecast.unreserved_blocks(s.running) == 2


def test_priority_preemption_frees_a_reservation():
    s = make_scheduler(num_blocks=10, block_size=4, kv_admission="reserve",
                       scheduling_policy="priority", enable_prefix_caching=False)  # fmt: skip
    low = make_request("low", prompt_len=4, max_tokens=28)
    s.add_request(low)
    out = s.schedule()
    s.update_from_output(out, fake_model_output(out))
    urgent = make_request("urgent", prompt_len=4, max_tokens=8)
    urgent.priority = -1
    s.add_request(urgent)
    out = s.schedule()
    assert out.preempted_request_ids == ["low"]
    assert [x.request_id for x in out.scheduled] == ["urgent"]
