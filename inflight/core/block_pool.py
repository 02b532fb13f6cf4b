"""BlockPool: the global pool of fixed-size KV blocks, with reference counts, an LRU free queue
and the hash -> block map of the prefix cache.

Invariant: every block is either free (ref_count == 0, in the free queue) or used
(ref_count > 0, not in the queue), so `num_free_blocks + num_used_blocks == num_blocks` always.

A full block may carry a hash (of its tokens and of everything before it). It keeps the hash
after its last user frees it: it then sits in the free queue as a reusable prefix-cache entry
until `allocate` takes it from the head of the queue (least recently freed first) and evicts
the entry. A cache hit takes a block back out of the queue (`touch`). A hit is confirmed against
the block's stored token ids, so a hash collision can never serve the wrong KV.
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
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None  # kept to confirm hash hits


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # OrderedDict as an O(1) queue that also allows O(1) removal from the middle (`touch`).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # block hash -> block id
        self.num_refs = 0  # sum of ref counts == blocks held by all block tables together
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, in [0, 1]."""
        return self.num_used_blocks / self.num_blocks

    def allocate(self, n: int) -> list[int]:
        """Takes `n` blocks from the head of the free queue, evicting their cache entries."""
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        ids = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = block.token_ids = None
                self.num_evictions += 1
            block.ref_count = 1
            ids.append(block_id)
        self.num_refs += n
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference to each block; blocks reaching zero join the queue's tail."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of block {block_id}")
            block.ref_count -= 1
            self.num_refs -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def touch(self, block_ids: list[int]) -> None:
        """Takes a reference to cached blocks (a prefix hit), reviving free ones."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1
            self.num_refs += 1

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """The cached block with this hash and exactly these tokens, if any."""
        block_id = self._cached.get(block_hash)
        if block_id is None or self.blocks[block_id].token_ids != token_ids:
            return None
        return block_id

    def cache(self, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> None:
        """Publishes a full block under its hash (first publisher wins)."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash, block.token_ids = block_hash, token_ids
        self._cached[block_hash] = block_id

    def block_states(self) -> str:
        """One character a block, for the dashboard's map: 0 free, 1 in use, 2 free but
        holding a cached prefix."""
        return "".join(
            "1" if b.ref_count else "2" if b.block_hash is not None else "0" for b in self.blocks
        )

    def check_invariants(self) -> None:
        used = sum(1 for b in self.blocks if b.ref_count > 0)
        assert used == self.num_used_blocks, (used, self.num_used_blocks)
        assert all(self.blocks[i].ref_count == 0 for i in self._free)
        assert all(self.blocks[b].block_hash == h for h, b in self._cached.items())
        assert self.num_refs == sum(b.ref_count for b in self.blocks)


class SwapSpace:
    """Host blocks that hold swapped-out KV: ids handed out and taken back, one owner a block
    and no prefix cache. Fresh ids come from a counter and returned ones from a stack, so it
    costs nothing to build at the size of a whole swap budget (a BlockPool of the million
    blocks a tiny model's GiB buys takes ~1.5 s)."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self._next_fresh = 0  # ids from here up were never handed out
        self._returned: list[int] = []
        self._used = bytearray(num_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self._next_fresh + len(self._returned)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free_blocks:
            raise NoFreeBlocksError(f"asked for {n} swap blocks, {self.num_free_blocks} free")
        reused = min(n, len(self._returned))
        ids = self._returned[len(self._returned) - reused :]
        del self._returned[len(self._returned) - reused :]
        ids += range(self._next_fresh, self._next_fresh + n - reused)
        self._next_fresh += n - reused
        for block_id in ids:
            self._used[block_id] = 1
        return ids

    def free(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            if not self._used[block_id]:
                raise RuntimeError(f"double free of swap block {block_id}")
            self._used[block_id] = 0
            self._returned.append(block_id)
