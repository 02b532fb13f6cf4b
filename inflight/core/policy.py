"""Queue orders for waiting requests, and the static-batching admission gate.

FCFS is the only order for now: a deque where new requests join the tail and preempted ones
return to the head, so a preempted request is the first to be re-admitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from inflight.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_front(self, request: Request) -> None:
        """Re-queues a preempted request ahead of everyone."""
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class StaticBatchGate:
    """Static batching as a scheduler mode: a batch forms only when the previous one is done.

    When no batch is in flight, the first `max_num_seqs` waiting requests become its members;
    only members are admitted (their prefills may still spread over several steps when the
    token budget or the blocks are short), and the next batch forms when the last member ends.
    """

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.members: set[str] = set()

    def admits(self, request: Request, waiting: FCFSQueue) -> bool:
        if not self.members:
            for i, r in enumerate(waiting):
                if i == self.max_num_seqs:
                    break
                self.members.add(r.request_id)
        return request.request_id in self.members

    def on_finished(self, request_id: str) -> None:
        self.members.discard(request_id)
