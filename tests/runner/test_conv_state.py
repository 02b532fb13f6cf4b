"""The convolution state's rows beyond a running request's slot (`runner/conv_state.py`): a
swapped request's stash in host memory and a speculating request's draft rows, on rank 0 and
as another tensor-parallel rank follows it (`mirror`), with the rows' values checked."""

from __future__ import annotations

import torch

from inflight.core.outputs import ScheduledRequest
from inflight.runner.conv_state import ConvState
from inflight.sampling_params import SamplingParams


def state(num_drafts: int = 0) -> ConvState:
    return ConvState(1, 2, kernel=3, channels=4, dtype=torch.float32,
                     device=torch.device("cpu"), recurrent=(2, 3, 3),
                     num_drafts=num_drafts)  # fmt: skip


def scheduled(request_id: str, tokens: list[int], start: int,
              drafts: list[int] = ()) -> ScheduledRequest:  # fmt: skip
    return ScheduledRequest(request_id, tokens + list(drafts), start, [0], True,
                            SamplingParams(), tokens, [], draft_token_ids=list(drafts))  # fmt: skip


def rows(s: ConvState, row: int) -> list[torch.Tensor]:
    return [t[row].clone() for t in s.layers + s.recurrent]


def fill(s: ConvState, row: int, value: float) -> None:
    for t in s.layers + s.recurrent:
        t[row] = value


def test_a_swapped_requests_row_is_stashed_and_restored_on_every_rank():
    """Swapped out, a request's row goes to host memory and its slot is free; it resumes, in
    whatever slot it gets, from those values at the position it left; another rank stashes and
    restores its own rows alike; a request that ends while swapped leaves nothing stashed."""
    rank0, other = state(), state()
    first = rank0.step([scheduled("a", [1, 2, 3], 0)], [0, 3])
    first.commit()
    (slot,) = first.rows[1]
    fill(rank0, slot, 5.0), fill(other, slot, 5.0)
    moved = rank0.swap_out(["a"])
    assert moved == [("a", slot)] and rank0.release(["a"]) == []
    other.mirror(moved, [], [])
    assert rank0.num_stashed == other.num_stashed == 1 and rank0.num_free_slots == 2
    rank0.step([scheduled("b", [7], 0)], [0, 1]).commit()  # b takes that slot and writes it
    fill(rank0, slot, -1.0), fill(other, slot, -1.0)
    back = scheduled("a", [4], 3)
    step = rank0.step([back], [0, 1])
    (resumed,) = step.rows[1]
    assert resumed != slot and step.rows[0] == [resumed]  # its row restored, then read
    other.mirror_step_copies([back], step.rows[1])
    for row in (rows(rank0, resumed), rows(other, resumed)):
        assert all(bool((t == 5.0).all()) for t in row)
    assert rank0.num_stashed == other.num_stashed == 0
    step.commit()
    other.mirror(rank0.swap_out(["a"]), [], [])
    assert rank0.release(["a"]) == []  # (its preemption: the slot back, the stash kept)
    dropped = rank0.release(["a", "b"])  # a ends while swapped out; b while running
    assert dropped == ["a"] and rank0.num_free_slots == 2
    other.mirror([], dropped, [])
    assert rank0.num_stashed == other.num_stashed == 0


def test_a_speculating_request_keeps_the_state_after_its_last_kept_draft():
    """A verify step names a draft row of the request's slot for each token but its last; the
    slot then takes the row of its last kept draft (none copied where all are kept), its
    position moved back by the rejected ones, and another rank makes the same copy."""
    rank0, other = state(num_drafts=3), state(num_drafts=3)
    first = rank0.step([scheduled("a", [1, 2], 0)], [0, 2])
    first.commit()
    (slot,) = first.rows[1]
    verify = scheduled("a", [3], 2, drafts=[4, 5, 6])
    step = rank0.step([scheduled("p", [9, 9], 0), verify], [0, 2, 6])
    first_draft_row = 2 + 2  # slots, the zero and scratch rows (no saved states)
    draft_rows = [first_draft_row + slot * 3 + i for i in range(3)]
    assert step.snapshot_rows.tolist() == [-1, -1, *draft_rows, -1]
    step.commit()
    for i, row in enumerate(draft_rows):
        fill(rank0, row, float(i)), fill(other, row, float(i))
    rank0.keep_drafts(verify, 1)  # the first draft kept: the state after token 1
    copies = rank0.take_kept_drafts()
    assert copies == [(draft_rows[1], slot)] and rank0.take_kept_drafts() == []
    other.mirror([], [], copies)
    for row in (rows(rank0, slot), rows(other, slot)):
        assert all(bool((t == 1.0).all()) for t in row)
    rank0.step([scheduled("a", [5], 4)], [0, 1])  # resumes at 2 + 1 + 1: no error
    all_kept = scheduled("a", [5], 4, drafts=[6])
    rank0.step([all_kept], [0, 2]).commit()
    rank0.keep_drafts(all_kept, 1)
    assert rank0.take_kept_drafts() == []
    rank0.step([scheduled("a", [7], 6)], [0, 1])
