"""Which replica serves a request: one policy for the simulator's fleet and for Ray Serve.

A policy sees the request's prefix key (the chained hashes of its first full KV blocks, as the
prefix cache computes them) and every live replica's load (requests waiting + running), and
names a replica. Replicas are any hashable ids (indices in the simulator, Ray's replica ids),
and may come and go between calls.

- `round-robin`: in turn.
- `least-loaded`: the smallest load (ties: the first).
- `power-of-two`: the less loaded of two replicas drawn at random: near least-loaded balance
  without every caller herding onto the same replica between load reports.
- `prefix-aware`: the replica that last served the longest of the request's leading blocks, as
  long as its load exceeds the least loaded replica's by at most `margin`; otherwise
  power-of-two. Prefix-cache hits need the earlier request's blocks on the same replica.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

from inflight.core.kv_cache_manager import extend_block_hashes

PREFIX_BLOCKS = 32  # leading blocks that key a request (512 tokens at 16 per block)
TABLE_SIZE = 100_000  # prefix hashes remembered, least recently used dropped first

ReplicaId = Hashable


def prefix_key(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None,
               max_blocks: int = PREFIX_BLOCKS) -> list[int]:  # fmt: skip
    """Hashes of the request's first full blocks (at most `max_blocks`), shortest prefix first."""
    hashes: list[int] = []
    num_full = min(len(token_ids) // block_size, max_blocks)
    extend_block_hashes(hashes, token_ids, block_size, cache_salt, num_full)
    return hashes


class Router:
    """Base of the policies: `choose` names a replica among `loads`' keys (never empty)."""

    name = "base"
    uses_prefix = False  # whether `choose` reads the prefix key (callers may skip computing it)

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.prefix_routed = 0  # requests sent where their prefix was
        self.load_routed = 0  # requests sent by load alone

    def choose(self, prefix: Sequence[int], loads: Mapping[ReplicaId, int]) -> ReplicaId:
        raise NotImplementedError

    def _two_choices(self, loads: Mapping[ReplicaId, int]) -> ReplicaId:
        replicas = list(loads)
        if len(replicas) == 1:
            return replicas[0]
        a, b = self.rng.sample(replicas, 2)
        return a if loads[a] <= loads[b] else b


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._turn = 0

    def choose(self, prefix: Sequence[int], loads: Mapping[ReplicaId, int]) -> ReplicaId:
        replicas = list(loads)
        self.load_routed += 1
        self._turn += 1
        return replicas[(self._turn - 1) % len(replicas)]


class LeastLoaded(Router):
    name = "least-loaded"

    def choose(self, prefix: Sequence[int], loads: Mapping[ReplicaId, int]) -> ReplicaId:
        self.load_routed += 1
        return min(loads, key=loads.__getitem__)


class PowerOfTwo(Router):
    name = "power-of-two"

    def choose(self, prefix: Sequence[int], loads: Mapping[ReplicaId, int]) -> ReplicaId:
        self.load_routed += 1
        return self._two_choices(loads)


class PrefixAware(Router):
    name = "prefix-aware"
    uses_prefix = True

    def __init__(self, seed: int = 0, margin: int = 8, table_size: int = TABLE_SIZE) -> None:
        super().__init__(seed)
        self.margin = margin
        self.table_size = table_size
        self.owner: OrderedDict[int, ReplicaId] = OrderedDict()  # prefix hash -> replica

    def choose(self, prefix: Sequence[int], loads: Mapping[ReplicaId, int]) -> ReplicaId:
        least = min(loads.values())
        choice = None
        for h in reversed(prefix):  # the longest known prefix first
            replica = self.owner.get(h)
            if replica in loads and loads[replica] - least <= self.margin:
                choice = replica
                break
        if choice is None:
            self.load_routed += 1
            choice = self._two_choices(loads)
        else:
            self.prefix_routed += 1
        for h in prefix:  # this replica now holds (or soon will) these blocks
            self.owner[h] = choice
            self.owner.move_to_end(h)
        while len(self.owner) > self.table_size:
            self.owner.popitem(last=False)
        return choice

    def forget(self, replica: ReplicaId) -> None:
        """Drops a replica's prefixes (it died: its cache is gone)."""
        for h in [h for h, r in self.owner.items() if r == replica]:
            del self.owner[h]


POLICIES: dict[str, type[Router]] = {
    p.name: p for p in (RoundRobin, LeastLoaded, PowerOfTwo, PrefixAware)
}
ROUTERS = tuple(POLICIES)


def make_router(name: str, seed: int = 0) -> Router:
    if name not in POLICIES:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return POLICIES[name](seed)
