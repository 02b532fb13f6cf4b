"""Greedy sampling's C++ argmax against `torch.max(dim=-1).indices`, which it must equal
exactly: first maximum on ties, NaN counted as the maximum, any width and dtype."""

from __future__ import annotations

import pytest
import torch

from inflight.kernels import load_extension
from inflight.runner.sampler import Sampler, first_argmax
from tests.runner.test_sampler import req


@pytest.fixture(scope="module")
def kernel():
    return load_extension().first_argmax


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("width", [1, 5, 16, 17, 100, 49157])
def test_kernel_picks_what_torch_max_picks(kernel, dtype, width):
    torch.manual_seed(width)
    wide = (torch.randn(12, width + 7) * 4).to(dtype)
    x = wide[:, :width]  # rows with a stride wider than the row
    x[0] = 1.0  # one value everywhere: index 0
    x[1] = float("-inf")
    x[2, width // 2] = float("nan")
    x[3, -1] = 1e4  # the maximum in the tail after the last full vector
    x[4, width // 3] = x[4, -1] = 1e4  # a tie between a vector lane and the tail
    x[5, : width // 2] = 3.0  # ties across lanes and vectors: the first one wins
    x[6, -1] = float("nan")
    x[6, 0] = float("inf")
    assert torch.equal(kernel(x), first_argmax(x))
    assert torch.equal(kernel(x[:0]), first_argmax(x[:0]))


def test_kernel_refuses_what_it_cannot_read(kernel):
    with pytest.raises(RuntimeError, match="contiguous rows"):
        kernel(torch.randn(8, 4).t())
    with pytest.raises(RuntimeError, match=r"\[S, V\]"):
        kernel(torch.randn(8))
    with pytest.raises(RuntimeError, match=r"\[S, V\]"):
        kernel(torch.randn(3, 0))


def test_sampler_with_the_kernel_breaks_ties_like_argmax(kernel):
    s = Sampler(torch.device("cpu"), argmax=kernel)
    row = [0, 5, 1, 5, 5, 0, 0, 0]
    logits = torch.tensor([row, row[::-1]], dtype=torch.bfloat16)
    fast, _ = s.sample(logits, [req("a", temperature=0), req("b", temperature=0)])
    slow, _ = s.sample(logits, [req("c", temperature=0), req("d", temperature=0, logprobs=1)])
    assert fast == slow == [1, 3] == logits.float().argmax(-1).tolist()
