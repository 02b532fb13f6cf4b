"""The seeds' example: 100 requests averaging 50 output tokens on 10 seats.

Both modes run the same scheduler on hand-made outputs; the step counts are checked against an
independent model of each mode (static: every batch lasts as long as its longest member;
continuous: list scheduling, a seat is refilled the step after it frees).
"""

from __future__ import annotations

import heapq
import random

import pytest

from tests.core.helpers import make_request, make_scheduler, run_to_completion

SEATS = 10
# 100 output lengths with mean exactly 50: pairs (k, 100 - k), shuffled deterministically.
_HALF = [(j * 37) % 99 + 1 for j in range(50)]
LENGTHS = _HALF + [100 - k for k in _HALF]
random.Random(0).shuffle(LENGTHS)


def static_steps(lengths: list[int]) -> int:
    return sum(max(lengths[i : i + SEATS]) for i in range(0, len(lengths), SEATS))


def continuous_steps(lengths: list[int]) -> int:
    seats = [0] * SEATS  # step at which each seat is free again
    end = 0
    for n in lengths:
        start = heapq.heappop(seats)
        heapq.heappush(seats, start + n)
        end = max(end, start + n)
    return end


def run(batching: str) -> int:
    s = make_scheduler(
        num_blocks=10_000, block_size=16, max_model_len=512, max_num_seqs=SEATS, batching=batching
    )
    for i, n in enumerate(LENGTHS):
        s.add_request(make_request(f"r{i}", prompt_len=8, max_tokens=n))
    return run_to_completion(s)


def test_seeds_example_continuous_needs_fewer_steps(capsys):
    assert sum(LENGTHS) / len(LENGTHS) == pytest.approx(50)
    static, continuous = run("static"), run("continuous")
    assert static == static_steps(LENGTHS)
    assert continuous == continuous_steps(LENGTHS)
    assert continuous < static
    with capsys.disabled():
        print(
            f"\n[seeds example] 100 requests, mean 50 output tokens, 10 seats: "
            f"static {static} steps, continuous {continuous} steps "
            f"({static / continuous:.2f}x fewer)"
        )
