"""Predictive admission: admit when blocks about to be freed suffice; a wrong guess costs only
the newcomer (it waits or is preempted), never a token of an ordinary running request."""

from __future__ import annotations

from inflight.core.policy import victim_index
from tests.core.helpers import (
    fake_model_output,
    first_steps_to_completion,
    make_request,
    make_scheduler,
    step,
)


def scenario(predictive: bool):
    # 10 blocks of 4 tokens. "ending" holds 4 blocks and is 2 tokens from its end; "steady"
    # holds 4 blocks; the newcomer's 12-token prompt needs 3 blocks while only 2 are free.
    s = make_scheduler(num_blocks=10, block_size=4, max_num_seqs=4, enable_prefix_caching=False,
                       predictive_admission=predictive, prediction_horizon=4)  # fmt: skip
    s.add_request(make_request("ending", prompt_len=13, max_tokens=4))
    s.add_request(make_request("steady", prompt_len=13, max_tokens=3))
    step(s)
    step(s)  # both decode: 15 tokens each, 4 blocks each, 2 free
    s.add_request(make_request("new", prompt_len=12, max_tokens=2))
    return s


def test_predictive_admission_starts_the_newcomer_early():
    off, on = scenario(False), scenario(True)
    out_off, out_on = off.schedule(), on.schedule()
    assert "new" not in {x.request_id for x in out_off.scheduled}
    (new,) = [x for x in out_on.scheduled if x.request_id == "new"]
    assert new.num_tokens == 8  # the 2 free blocks now; the 3rd comes from "ending"
    assert on.admission.stats.predictive_admissions == 1
    on.update_from_output(out_on, fake_model_output(out_on))
    for _ in range(20):
        if not on.has_unfinished_requests():
            break
        step(on)
    assert not on.has_unfinished_requests() and on.admission.stats.prediction_failures == 0
    assert on.kv.pool.num_used_blocks == 0


def test_a_wrong_prediction_costs_the_newcomer_not_a_runner():
    # Whatever the policy, a request admitted on a prediction is the preemption victim before
    # any ordinary running request.
    for policy in ("fcfs", "priority", "sjf"):
        admission = make_scheduler(predictive_admission=True, scheduling_policy=policy).admission
        runners = [make_request(rid, prompt_len=4, max_tokens=8) for rid in "abc"]
        runners[0].priority, runners[2].priority = 9, 0  # "a" least important
        admission.probation.add("b")
        assert admission.preferred_victim(runners, 0) == 1
        assert admission.preferred_victim(runners, 2) is None  # only not-yet-scheduled ones
        assert victim_index(runners, 2, policy) == 2
        admission.probation.clear()
        assert admission.preferred_victim(runners, 0) is None
        assert victim_index(runners, 0, policy) == (0 if policy == "priority" else 2)


def first_steps_under_reserve(predictive: bool):
    """12 blocks of 4 tokens, all reserved: "ending" (12 + 5 tokens: 4 blocks at its longest)
    and "steady" (12 + 20: 8 blocks). The newcomer (8 + 4: 3 blocks) arrives after their
    prompts, when "ending" is 4 tokens from its end."""
    s = make_scheduler(num_blocks=12, block_size=4, max_num_seqs=4, enable_prefix_caching=False,
                       kv_admission="reserve", predictive_admission=predictive,
                       prediction_horizon=4)  # fmt: skip
    s.add_request(make_request("ending", prompt_len=12, max_tokens=5))
    s.add_request(make_request("steady", prompt_len=12, max_tokens=20))
    step(s)
    s.add_request(make_request("new", prompt_len=8, max_tokens=4))
    first = first_steps_to_completion(s, first_step=1, max_steps=39)
    assert s.kv.pool.num_free_blocks == 12
    return s, first["new"]


def test_under_reserve_a_prediction_borrows_the_reservation_of_a_request_about_to_end():
    _, started_off = first_steps_under_reserve(False)
    on, started_on = first_steps_under_reserve(True)
    assert started_off == 5  # "ending" samples its last token at step 4
    assert started_on == 1 and on.admission.stats.predictive_admissions == 1
    # It took only blocks no ordinary request needed before "ending" gave its own back.
    assert on.num_preemptions == on.admission.stats.prediction_failures == 0
