"""Host tensors on transparent huge pages: zeros like torch.zeros, copies equal to their
source, huge pages where offered, for the KV cache and for the weights the kernels stream."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

from inflight.huge_pages import (
    HUGE_PAGE,
    empty_on_huge_pages,
    huge_pages_offered,
    zeros_on_huge_pages,
)
from inflight.kernels import load_extension
from inflight.model.gguf_blocks import regroup_blocks
from inflight.model.packed_linear import PackedLinear, can_pack


def anon_huge_kb(address: int) -> int:
    """AnonHugePages of the mapping holding `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0


def test_zeros_on_huge_pages_is_zeros():
    t = zeros_on_huge_pages((3, 5, 7), torch.bfloat16)
    assert t.shape == (3, 5, 7) and t.dtype == torch.bfloat16 and not t.any()
    t[1, 2, 3] = 4.0
    assert t.sum().item() == 4.0
    view = t[1]
    del t  # the memory lives as long as any view of it
    assert view.sum().item() == 4.0


@pytest.mark.skipif(not huge_pages_offered(), reason="no transparent huge pages here")
def test_a_large_cache_tensor_gets_huge_pages():
    t = zeros_on_huge_pages((64 << 20,), torch.uint8)  # 64 MB: ~31 whole 2 MB pages inside
    assert anon_huge_kb(t.data_ptr() + (32 << 20)) >= 2048


@pytest.mark.skipif(not huge_pages_offered(), reason="no transparent huge pages here")
def test_only_whole_huge_pages_inside_a_tensor_are_marked():
    t = empty_on_huge_pages((HUGE_PAGE + 1000,), torch.uint8)
    assert not t.any()
    t.copy_(torch.arange(HUGE_PAGE + 1000, dtype=torch.uint8))
    assert t.data_ptr() % HUGE_PAGE == 0
    assert anon_huge_kb(t.data_ptr()) == 2048  # the one whole page; the tail is not rounded up


@pytest.mark.skipif(not huge_pages_offered(), reason="no transparent huge pages here")
def test_small_tensors_share_huge_pages_each_on_its_own_bytes():
    """Tensors under 2 MB one after another on huge pages: zeros, each on a cache line of its
    own, writes to one leaving the others as they were; tensors of just over 1 MB (an MoE
    file's experts) continue across page boundaries rather than take a page each."""
    sizes = [(1000,), (3, 7), (250_000,), (1,), (300_000,)]
    tensors = [empty_on_huge_pages(shape, torch.float32) for shape in sizes]
    experts = [empty_on_huge_pages((1_100_000,), torch.uint8) for _ in range(20)]
    for t, shape in zip(tensors, sizes, strict=True):
        assert t.shape == shape and not t.any() and t.data_ptr() % 64 == 0
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in tensors + experts)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    for i, t in enumerate(tensors + experts):
        t.fill_(i + 1)
    assert all(bool((t == i + 1).all()) for i, t in enumerate(tensors + experts))
    assert all(anon_huge_kb(t.data_ptr()) >= 2048 for t in tensors)  # (written: faulted in)
    # 22 MB of experts on at most 13 pages (a mapping may end among them), not 20
    pages = {p // HUGE_PAGE for t in experts for p in (t.data_ptr(), t.data_ptr() + t.nbytes - 1)}
    assert len(pages) <= 13
    view = tensors[0][:10]
    del tensors, experts  # the mapping lives as long as any tensor on it
    assert bool((view == 1).all())


def test_a_packed_linear_streams_its_blocks_from_huge_pages():
    ext = load_extension()
    if not (ext.gguf_int_linear_available() and can_pack(torch.float32, torch.device("cpu"))):
        pytest.skip("no AVX2, FMA and F16C on this CPU")
    n, k = 2048, 2048  # Q4_0: 2.25 MiB of blocks
    blocks = torch.randint(0, 256, (n, k // 32, 18), dtype=torch.uint8)
    scales = (torch.rand(n, k // 32) * 0.01).half().view(torch.uint8).view(n, k // 32, 2)
    blocks[..., :2] = scales
    linear = nn.Linear(k, n, bias=False)
    linear.weight = None  # as the loader leaves it: the blocks take every batch
    packed = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks, activation_bits=8)
    x = torch.randn(3, k)
    with torch.inference_mode():
        want = ext.gguf_int_linear(x, regroup_blocks(blocks), None, n, 8)
        assert torch.equal(packed(x), want)
    if huge_pages_offered():
        assert anon_huge_kb(packed.small_weight.data_ptr()) >= 2048
