"""KVCacheManager: maps each request to its block table, grows it on demand, and shares full
blocks between requests through the prefix cache.

A request holds exactly `cdiv(num_computed_tokens + num_scheduled_tokens, block_size)` blocks
after `allocate_slots`; blocks are appended only when its tokens cross a block boundary, and all
of them are released in `free` the moment the request finishes, is aborted or preempted.

    block_size = 4, 10 tokens computed, 3 scheduled -> 13 slots -> 4 blocks
    block table [7, 2, 9, 4]:  |t0 t1 t2 t3|t4 t5 t6 t7|t8 t9 s0 s1|s2 . . .|

Prefix caching: block i of a request is identified by a chained hash
`h_i = hash((h_{i-1}, tokens of block i))`, rooted in the request's `cache_salt`. Once a block is
full and computed its hash is published; a new request starts with the longest run of cached
full blocks of its tokens (at most `num_tokens - 1` tokens, so one is always computed and
sampled from) and never writes into them: its new tokens land in blocks of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from inflight.core.block_pool import BlockPool
from inflight.core.sizing import cdiv
from inflight.metrics.stats import PrefixCacheStats
from inflight.request import Request


def extend_block_hashes(
    hashes: list[int], tokens: Sequence[int], block_size: int, salt: str | None, num_full: int
) -> None:
    """Appends the chained hashes of full blocks `len(hashes) .. num_full - 1` of `tokens`."""
    parent = hashes[-1] if hashes else hash(("inflight", salt))
    for i in range(len(hashes), num_full):
        parent = hash((parent, tuple(tokens[i * block_size : (i + 1) * block_size])))
        hashes.append(parent)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        # Swap space: CPU blocks holding the KV of swapped-out requests (no prefix caching).
        self.cpu_pool = BlockPool(num_cpu_blocks) if num_cpu_blocks else None
        self.swapped: dict[str, list[int]] = {}  # request -> its CPU block table
        self.block_tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}  # request -> hashes of its full blocks
        self._num_published: dict[str, int] = {}  # request -> leading blocks already cached
        self.prefix_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.pool.usage

    # ----------------------------------------------------------- prefix cache
    def block_hashes(self, request: Request) -> list[int]:
        """Hashes of every full block of the request's known tokens, extended incrementally."""
        hashes = self._hashes.setdefault(request.request_id, [])
        num_full = request.num_tokens // self.block_size
        if len(hashes) < num_full:
            extend_block_hashes(hashes, request.all_token_ids, self.block_size,
                                request.cache_salt, num_full)  # fmt: skip
        return hashes

    def get_computed_blocks(self, request: Request) -> list[int]:
        """The longest cached prefix of a request that has computed nothing yet."""
        if not self.enable_prefix_caching or request.num_computed_tokens:
            return []
        if request.lacks_prompt_logprobs:  # a cached block's logits were never computed here
            return []
        block_size = self.block_size
        max_blocks = (request.num_tokens - 1) // block_size
        hashes = self.block_hashes(request)
        tokens = request.all_token_ids
        blocks: list[int] = []
        for i in range(max_blocks):
            block_id = self.pool.lookup(
                hashes[i], tuple(tokens[i * block_size : (i + 1) * block_size])
            )
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_stats.queries += num_tokens
            self.prefix_stats.hits += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Publishes the request's blocks that became full and computed since the last call."""
        if not self.enable_prefix_caching:
            return
        table = self.block_tables.get(request.request_id)
        start = self._num_published.get(request.request_id, 0)
        num_full = request.num_computed_tokens // self.block_size
        if not table or num_full <= start:
            return
        block_size = self.block_size
        hashes = self.block_hashes(request)
        tokens = request.all_token_ids
        for i in range(start, num_full):
            self.pool.cache(
                table[i], hashes[i], tuple(tokens[i * block_size : (i + 1) * block_size])
            )
        self._num_published[request.request_id] = num_full

    # ---------------------------------------------------------------- blocks
    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        """Makes room for `num_new_tokens` more tokens after the request's computed ones (and
        after `computed_blocks`, a prefix hit taken at admission). False, with no change, if the
        pool is short."""
        computed_blocks = computed_blocks or []
        table = self.block_tables.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed_blocks) * self.block_size
        needed = cdiv(num_computed + num_new_tokens, self.block_size) - len(table)
        needed -= len(computed_blocks)
        if max(0, needed) + self.num_revived(computed_blocks) > self.pool.num_free_blocks:
            return False
        table = self.block_tables.setdefault(request.request_id, [])
        if computed_blocks:
            self.pool.touch(computed_blocks)
            table.extend(computed_blocks)
        if needed > 0:
            table.extend(self.pool.allocate(needed))
        return True

    def trim(self, request: Request) -> None:
        """Frees the blocks past the request's computed tokens: the slots of rejected drafts
        (never hashed: only full computed blocks are)."""
        table = self.block_tables.get(request.request_id)
        keep = cdiv(request.num_computed_tokens, self.block_size)
        if table and len(table) > keep:
            self.pool.free(table[keep:])
            del table[keep:]

    def num_revived(self, computed_blocks: list[int]) -> int:
        """Cached blocks of a prefix hit that nobody holds: taking them takes free blocks."""
        return sum(1 for b in computed_blocks if self.pool.blocks[b].ref_count == 0)

    # ------------------------------------------------------------------ swap
    def can_swap_out(self, request: Request) -> bool:
        table = self.block_tables.get(request.request_id, [])
        return self.cpu_pool is not None and 0 < len(table) <= self.cpu_pool.num_free_blocks

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Moves the request's blocks to CPU blocks; returns (device block, CPU block) copies
        that must run before anything writes the freed device blocks."""
        assert self.cpu_pool is not None
        table = self.block_tables[request.request_id]
        cpu_blocks = self.cpu_pool.allocate(len(table))
        self.free(request)  # reads and drops the device table
        self.swapped[request.request_id] = cpu_blocks
        return list(zip(table, cpu_blocks, strict=True))

    def is_swapped(self, request: Request) -> bool:
        return request.request_id in self.swapped

    def swap_in(self, request: Request, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Brings a swapped-out request back with room for `num_new_tokens` more; returns
        (CPU block, device block) copies, or None (no change) if device blocks are short."""
        assert self.cpu_pool is not None
        cpu_blocks = self.swapped[request.request_id]
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        if max(total, len(cpu_blocks)) > self.pool.num_free_blocks:
            return None
        device_blocks = self.pool.allocate(len(cpu_blocks))
        copies = list(zip(cpu_blocks, device_blocks, strict=True))
        self.block_tables[request.request_id] = device_blocks
        del self.swapped[request.request_id]
        self.cpu_pool.free(cpu_blocks)
        assert self.allocate_slots(request, num_new_tokens)  # grows the table in place
        return copies

    def free(self, request: Request) -> None:
        """Releases every block of the request, on the device and in swap space (cached device
        blocks stay reusable until evicted)."""
        swapped = self.swapped.pop(request.request_id, None)
        if swapped:
            assert self.cpu_pool is not None  # only swap mode swaps
            self.cpu_pool.free(swapped)
        self._num_published.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)
        table = self.block_tables.pop(request.request_id, None)
        if table:
            # Reversed, so a sequence's tail blocks (least likely to be shared) are evicted first.
            self.pool.free(table[::-1])

    def get_block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])
