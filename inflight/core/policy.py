"""Waiting-queue orders (fcfs, priority, sjf, edf) and the static-batching admission gate.

- fcfs: a deque; new requests join the tail, preempted ones return to the head.
- priority: lower `priority` first (arrival breaks ties), as vLLM.
- sjf: fewest remaining output tokens (`max_tokens` minus those generated) first.
- edf: earliest deadline (arrival + TTFT target) first; requests without a target after those
  with one, in arrival order. A deadline needs no aging: waiting brings it nearer.
(`fair` is `fair_share.py`'s.)

Aging (priority and sjf), so nothing starves: a request's rank improves by one unit for every
`aging_s` seconds it has waited. For priority the unit is one priority level; for sjf it is a
factor of two in remaining length (rank = log2(remaining tokens)). A request that is worse by
`d` units thus overtakes fresh arrivals after `d * aging_s` seconds of waiting.
Ranked queues are re-sorted once per step (`prepare`), as ranks move with time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from inflight.request import Request


class RequestQueue(Protocol):
    """What the scheduler needs of its waiting queue; each policy is one implementation."""

    def prepare(self, now: float) -> None:
        """Orders the queue for a step that starts at `now`."""

    def add(self, request: Request) -> None: ...

    def add_front(self, request: Request) -> None:
        """Re-queues a preempted request ahead of everyone."""

    def peek(self) -> Request: ...

    def remove(self, request: Request) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class FCFSQueue:
    """Arrival order: a deque; new requests join the tail, preempted ones return to the head."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def prepare(self, now: float) -> None:
        """Arrival order needs no re-sorting."""

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_front(self, request: Request) -> None:
        """Re-queues a preempted request ahead of everyone."""
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


def remaining_output_tokens(request: Request) -> int:
    return max(1, request.sampling_params.max_tokens - request.num_output_tokens)


def base_rank(policy: str, request: Request) -> float:
    if policy == "priority":
        return float(request.priority)
    return math.log2(remaining_output_tokens(request))


class RankedQueue(FCFSQueue):
    """priority / sjf order with aging; sorted by `prepare` at the top of every step."""

    def __init__(self, policy: str, aging_s: float) -> None:
        super().__init__()
        self.policy = policy
        self.aging_s = aging_s

    def rank(self, request: Request, now: float) -> tuple[float, float]:
        waited = max(0.0, now - request.arrival_time)
        return base_rank(self.policy, request) - waited / self.aging_s, request.arrival_time

    def prepare(self, now: float) -> None:
        self._queue = deque(sorted(self._queue, key=lambda r: self.rank(r, now)))


def deadline(request: Request) -> float:
    """When a request must have its first token (inf: no TTFT target)."""
    ttft = request.slo.ttft_s
    return math.inf if ttft is None else request.arrival_time + ttft


class DeadlineQueue(FCFSQueue):
    """edf order, sorted by `prepare` at the top of every step."""

    def prepare(self, now: float) -> None:
        self._queue = deque(sorted(self._queue, key=lambda r: (deadline(r), r.arrival_time)))


def make_queue(policy: str, aging_s: float) -> RequestQueue:
    if policy == "fcfs":
        return FCFSQueue()
    return DeadlineQueue() if policy == "edf" else RankedQueue(policy, aging_s)


def victim_index(running: list[Request], first: int, policy: str) -> int:
    """Which running request to preempt, among those not yet scheduled this step (index >=
    `first`): the newest, or under `priority` the least important (newest among equals)."""
    if policy != "priority":
        return len(running) - 1
    return max(range(first, len(running)), key=lambda j: (running[j].priority, j))


class StaticBatchGate:
    """Static batching as a scheduler mode: a batch forms only when the previous one is done.

    When no batch is in flight, the first `max_num_seqs` waiting requests become its members;
    only members are admitted (their prefills may still spread over several steps when the
    token budget or the blocks are short), and the next batch forms when the last member ends.
    """

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.members: set[str] = set()

    def admits(self, request: Request, waiting: RequestQueue) -> bool:
        if not self.members:
            for i, r in enumerate(waiting):
                if i == self.max_num_seqs:
                    break
                self.members.add(r.request_id)
        return request.request_id in self.members

    def on_finished(self, request_id: str) -> None:
        self.members.discard(request_id)
