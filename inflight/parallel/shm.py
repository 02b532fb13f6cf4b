"""An all-reduce through shared memory, for ranks on one machine.

gloo sends every all-reduce through loopback sockets, a few milliseconds each on busy cores;
a step makes two a layer. Here each rank copies its tensor into its own slot of a mapped file
in /dev/shm, publishes the op's sequence number in its own counter, waits for every other
rank's, then sums the slots in rank order, so every rank computes the same bits. Slots
alternate between two halves by the sequence number's parity: a rank that has seen every
counter reach `seq` knows each other rank has finished op `seq - 1`, so the half that op read
is free for op `seq + 1`. Each counter has one writer; x86 keeps a rank's stores in order, so
a counter is never seen before the data it follows (other CPUs fall back to gloo).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

COUNTER_STRIDE = 8  # int64s between counters: one cache line each
SLOT_BYTES = 16 << 20  # per rank and half: the largest tensor reduced here (larger: gloo)
SHM_DIR = Path("/dev/shm")
CHECK_EVERY_S = 0.5  # how often a waiting rank asks whether the others are still there
SPIN_LOOKS = 64  # looks at the counters, yielding between them, before a rank naps (~100 us)
NAP_S = 50e-6  # between later looks (Linux wakes a sleeper ~50-100 us late)


def shared_memory_usable() -> bool:
    """Whether the ranks can meet here: a /dev/shm and a CPU that keeps stores in order."""
    return SHM_DIR.is_dir() and platform.machine() in ("x86_64", "AMD64")


def segment_bytes(size: int) -> int:
    return size * COUNTER_STRIDE * 8 + 2 * size * SLOT_BYTES


class ShmAllReduce:
    def __init__(self, path: Path, rank: int, size: int, timeout_s: float) -> None:
        """Maps `path` (rank 0 creates it, `segment_bytes(size)` long, before any rank maps
        it)."""
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        raw = torch.from_file(str(path), shared=True, size=segment_bytes(size), dtype=torch.uint8)
        head = size * COUNTER_STRIDE * 8
        self._counters = raw[:head].view(torch.int64)[::COUNTER_STRIDE]
        self._slots = raw[head:].view(2, size, SLOT_BYTES)
        self._seq = 0

    def fits(self, x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.numel() * x.element_size() <= SLOT_BYTES

    def all_reduce(self, x: torch.Tensor, check: Callable[[], str | None]) -> torch.Tensor:
        """The sum of every rank's `x` into `x`, the same bits on every rank. While waiting,
        `check()` is asked now and then why the others may never come (a rank gone): its
        answer, or a wait past the timeout, raises RuntimeError."""
        self._seq += 1
        seq, nbytes = self._seq, x.numel() * x.element_size()
        half = self._slots[seq % 2]
        flat = x.contiguous().view(-1)
        half[self.rank, :nbytes].view(x.dtype).copy_(flat)
        self._counters[self.rank] = seq
        self._wait_for(seq, check)
        parts = [half[r, :nbytes].view(x.dtype) for r in range(self.size)]
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        x.copy_(total.view(x.shape))
        return x

    def _wait_for(self, seq: int, check: Callable[[], str | None]) -> None:
        """Spins a little (a rank that is about to arrive costs no sleep), then sleeps between
        looks, so that a rank kept waiting (a slower one's compute, or more ranks than cores)
        leaves the cores to the ranks still working."""
        start = next_check = time.monotonic()
        looks = 0
        while int(self._counters.min()) < seq:
            looks += 1
            if looks <= SPIN_LOOKS:
                os.sched_yield()
                continue
            now = time.monotonic()
            if now >= next_check:
                if why := check():
                    raise RuntimeError(why)
                if now - start > self.timeout_s:
                    raise RuntimeError(f"a rank did not reach all-reduce {seq} within "
                                       f"{self.timeout_s:g} s")  # fmt: skip
                next_check = now + CHECK_EVERY_S
            time.sleep(NAP_S)
