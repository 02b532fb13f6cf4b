"""Host tensors backed by transparent huge pages: the KV cache and the weights kernels stream.

Paged attention reads each (block, head) run of 2 KB from wherever the block table points in a
pool of gigabytes. On 4 KB pages almost every run is a TLB miss and a page walk; on 2 MB pages
a run's translation is usually cached (decode attention over scattered blocks is measurably
faster). A decode step streams every weight once, front to back: on 4 KB pages that is a page
walk every 4 KB, which in a VM (two-level translation) holds a 2-core streaming read below what
the memory gives (docs/benchmarks.md, "Weights on huge pages"). Linux hands out huge pages to a
range marked `MADV_HUGEPAGE` when `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or
`madvise` (the common default); the mark must come before the first touch, so the tensor gets a
fresh mapping. Only the whole 2 MB pages inside a tensor are marked: its tail stays on 4 KB
pages, so a huge page never holds memory past the tensor's end. Tensors smaller than a huge page
(a small model's every weight, an MoE file's every expert) are packed one after another, across
page boundaries, into shared mappings of 32 huge pages instead: at most one partly filled page
(under 2 MB) a mapping is held past what they use.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import mmap
import threading
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


def empty_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of `shape`, zero-filled, for memory a kernel streams: where it spans a huge
    page or more, in a fresh anonymous mapping (nothing faulted in yet) whose whole 2 MB pages
    are marked for huge pages before anything touches them (the allocator's heap could hand
    back memory already faulted in 4 KB pages), so that its producer writes it in place; where
    it is smaller, in the next free bytes of a shared mapping of huge pages (`_SmallTensors`).
    Where the OS offers no huge pages, or refuses, ordinary pages; never an error. For memory
    that lives as long as a model: a small tensor's bytes are not reused after it is freed, only
    its mapping once every tensor on it is."""
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if not huge_pages_offered() or nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    if nbytes < HUGE_PAGE:
        buf, offset = _small_tensors.take(nbytes)
    else:
        buf, offset = _huge_mapping(nbytes)
    # the tensor holds a reference to `buf`
    return torch.frombuffer(buf, dtype=dtype, count=numel, offset=offset).view(shape)


def _huge_mapping(nbytes: int) -> tuple[mmap.mmap, int]:
    """A fresh mapping and the offset in it of `nbytes` starting on a 2 MB boundary, whose
    whole huge pages are marked (private and anonymous: zero-filled, nothing faulted in yet;
    shared memory has no THP)."""
    buf = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(buf)
    offset = -ctypes.addressof(view) % HUGE_PAGE
    del view  # the export would pin the mapping; the tensors on it keep it alive instead
    try:
        buf.madvise(mmap.MADV_HUGEPAGE, offset, nbytes // HUGE_PAGE * HUGE_PAGE)
    except OSError as e:
        logger.debug("madvise(MADV_HUGEPAGE) refused: %s", e)
    return buf, offset


class _SmallTensors:
    """Tensors under 2 MB, one after another (each on a cache line) in mappings of `PAGES` huge
    pages of their own: a decode step streams a small model's weights through a TLB entry per
    2 MB rather than per 4 KB (the default model's layers are 0.3-1.1 MB each). A tensor may
    straddle two pages: starting a page for each tensor that does not fit the rest of the last
    would hold tensors of just over 1 MB (a Qwen3-30B-A3B-shaped file's experts) at nearly
    twice their bytes, 1.6 GB past the weights of its first 8 layers."""

    ALIGN = 64
    PAGES = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mapping: mmap.mmap | None = None
        self._start = self._used = 0

    def take(self, nbytes: int) -> tuple[mmap.mmap, int]:
        with self._lock:
            at = -(-self._used // self.ALIGN) * self.ALIGN
            if self._mapping is None or at + nbytes > self.PAGES * HUGE_PAGE:
                self._mapping, self._start = _huge_mapping(self.PAGES * HUGE_PAGE)
                at = 0
            self._used = at + nbytes
            return self._mapping, self._start + at


_small_tensors = _SmallTensors()


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """`torch.zeros(shape, dtype)` on the CPU, on huge pages where offered
    (`empty_on_huge_pages`), touched now so that start-up pays the page faults."""
    return empty_on_huge_pages(shape, dtype).zero_()
