"""The shared-memory all-reduce: every rank gets the sum, bit for bit the same, op after op
through the alternating halves; a rank that never arrives is reported, not waited on forever."""

from __future__ import annotations

import threading

import pytest
import torch

from inflight.parallel.shm import SLOT_BYTES, ShmAllReduce, segment_bytes


def ranks(tmp_path, size: int, timeout_s: float = 30.0) -> list[ShmAllReduce]:
    path = tmp_path / "segment"
    with path.open("wb") as f:
        f.truncate(segment_bytes(size))
    return [ShmAllReduce(path, r, size, timeout_s) for r in range(size)]


def run_together(work, size: int) -> list:
    results: list = [None] * size
    errors: list = []

    def one(rank: int) -> None:
        try:
            results[rank] = work(rank)
        except Exception as e:  # (reported to the test below)
            errors.append(e)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


@pytest.mark.parametrize("size", [2, 3])
def test_every_rank_gets_the_same_sum_op_after_op(tmp_path, size):
    shms = ranks(tmp_path, size)
    generator = torch.Generator().manual_seed(0)
    # shapes change between ops (a step's tokens do): 7 ops cross both halves several times
    inputs = [[torch.randn(n, 5, generator=generator) for n in (1, 64, 3, 1000, 2, 17, 8)]
              for _ in range(size)]  # fmt: skip

    def work(rank: int) -> list[torch.Tensor]:
        return [shms[rank].all_reduce(x.clone(), lambda: None) for x in inputs[rank]]

    results = run_together(work, size)
    for op in range(7):
        want = inputs[0][op].clone()
        for r in range(1, size):
            want += inputs[r][op]
        for r in range(size):
            assert torch.equal(results[r][op], want)  # the same bits on every rank


def test_a_tensor_larger_than_a_slot_does_not_fit(tmp_path):
    shm = ranks(tmp_path, 2)[0]
    assert shm.fits(torch.zeros(SLOT_BYTES // 4))
    assert not shm.fits(torch.zeros(SLOT_BYTES // 4 + 1))
    assert shm.fits(torch.zeros(SLOT_BYTES // 2, dtype=torch.bfloat16))


def test_a_rank_that_never_arrives_is_reported(tmp_path):
    shm = ranks(tmp_path, 2, timeout_s=0.3)[0]
    with pytest.raises(RuntimeError, match=r"did not reach all-reduce 1 within 0\.3 s"):
        shm.all_reduce(torch.ones(4), lambda: None)
    shm = ranks(tmp_path, 2)[0]
    with pytest.raises(RuntimeError, match="rank 1 exited"):
        shm.all_reduce(torch.ones(4), lambda: "rank 1 exited")
