"""KVCacheManager: maps each request to its block tables, grows them on demand, and shares full
blocks between requests through the prefix cache.

A request holds exactly `cdiv(num_computed_tokens + num_scheduled_tokens, block_size)` blocks
after `allocate_slots`; blocks are appended only when its tokens cross a block boundary, and all
of them are released in `free` the moment the request finishes, is aborted or preempted.

    block_size = 4, 10 tokens computed, 3 scheduled -> 13 slots -> 4 blocks
    block table [7, 2, 9, 4]:  |t0 t1 t2 t3|t4 t5 t6 t7|t8 t9 s0 s1|s2 . . .|

That is one table per KV group (`kv_groups.py`); most models have one group. A windowed group
holds only the blocks its window still reaches from the step's first query (position c sees
c - window + 1 .. c): `allocate_slots` gives the older ones back to the pool first, and the
table names the null block there. With window 5 and 13 slots as above, c = 10:

    windowed table [-1, 2, 9, 4]:  |. . . .|t4 t5 t6 t7|t8 t9 s0 s1|s2 . . .|   (t6.. seen)

The pool's unit is then a page: one block of tokens for one group's layers.

Prefix caching: block i of a request is identified by a chained hash
`h_i = hash((h_{i-1}, tokens of block i))`, rooted in the request's `cache_salt` (and, for
groups after the first, salted by the group). Once a block is full and computed its hash is
published; a new request starts with the longest run of cached full blocks of its tokens (at
most `num_tokens - 1` tokens, so one is always computed and sampled from; in a windowed group,
only the blocks its window reaches from there) and never writes into them: its new tokens land
in blocks of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from inflight.core.block_pool import BlockPool, SwapSpace
from inflight.core.kv_groups import NULL_BLOCK
from inflight.core.sizing import cdiv
from inflight.core.state_snapshots import StateSnapshots
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


@dataclass
class PrefixHit:
    """A new request's cached prefix: `num_blocks` blocks of tokens, each group's table of them
    (a windowed group's starts with null blocks)."""

    num_blocks: int
    tables: list[list[int]]
    state_row: int | None = None  # a state-carrying model's snapshot after them (`StateSnapshots`)

    @property
    def pages(self) -> list[int]:
        return [b for table in self.tables for b in table if b != NULL_BLOCK]


NO_HIT = PrefixHit(0, [])


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        num_cpu_blocks: int = 0,
        group_windows: Sequence[int | None] = (None,),
        snapshots: StateSnapshots | None = None,
        swap_state_blocks: int = 0,
        reuse_decoded_kv: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # a block's tokens computed as decodes serve only requests that compute them alike
        # (`_key`), unless reusing them is asked for
        self.reuse_decoded_kv = reuse_decoded_kv
        # a state-carrying model's: a hit reaches only as far as a saved state (`StateSnapshots`)
        self.snapshots = snapshots if enable_prefix_caching else None
        self.group_windows = tuple(group_windows)
        self.windowed = any(w is not None for w in self.group_windows)
        self.pool = BlockPool(num_blocks)
        # Swap space: CPU blocks holding the KV of swapped-out requests (no prefix caching).
        self.cpu_pool = SwapSpace(num_cpu_blocks) if num_cpu_blocks else None
        self.swapped: dict[str, list[list[int]]] = {}  # request -> its CPU tables
        # A state-carrying model's swapped request keeps its state in host memory beside its
        # KV (`runner.conv_state.ConvState.swap_out`), charged to the swap space as the blocks
        # its bytes would fill, so that the space's budget bounds both.
        self.swap_state_blocks = swap_state_blocks
        self._state_blocks: dict[str, list[int]] = {}  # request -> blocks charged for its state
        self.block_tables: dict[str, list[list[int]]] = {}  # request -> a table per group
        self._hashes: dict[str, list[int]] = {}  # request -> hashes of its full blocks
        self._num_published: dict[str, int] = {}  # request -> leading blocks already cached
        # a state-carrying model's request -> where its prompt left the cached blocks (of other
        # requests' prompts) though no state was saved there: it saves one (`state_boundaries`)
        self._shared_ends: dict[str, int] = {}
        self.prefix_stats = PrefixCacheStats()
        self.num_window_releases = 0  # pages windowed groups gave back before their request ended

    @property
    def usage(self) -> float:
        return self.pool.usage

    # ------------------------------------------------------------ arithmetic
    def first_block(self, group: int, first_query: int) -> int:
        """The first block a group still reads when the step's first query is at
        `first_query`: 0 for full attention."""
        window = self.group_windows[group]
        if window is None:
            return 0
        return max(0, first_query - window + 1) // self.block_size

    def pages_for_span(self, start: int, num_tokens: int) -> int:
        """Pages a request holds once tokens `start .. start + num_tokens - 1` are computed in
        one step, every token before them cached."""
        end = cdiv(start + num_tokens, self.block_size)
        return sum(end - self.first_block(g, start) for g in range(len(self.group_windows)))

    def pages_for(self, num_tokens: int) -> int:
        """Pages a decoding request holds with `num_tokens` tokens cached (the last one just
        computed): `cdiv(num_tokens, block_size)` for a model of one full group."""
        return self.pages_for_span(num_tokens - 1, 1) if num_tokens > 0 else 0

    def _live(self, table: list[int], window: int | None) -> list[int]:
        """A table's held pages: all of a full group's; a windowed group's after its leading
        null blocks (a short run from the end)."""
        if window is None:
            return table
        first = len(table)
        while first and table[first - 1] != NULL_BLOCK:
            first -= 1
        return table[first:]

    @staticmethod
    def _out_of_window(table: list[int], first: int) -> list[int]:
        """Indices below `first` of pages a windowed table still holds: they sit just below it,
        after the null run of earlier steps' releases (found from `first` down, not from 0)."""
        held = []
        i = min(first, len(table)) - 1
        while i >= 0 and table[i] != NULL_BLOCK:
            held.append(i)
            i -= 1
        return held

    def _tables(self, request_id: str) -> Iterator[tuple[list[int], int | None]]:
        """(table, window) of each group of the request (none without tables)."""
        tables = self.block_tables.get(request_id)
        return zip(tables or (), self.group_windows if tables else (), strict=True)

    def num_held(self, request_id: str) -> int:
        return sum(len(self._live(table, window)) for table, window in self._tables(request_id))

    def num_held_for_reservation(self, request_id: str) -> int:
        """Pages the request holds, less its windowed groups' pages that others hold too: a
        window gives such a page back without freeing it, and the request takes a new one
        later (what `Reserve` counts as held; `num_held` with one group)."""
        blocks = self.pool.blocks
        held = 0
        for table, window in self._tables(request_id):
            live = self._live(table, window)
            held += len(live) if window is None else sum(blocks[b].ref_count == 1 for b in live)
        return held

    def held_pages(self, request_id: str) -> list[int]:
        return [b for table, window in self._tables(request_id) for b in self._live(table, window)]

    def pages_needed(self, request: Request, num_new: int, hit: PrefixHit = NO_HIT) -> int:
        """Free pages `allocate_slots(request, num_new, hit)` takes: new ones, and cached ones
        of the hit that nobody holds; less the out-of-window pages it gives back first."""
        start = request.num_computed_tokens + hit.num_blocks * self.block_size
        end = cdiv(start + num_new, self.block_size)
        tables = self.block_tables.get(request.request_id) or hit.tables
        needed = self.num_revived(hit)
        for g in range(len(self.group_windows)):
            table = tables[g] if tables else []
            needed += max(0, end - len(table))
            needed -= sum(1 for i in self._out_of_window(table, self.first_block(g, start))
                          if self.pool.blocks[table[i]].ref_count == 1)  # fmt: skip
        return needed

    def max_new_tokens(self, request: Request, extra_pages: int, hit: PrefixHit = NO_HIT) -> int:
        """The most tokens the request can compute next in `extra_pages` more pages than it
        holds (or, new, than its hit holds), the pages its windows give back reused:
        `(held + extra) * block_size - computed` for a model of one full group."""
        start = request.num_computed_tokens + hit.num_blocks * self.block_size
        held = (
            self.num_held(request.request_id)
            if request.request_id in self.block_tables
            else len(hit.pages)
        )
        groups = range(len(self.group_windows))
        # after the step a group holds its blocks from `first_block` to cdiv(start + n)
        budget = held + extra_pages + sum(self.first_block(g, start) for g in groups)
        return max(0, budget // len(groups) * self.block_size - start)

    # ----------------------------------------------------------- prefix cache
    def block_hashes(self, request: Request) -> list[int]:
        """Hashes of every full block of the request's known tokens, extended incrementally."""
        hashes = self._hashes.setdefault(request.request_id, [])
        num_full = request.num_tokens // self.block_size
        if len(hashes) < num_full:
            extend_block_hashes(hashes, request.all_token_ids, self.block_size,
                                request.cache_salt, num_full)  # fmt: skip
        return hashes

    def _key(self, request: Request, block: int, group: int = 0) -> int:
        """The pool's (and the saved states') key of a request's block `block` of a group: its
        chained hash, with how many of its tokens are prompt tokens where fewer than all. A
        token past the prompt attends as a decode (an output, a draft, an output recomputed
        after preemption) and a prompt token through the prompt kernel, which round otherwise:
        so a block serves only requests that would compute each of its tokens alike (its own
        recompute after a preemption; not a conversation's next turn, whose prompt holds the
        answer), unless `reuse_decoded_kv`. Group 0's keys of prompt blocks are the hashes."""
        key = self.block_hashes(request)[block]
        prompt = min(max(request.num_prompt_tokens - block * self.block_size, 0), self.block_size)
        if prompt < self.block_size and not self.reuse_decoded_kv:
            key = hash((key, prompt))
        return key if group == 0 else hash((group, key))

    def get_computed_blocks(self, request: Request) -> PrefixHit:
        """The longest cached prefix of a request that has computed nothing yet."""
        if not self.enable_prefix_caching or request.num_computed_tokens:
            return NO_HIT
        if request.lacks_prompt_logprobs:  # a cached block's logits were never computed here
            return NO_HIT
        block_size = self.block_size
        max_blocks = (request.num_tokens - 1) // block_size
        tokens = request.all_token_ids

        looked_up: dict[tuple[int, int], int | None] = {}

        def lookup(group: int, i: int) -> int | None:
            if (group, i) not in looked_up:
                block_tokens = tuple(tokens[i * block_size : (i + 1) * block_size])
                key = self._key(request, i, group)
                looked_up[group, i] = self.pool.lookup(key, block_tokens)
            return looked_up[group, i]

        n = max_blocks
        groups = range(len(self.group_windows))
        windowed = [g for g in groups if self.group_windows[g] is not None]
        for g in groups:  # every block from the first, in every full group
            if self.group_windows[g] is None:
                n = next((i for i in range(n) if lookup(g, i) is None), n)
        # in the windowed groups, the blocks each window reaches from the first new token
        while n > 0 and any(lookup(g, i) is None for g in windowed
                            for i in range(self.first_block(g, n * block_size), n)):  # fmt: skip
            n -= 1
        state_row = None
        if self.snapshots is not None:  # (no further than a state saved after a block)
            shared = n
            while n > 0 and (state_row := self.snapshots.lookup(self._key(request, n - 1))) is None:
                n -= 1
            # others' prompts went on as this one does: save a state there
            end = shared * block_size
            if shared > n and self._state_savable(request, end):
                self._shared_ends[request.request_id] = end
        if n == 0:
            return NO_HIT
        tables = []
        for g in groups:
            first = self.first_block(g, n * block_size)
            blocks = [lookup(g, i) for i in range(first, n)]
            tables.append([NULL_BLOCK] * first + [b for b in blocks if b is not None])
        return PrefixHit(n, tables, state_row)

    def state_to_save(self, request: Request) -> int | None:
        """The snapshot row a state-carrying model's request saves its state into before its
        next step, where its computed tokens end a full block whose state is not saved yet;
        None otherwise. Past its prompt only with `reuse_decoded_kv`: such a state would serve
        no other request (`_key`), and would push out the saved states that do."""
        computed = request.num_computed_tokens
        if self.snapshots is None or not computed or computed % self.block_size:
            return None
        if not self._state_savable(request, computed):
            return None
        return self.snapshots.save(self._key(request, computed // self.block_size - 1))

    def _state_savable(self, request: Request, num_tokens: int) -> bool:
        """Whether the state after the request's first `num_tokens` is one to save: within its
        prompt, and past it only with `reuse_decoded_kv` (see `state_to_save`)."""
        return num_tokens <= request.num_prompt_tokens or self.reuse_decoded_kv

    def state_boundaries(self, request: Request) -> list[int]:
        """Where a state-carrying model's prompt chunks end so that the state after them is
        saved (`state_to_save`), ascending: where its prompt left the blocks other prompts had
        cached (a system prompt they share: the next request with it resumes there), and its
        last full block (a conversation's next turn resumes there)."""
        last = (request.num_tokens - 1) // self.block_size * self.block_size
        shared = self._shared_ends.get(request.request_id)
        return [shared, last] if shared is not None and shared < last else [last]

    def state_saved_at(self, request: Request, num_tokens: int) -> bool:
        """Whether the state after the request's first `num_tokens` (a full block's end) is
        saved."""
        assert self.snapshots is not None and num_tokens % self.block_size == 0
        last_block = num_tokens // self.block_size - 1
        return self.snapshots.lookup(self._key(request, last_block)) is not None

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_stats.queries += num_tokens
            self.prefix_stats.hits += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Publishes the request's blocks that became full and computed since the last call."""
        if not self.enable_prefix_caching:
            return
        tables = self.block_tables.get(request.request_id)
        start = self._num_published.get(request.request_id, 0)
        num_full = request.num_computed_tokens // self.block_size
        if not tables or num_full <= start:
            return
        block_size = self.block_size
        tokens = request.all_token_ids
        for i in range(start, num_full):
            block_tokens = tuple(tokens[i * block_size : (i + 1) * block_size])
            for g, table in enumerate(tables):
                if table[i] != NULL_BLOCK:
                    self.pool.cache(table[i], self._key(request, i, g), block_tokens)
        self._num_published[request.request_id] = num_full

    # ---------------------------------------------------------------- blocks
    def allocate_slots(
        self, request: Request, num_new_tokens: int, hit: PrefixHit = NO_HIT
    ) -> bool:
        """Makes room for `num_new_tokens` more tokens after the request's computed ones (and
        after `hit`, a prefix hit taken at admission). Pages out of a windowed group's reach
        go back to the pool first; then False, with nothing else changed, if the pool is
        short."""
        start = request.num_computed_tokens + hit.num_blocks * self.block_size
        tables = self.block_tables.get(request.request_id)
        if tables is not None:
            self._release_out_of_window(tables, start)
        if self.pages_needed(request, num_new_tokens, hit) > self.pool.num_free_blocks:
            return False
        if tables is None:
            tables = [list(t) for t in hit.tables] or [[] for _ in self.group_windows]
            self.block_tables[request.request_id] = tables
            self.pool.touch(hit.pages)
        end = cdiv(start + num_new_tokens, self.block_size)
        for table in tables:
            if end > len(table):
                table.extend(self.pool.allocate(end - len(table)))
        return True

    def _release_out_of_window(self, tables: list[list[int]], first_query: int) -> None:
        for g, table in enumerate(tables):
            for i in self._out_of_window(table, self.first_block(g, first_query)):
                self.pool.free([table[i]])
                table[i] = NULL_BLOCK
                self.num_window_releases += 1

    def trim(self, request: Request) -> None:
        """Frees the blocks past the request's computed tokens: the slots of rejected drafts
        (never hashed: only full computed blocks are)."""
        keep = cdiv(request.num_computed_tokens, self.block_size)
        for table in self.block_tables.get(request.request_id, ()):
            if len(table) > keep:
                self.pool.free([b for b in table[keep:] if b != NULL_BLOCK])
                del table[keep:]

    def num_revived(self, hit: PrefixHit) -> int:
        """Cached blocks of a prefix hit that nobody holds: taking them takes free blocks."""
        return sum(1 for b in hit.pages if self.pool.blocks[b].ref_count == 0)

    # ------------------------------------------------------------------ swap
    def can_swap_out(self, request: Request) -> bool:
        held = self.num_held(request.request_id)
        return (self.cpu_pool is not None
                and 0 < held <= self.cpu_pool.num_free_blocks - self.swap_state_blocks)  # fmt: skip

    def swap_out(self, request: Request) -> list[tuple[int, int]]:
        """Moves the request's blocks to CPU blocks; returns (device block, CPU block) copies
        that must run before anything writes the freed device blocks."""
        assert self.cpu_pool is not None
        tables = self.block_tables[request.request_id]
        copies, cpu_tables = [], []
        for table in tables:
            live = [b for b in table if b != NULL_BLOCK]
            cpu = iter(self.cpu_pool.allocate(len(live)))
            cpu_table = [NULL_BLOCK if b == NULL_BLOCK else next(cpu) for b in table]
            copies += [(b, c) for b, c in zip(table, cpu_table, strict=True) if b != NULL_BLOCK]
            cpu_tables.append(cpu_table)
        self.free(request)  # reads and drops the device tables
        self.swapped[request.request_id] = cpu_tables
        if self.swap_state_blocks:
            self._state_blocks[request.request_id] = self.cpu_pool.allocate(self.swap_state_blocks)
        return copies

    @property
    def num_swap_blocks_held(self) -> int:
        """Swap-space blocks the swapped requests hold: their KV's and their states' charge."""
        kv = sum(len(t) - t.count(NULL_BLOCK) for ts in self.swapped.values() for t in ts)
        return kv + sum(map(len, self._state_blocks.values()))

    def is_swapped(self, request: Request) -> bool:
        return request.request_id in self.swapped

    def swap_in(self, request: Request, num_new_tokens: int) -> list[tuple[int, int]] | None:
        """Brings a swapped-out request back with room for `num_new_tokens` more; returns
        (CPU block, device block) copies, or None (no change) if device blocks are short."""
        assert self.cpu_pool is not None
        cpu_tables = self.swapped[request.request_id]
        live = sum(len(t) - t.count(NULL_BLOCK) for t in cpu_tables)
        total = self.pages_for_span(request.num_computed_tokens, num_new_tokens)
        if max(total, live) > self.pool.num_free_blocks:
            return None
        device = iter(self.pool.allocate(live))
        tables = [[NULL_BLOCK if c == NULL_BLOCK else next(device) for c in t]
                  for t in cpu_tables]  # fmt: skip
        copies = [(c, b) for ct, t in zip(cpu_tables, tables, strict=True)
                  for c, b in zip(ct, t, strict=True) if c != NULL_BLOCK]  # fmt: skip
        self.block_tables[request.request_id] = tables
        del self.swapped[request.request_id]
        self.cpu_pool.free([c for c, _ in copies] + self._state_blocks.pop(request.request_id, []))
        assert self.allocate_slots(request, num_new_tokens)  # grows the tables in place
        return copies

    def free(self, request: Request) -> None:
        """Releases every block of the request, on the device and in swap space (cached device
        blocks stay reusable until evicted)."""
        swapped = self.swapped.pop(request.request_id, None)
        if swapped:
            assert self.cpu_pool is not None  # only swap mode swaps
            self.cpu_pool.free([b for t in swapped for b in t if b != NULL_BLOCK]
                               + self._state_blocks.pop(request.request_id, []))  # fmt: skip
        self._num_published.pop(request.request_id, None)
        self._hashes.pop(request.request_id, None)
        self._shared_ends.pop(request.request_id, None)
        for table in self.block_tables.pop(request.request_id, ()):
            # Reversed, so a sequence's tail blocks (least likely to be shared) are evicted first.
            self.pool.free([b for b in table[::-1] if b != NULL_BLOCK])

    def get_block_table(self, request_id: str) -> list[int]:
        """Group 0's table (every position: the only one of a model of one group)."""
        tables = self.block_tables.get(request_id)
        return tables[0] if tables else []

    def get_block_tables(self, request_id: str) -> list[list[int]]:
        return self.block_tables.get(request_id, [])
