"""Host tensors backed by transparent huge pages, for the KV cache.

Paged attention reads each (block, head) run of 2 KB from wherever the block table points in a
pool of gigabytes. On 4 KB pages almost every run is a TLB miss and a page walk; on 2 MB pages
a run's translation is usually cached (decode attention over scattered blocks is measurably
faster). Linux hands out huge pages to a range marked `MADV_HUGEPAGE` when
`/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise` (the common default);
the mark must come before the first touch, so the tensor gets a fresh mapping.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import mmap
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@functools.cache
def huge_pages_offered() -> bool:
    """Whether this OS gives huge pages to ranges that ask for them."""
    try:
        mode = _THP_MODE.read_text()
    except OSError:
        return False
    return hasattr(mmap, "MADV_HUGEPAGE") and ("[always]" in mode or "[madvise]" in mode)


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """`torch.zeros(shape, dtype)` on the CPU, in a fresh anonymous mapping whose 2 MB pages are
    marked for huge pages before anything touches them (the allocator's heap could hand back
    memory already faulted in 4 KB pages). Where the OS offers no huge pages, or refuses, the
    pages are ordinary ones; never an error."""
    numel = math.prod(shape)
    if not huge_pages_offered() or numel == 0:
        return torch.zeros(shape, dtype=dtype)
    nbytes = numel * dtype.itemsize
    # private and anonymous: zero-filled, nothing faulted in yet (shared memory has no THP)
    buf = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(buf)
    offset = -ctypes.addressof(view) % HUGE_PAGE  # the tensor starts on a 2 MB boundary
    del view  # the export would pin the mapping; the tensor below keeps it alive instead
    try:
        buf.madvise(mmap.MADV_HUGEPAGE, offset, len(buf) - offset)
    except OSError as e:
        logger.debug("madvise(MADV_HUGEPAGE) refused: %s", e)
    # the tensor holds a reference to `buf`; touching it now pays the page faults at startup
    return torch.frombuffer(buf, dtype=dtype, count=numel, offset=offset).view(shape).zero_()
