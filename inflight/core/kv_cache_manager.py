"""KVCacheManager: maps each request to its block table and grows it on demand.

A request holds exactly `cdiv(num_computed_tokens + num_scheduled_tokens, block_size)` blocks
after `allocate_slots`; blocks are appended only when its tokens cross a block boundary, and all
of them go back to the pool in `free` the moment the request finishes, is aborted or preempted.

    block_size = 4, 10 tokens computed, 3 scheduled -> 13 slots -> 4 blocks
    block table [7, 2, 9, 4]:  |t0 t1 t2 t3|t4 t5 t6 t7|t8 t9 s0 s1|s2 . . .|
"""

from __future__ import annotations

from inflight.core.block_pool import BlockPool
from inflight.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.block_tables: dict[str, list[int]] = {}

    @property
    def usage(self) -> float:
        return self.pool.usage

    def num_new_blocks(self, request: Request, num_new_tokens: int) -> int:
        """Blocks `allocate_slots(request, num_new_tokens)` would have to take from the pool."""
        table = self.block_tables.get(request.request_id, ())
        needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return max(0, needed - len(table))

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Makes room for `num_new_tokens` more tokens; False (no change) if blocks are short."""
        n = self.num_new_blocks(request, num_new_tokens)
        if n > self.pool.num_free_blocks:
            return False
        table = self.block_tables.setdefault(request.request_id, [])
        if n:
            table.extend(self.pool.allocate(n))
        return True

    def free(self, request: Request) -> None:
        """Returns every block of the request to the pool (a no-op if it holds none)."""
        table = self.block_tables.pop(request.request_id, None)
        if table:
            # Freed in reverse so a sequence's tail blocks, least likely to be shared, go first.
            self.pool.free(table[::-1])

    def get_block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])
