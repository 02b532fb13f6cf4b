"""Scheduling policies on hand-made outputs: admission order, preemption victims, aging bound."""

from __future__ import annotations

import pytest

from tests.core.helpers import fake_model_output, make_request, make_scheduler


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step(s, clock=None, dt=0.1):
    out = s.schedule()
    finished = [o.request_id for o in s.update_from_output(out, fake_model_output(out))
                if o.finished]  # fmt: skip
    if clock is not None:
        clock.now += dt
    return out, finished


def req(rid, clock=None, priority=0, max_tokens=3, prompt_len=2):
    r = make_request(rid, prompt_len=prompt_len, max_tokens=max_tokens)
    r.priority = priority
    if clock is not None:
        r.arrival_time = clock.now
    return r


def admission_order(s) -> list[str]:
    order = []
    while s.has_unfinished_requests():
        out, _ = step(s)
        order += [x.request_id for x in out.scheduled if x.start_pos == 0]
    return order


def test_priority_admits_lower_values_first_arrival_breaking_ties():
    s = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for rid, p in (("low", 5), ("high", 0), ("mid", 2), ("high2", 0)):
        s.add_request(req(rid, priority=p))
    assert admission_order(s) == ["high", "high2", "mid", "low"]


def test_sjf_admits_shortest_remaining_first():
    s = make_scheduler(max_num_seqs=1, scheduling_policy="sjf")
    for rid, n in (("long", 40), ("short", 2), ("medium", 10)):
        s.add_request(req(rid, max_tokens=n))
    assert admission_order(s) == ["short", "medium", "long"]


def test_fcfs_keeps_arrival_order():
    s = make_scheduler(max_num_seqs=1)
    for rid, p in (("a", 5), ("b", 0), ("c", 2)):
        s.add_request(req(rid, priority=p))
    assert admission_order(s) == ["a", "b", "c"]


def test_a_more_important_arrival_preempts_the_least_important_runner():
    s = make_scheduler(max_num_seqs=2, scheduling_policy="priority")
    s.add_request(req("p3", priority=3, max_tokens=20))
    s.add_request(req("p5", priority=5, max_tokens=20))
    step(s)
    s.add_request(req("urgent", priority=0, max_tokens=2))
    out, _ = step(s)
    assert out.preempted_request_ids == ["p5"]
    assert "urgent" in {x.request_id for x in out.scheduled}  # admitted in the same step
    s.add_request(req("equal", priority=3, max_tokens=2))
    out, _ = step(s)
    assert out.preempted_request_ids == []  # equal priority never preempts


def test_block_shortage_preempts_the_least_important_not_the_newest():
    s = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=3, scheduling_policy="priority")
    s.add_request(req("low", priority=9, max_tokens=30, prompt_len=7))
    s.add_request(req("high", priority=0, max_tokens=30, prompt_len=7))
    preempted = []
    for _ in range(12):
        out, _ = step(s)
        preempted += out.preempted_request_ids
    assert preempted and set(preempted) == {"low"}


@pytest.mark.parametrize("policy", ["priority", "sjf"])
def test_aging_bounds_the_wait_under_a_stream_of_better_requests(policy):
    clock = FakeClock()
    aging_s, dt = 1.0, 0.1
    s = make_scheduler(max_num_seqs=1, scheduling_policy=policy, aging_s=aging_s, clock=clock)
    # "starved" is 5 priority levels worse, or 2**5 = 32x longer
    bad = req("starved", clock, priority=5, max_tokens=64 if policy == "sjf" else 2)
    s.add_request(bad)
    finished_at = None
    for i in range(2000):
        if i % 2 == 0:  # a better request every 2 steps: the seat is never free for long
            s.add_request(req(f"good{i}", clock, priority=0, max_tokens=2))
        _, finished = step(s, clock, dt)
        if "starved" in finished:
            finished_at = clock.now
            break
    # Admitted once its aged rank beats a fresh arrival: after 5 * aging_s (+ a few steps of
    # the request ahead of it), then it runs to completion.
    service = bad.sampling_params.max_tokens * dt
    assert finished_at is not None, "the worse request starved"
    assert finished_at <= 5 * aging_s + service + 10 * dt
    assert finished_at >= 5 * aging_s * 0.9  # and aging, not luck, got it there


def test_without_aging_the_worse_request_does_starve():
    clock = FakeClock()
    s = make_scheduler(max_num_seqs=1, scheduling_policy="priority", aging_s=1e9, clock=clock)
    s.add_request(req("starved", clock, priority=5, max_tokens=2))
    for i in range(300):
        if i % 2 == 0:
            s.add_request(req(f"good{i}", clock, priority=0, max_tokens=2))
        _, finished = step(s, clock)
        assert "starved" not in finished
