"""The collectives of a tensor-parallel group: gloo over a TCP store (CPU ranks), and all-reduces
through shared memory where the ranks share a machine (`shm.py`).

A group of its own, not torch.distributed's default one, so that engines can come and go in one
process (tests, `LLM` objects) without a global process group. A collective that fails (a rank
died, or never answered within `timeout_s`) raises ModelFailedError: the model cannot run.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from inflight.errors import ModelFailedError
from inflight.parallel.shm import ShmAllReduce

DEFAULT_TIMEOUT_S = 300.0  # a collective's wait: a step's slowest rank, with room to spare


class TPGroup:
    def __init__(
        self, rank: int, size: int, host: str, port: int, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Rank 0 serves the store at `port` (0: any free port; `port` then says which)."""
        self.rank, self.size = rank, size
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, size, rank == 0, timeout=timeout,
                                   wait_for_workers=False)  # fmt: skip
        self.port = self.store.port
        self.host = host
        self._timeout = timeout
        self._pg: dist.ProcessGroupGloo | None = None
        self._shm: ShmAllReduce | None = None  # where the ranks share a machine
        # seconds this rank has spent in collectives: their transfers, and waiting for the
        # slowest rank (`bench offline` reports it per step)
        self.collective_seconds = 0.0
        # asked before a failed collective is reported: which rank is gone, where rank 0 knows
        self.explain_failure: Callable[[], str | None] = lambda: None

    def connect(self) -> None:
        """Joins the other ranks (blocks until all of them have)."""
        self._pg = dist.ProcessGroupGloo(self.store, self.rank, self.size, self._timeout)

    @property
    def pg(self) -> dist.ProcessGroupGloo:
        if self._pg is None:
            raise RuntimeError("the tensor-parallel group is not connected")
        return self._pg

    def use_shared_memory(self, path: Path) -> None:
        """All-reduces of up to `shm.SLOT_BYTES` go through `path` from now on (every rank
        must call this before the first all-reduce)."""
        self._shm = ShmAllReduce(path, self.rank, self.size, self._timeout.total_seconds())

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x`, in place."""
        shm = self._shm
        if shm is not None and shm.fits(x):
            self._run(lambda: shm.all_reduce(x, self.explain_failure))
        else:
            self._run(lambda: self.pg.allreduce([x]).wait())
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every rank's `x` [S, n] side by side on rank 0 ([S, size * n]); None elsewhere."""
        x = x.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.rank != 0:
            self._run(lambda: self.pg.gather([], [x], opts).wait())
            return None
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self._run(lambda: self.pg.gather([parts], [x], opts).wait())
        return torch.cat(parts, dim=-1)

    def _run(self, collective: Callable[[], object]) -> None:
        """Runs a collective to its end, timed; a failure (a rank gone, or the wait past the
        timeout) is ModelFailedError, naming a dead rank where one is known."""
        begin = time.perf_counter()
        try:
            collective()
        except RuntimeError as e:
            why = self.explain_failure() or f"{type(e).__name__}: {e}"
            raise ModelFailedError(f"tensor-parallel rank {self.rank}: a collective failed "
                                   f"({why})") from e  # fmt: skip
        self.collective_seconds += time.perf_counter() - begin
