"""BlockPool: the global pool of fixed-size KV blocks, with reference counts and a free queue.

Invariant: every block is either free (ref_count == 0, in the free queue) or used
(ref_count > 0, not in the queue), so `num_free_blocks + num_used_blocks == num_blocks` always.
The free queue is ordered oldest-freed first; it is where an LRU eviction order will live once
freed blocks keep prefix-cache hashes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


class NoFreeBlocksError(RuntimeError):
    """Asked for more blocks than are free; callers check `num_free_blocks` first."""


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # OrderedDict as an O(1) queue that also allows O(1) removal from the middle.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        """Takes `n` blocks from the head of the free queue and returns their ids."""
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        ids = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            self.blocks[block_id].ref_count = 1
            ids.append(block_id)
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference to each block; blocks reaching zero join the queue's tail."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of block {block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def check_invariants(self) -> None:
        used = sum(1 for b in self.blocks if b.ref_count > 0)
        assert used == self.num_used_blocks, (used, self.num_used_blocks)
        assert all(self.blocks[i].ref_count == 0 for i in self._free)
