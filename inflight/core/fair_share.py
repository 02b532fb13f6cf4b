"""Fair share between tenants: the Virtual Token Counter (VTC; "Fairness in Serving Large
Language Models", OSDI'24) inside the scheduler, at the granularity of tokens.

Each tenant's counter is the tokens the engine computed for it (prompt chunks and decodes, as
they run) divided by its weight. The waiting queue serves the backlogged tenant with the least
counter first, FIFO within a tenant, and a request's prompt is charged to a provisional copy of
the counters while one step's queue is ordered, so one step's admissions interleave tenants.
Priority classes come first: fairness orders tenants within the best class waiting. Preemption
for blocks takes the newest request of the most-served tenant. When every seat is taken and the
next waiting request's tenant holds less than its share of the seats (by weight, among tenants
with work, at least one whole seat), the tenant most over its share gives back its newest
request (`share_victim`): a tenant that comes back to a saturated engine starts at once, not
after a flood's requests end. A tenant that returns from idle starts at
the least counter of the tenants still active (no credit banked while away), so between any two
tenants that stay backlogged the counters differ by a bounded amount (about twice the largest
request's tokens), however much either sends.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping

from inflight.config import is_tenant_weight
from inflight.core.policy import FCFSQueue
from inflight.request import Request


class TenantShares:
    """Weights and weighted service (the counters) of every tenant seen."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        for tenant, weight in (weights or {}).items():
            if not is_tenant_weight(weight):
                raise ValueError(f"tenant {tenant!r}: weight must be positive, got {weight!r}")
        self.weights = dict(weights or {})
        self.counters: dict[str, float] = {}
        self.served_tokens: dict[str, int] = {}  # unweighted, since the start
        self._step_tokens: dict[str, int] = {}  # unweighted, since the last `take`

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def on_served(self, tenant: str, num_tokens: int) -> None:
        self.counters[tenant] = self.counter(tenant) + num_tokens / self.weight(tenant)
        self.served_tokens[tenant] = self.served_tokens.get(tenant, 0) + num_tokens
        self._step_tokens[tenant] = self._step_tokens.get(tenant, 0) + num_tokens

    def take(self) -> dict[str, int]:
        """Tokens computed per tenant since the last call (a step record's)."""
        taken, self._step_tokens = self._step_tokens, {}
        return taken

    def on_active(self, tenant: str, active: Iterable[str]) -> None:
        """`tenant` has work again after none: lifted to the least counter among the `active`
        tenants (those with work), so time away earns it nothing."""
        others = [self.counter(t) for t in active if t != tenant]
        if others:
            self.counters[tenant] = max(self.counter(tenant), min(others))


class FairQueue(FCFSQueue):
    """The waiting queue under `fair`: ordered by `prepare` (the module docstring says how)."""

    def __init__(self, shares: TenantShares) -> None:
        super().__init__()
        self.shares = shares

    def prepare(self, now: float) -> None:
        groups: dict[tuple[int, str], deque[Request]] = {}
        for request in self._queue:  # queue order within a group: preempted ones first
            groups.setdefault((request.priority, request.tenant), deque()).append(request)
        provisional = {tenant: self.shares.counter(tenant) for _, tenant in groups}
        order: list[Request] = []
        while groups:  # equal counters: the tenant whose next request came first
            key = min(groups, key=lambda k: (k[0], provisional[k[1]], groups[k][0].arrival_time))
            request = groups[key].popleft()
            order.append(request)
            tenant = key[1]
            to_compute = request.num_tokens - request.num_computed_tokens
            provisional[tenant] += to_compute / self.shares.weight(tenant)
            if not groups[key]:
                del groups[key]
        self._queue = deque(order)


def seat_shares(running: list[Request], waiting: Iterable[Request], max_num_seqs: int,
                shares: TenantShares) -> dict[str, float]:  # fmt: skip
    """Each tenant with work's share of the seats, by weight."""
    tenants = {r.tenant for r in running} | {r.tenant for r in waiting}
    total = sum(shares.weight(t) for t in tenants)
    return {t: max_num_seqs * shares.weight(t) / total for t in tenants}


def share_victim(
    running: list[Request], waiting: Request, max_num_seqs: int,
    all_waiting: Iterable[Request], shares: TenantShares,
) -> int | None:  # fmt: skip
    """Where `waiting`'s tenant holds fewer seats than a whole seat of its share allows, the
    index of the newest running request of the tenant holding the most seats beyond its share
    (rounded up); None where no tenant holds more than its share, or the share is under a seat
    (three tenants over two seats: preempting would only pass seats around)."""
    seats = seat_shares(running, all_waiting, max_num_seqs, shares)
    held = Counter(r.tenant for r in running)
    if held[waiting.tenant] + 1 > math.floor(seats[waiting.tenant]):
        return None
    over = {t: n - math.ceil(seats[t]) for t, n in held.items() if n > math.ceil(seats[t])}
    if not over:
        return None
    tenant = max(over, key=lambda t: (over[t], shares.counter(t)))
    return max(j for j, r in enumerate(running) if r.tenant == tenant)


def fair_victim_index(running: list[Request], first: int, shares: TenantShares) -> int:
    """The newest running request (index >= `first`) of the most-served tenant."""
    return max(range(first, len(running)),
               key=lambda j: (shares.counter(running[j].tenant), j))  # fmt: skip
