"""KV-cache tensors on transparent huge pages: zeros like torch.zeros, huge pages where offered."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inflight.runner.huge_pages import huge_pages_offered, zeros_on_huge_pages


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
