"""Short-convolution state carried from step to step (LFM2's convolution layers, Qwen3.5's
DeltaNet layers): each running request's last `kernel - 1` inputs to every convolution layer,
and, where the layers are DeltaNet's, its state matrices after its last token (float32, as
transformers keeps them), in a slot of its own.

A convolution layer mixes each token's input with the `kernel - 1` inputs before it. Within a
step those are the step's own rows (the rest of a prompt chunk); for the first rows of a chunk
they are the last rows of the request's previous step, which this state holds. A request takes
a slot when it first runs and gives it back when it finishes or is preempted (recomputed, it
starts again from its first token, with zeros before it). At most `max_num_seqs` requests run
at once, so that many slots never run out. The core knows nothing of slots: like the drafter's
per-request state, they follow the scheduler's finished and preempted ids.

Each slot is one row, which a step reads and writes in place (the kernels read a request's row
before they write it): its position counts only once the forward pass returns
(`ConvStep.commit`). A forward pass that fails midway may have advanced some layers' rows and
not others; before the batch runs again (its halves, `ModelRunner._run_isolating`) the runner
rebuilds each of its requests' rows from the request's tokens (`ModelRunner._rebuild_states`),
which gives the values they held (a token's computation never depends on its batch), so a
request's tokens never depend on another's failure.

Split over tensor-parallel ranks, each rank holds its share of the channels (a DeltaNet layer's:
its key heads' and their value heads', and those heads' matrices), in the slots and rows rank 0
chose (`ConvStep.rows`, sent with the step).

Prefix-cache hits resume from a saved state: a row per snapshot beside the slots, which the
core fills and reads by block hash (`core/state_snapshots.py`; the other ranks copy their share
of the same rows, `mirror_step_copies`). A request whose KV is swapped out keeps its state in
host memory until it resumes (`swap_out`: every rank stashes its share of the same row, and
restores it into the row its request resumes in).

A speculating request's step runs its last token and its drafts, and keeps only the drafts the
target agrees with: its state must be the one after the last kept. The step writes the state
after each token but the last into draft rows of its slot's own (`ConvStep.snapshot_rows`; the
last token's goes to the slot as any step's), and once verified the runner keeps the right one
(`keep_drafts`: the draft row copied into the slot, every rank alike).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from inflight.core.outputs import ScheduledRequest
from inflight.model.arch import LlamaArchConfig


@dataclass
class ConvStep:
    """One step's reads and writes of the state, shared by every convolution layer. A layer
    concatenates its step rows [T, H] and the state rows it reads [R * (kernel - 1), H] into
    one table; `taps` and `keep` index that table."""

    states: list[torch.Tensor]  # each convolution layer's (`ConvState.layers`)
    taps: torch.Tensor  # [kernel, T]: each token's inputs, the oldest first
    keep: torch.Tensor  # [R * (kernel - 1)]: each request's state after the step, in order
    read_rows: torch.Tensor  # [R]: the state row each request reads
    write_rows: torch.Tensor  # [R]: the state row each request writes
    # [T]: the row a token's state is written to as well (-1: none), or empty where no request
    # speculates: a speculating request's tokens but its last (`ConvState.keep_drafts`)
    snapshot_rows: torch.Tensor
    # read_rows, write_rows and snapshot_rows, as rank 0 hands them to the other ranks
    rows: tuple[list[int], list[int], list[int]]
    starts: list[int]  # each request's first row of the step, then their number (T)
    # each DeltaNet layer's state matrices [rows, value heads, key dim, value dim] (their rows
    # are the convolution's: `read_rows`, `write_rows`); none for LFM2
    recurrent: list[torch.Tensor] = field(default_factory=list)
    # (slot, position its row holds the state before) to mark once run
    _written: list[tuple[int, int]] = field(default_factory=list)
    _valid: list[int] | None = None

    def commit(self) -> None:
        """Marks the written rows as the requests' state (the forward pass returned)."""
        if self._valid is None:
            return
        for slot, position in self._written:
            self._valid[slot] = position


def sequence_state_bytes(arch: LlamaArchConfig, dtype: torch.dtype) -> int:
    """`arch.sequence_state_bytes` with its inputs in `dtype`."""
    return arch.sequence_state_bytes(torch.empty((), dtype=dtype).element_size())


def conv_state_bytes(
    arch: LlamaArchConfig, num_slots: int, dtype: torch.dtype, num_snapshots: int = 0,
    num_drafts: int = 0,
) -> int:  # fmt: skip
    """What `ConvState` holds for a model of `arch` (a rank's share of the channels) with
    `num_slots` slots: a row a slot, a zero row, a scratch row, a row a snapshot and, where
    requests speculate `num_drafts` tokens, that many rows a slot."""
    rows = num_slots * (1 + num_drafts) + 2 + num_snapshots
    return rows * sequence_state_bytes(arch, dtype)


class ConvState:
    """Every convolution layer's state tensor [rows, kernel - 1, channels] (and a DeltaNet
    layer's matrices [rows, *recurrent]): row s is slot s's; row `slots` is zeros (read before
    a request's first token, never written); the next is scratch (written by warm-up steps,
    never read); then the prefix cache's saved states (`core/state_snapshots.py`: row
    `slots + 2 + r` is snapshot r); then each slot's `num_drafts` draft rows (the states after
    a speculating request's tokens but its last)."""

    def __init__(self, num_layers: int, num_slots: int, kernel: int, channels: int,
                 dtype: torch.dtype, device: torch.device,
                 recurrent: tuple[int, int, int] | None = None,
                 num_snapshots: int = 0, num_drafts: int = 0) -> None:  # fmt: skip
        self.kernel, self.num_slots, self.device = kernel, num_slots, device
        self.num_snapshots, self.num_drafts = num_snapshots, num_drafts
        self._first_draft_row = num_slots + 2 + num_snapshots
        rows = self._first_draft_row + num_slots * num_drafts
        shape = (rows, kernel - 1, channels)
        self.layers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.recurrent = [] if recurrent is None else [
            torch.zeros((rows, *recurrent), dtype=torch.float32, device=device)
            for _ in range(num_layers)
        ]  # fmt: skip
        self.num_bytes = sum(t.numel() * t.element_size() for t in self.layers + self.recurrent)
        self._zero_row, self._scratch_row = num_slots, num_slots + 1
        self._free = list(range(num_slots - 1, -1, -1))
        self._slot_of: dict[str, int] = {}
        # per slot, the position before which its row holds the state (-1: none)
        self._valid = [-1] * num_slots
        # swapped-out requests: their rows' copies in host memory, and the position they hold
        self._stashed: dict[str, tuple[list[torch.Tensor], int]] = {}
        # draft rows copied into slots since the other ranks last heard (`take_kept_drafts`)
        self._kept_drafts: list[tuple[int, int]] = []

    @classmethod
    def for_model(cls, arch: LlamaArchConfig, num_slots: int, dtype: torch.dtype,
                  device: torch.device, num_snapshots: int = 0,
                  num_drafts: int = 0) -> ConvState:  # fmt: skip
        """The state of a model of `arch`: a rank's share of the channels where it is split."""
        return cls(len(arch.conv_layers), num_slots, arch.conv_kernel, arch.conv_width, dtype,
                   device, arch.recurrent_shape, num_snapshots, num_drafts)  # fmt: skip

    def _copy_row(self, source: int, target: int) -> None:
        for t in self.layers + self.recurrent:
            t[target].copy_(t[source])

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_stashed(self) -> int:
        """Swapped-out requests whose state waits in host memory."""
        return len(self._stashed)

    def release(self, request_ids: Iterable[str]) -> list[str]:
        """Gives back the slots of requests that finished or were preempted, and drops the
        stashed states of those that finished while swapped out; returns the latter (for the
        other tensor-parallel ranks, `mirror`)."""
        dropped = []
        for request_id in request_ids:
            slot = self._slot_of.pop(request_id, None)
            if slot is not None:
                self._valid[slot] = -1
                self._free.append(slot)
            elif self._stashed.pop(request_id, None) is not None:
                dropped.append(request_id)
        return dropped

    def swap_out(self, request_ids: Iterable[str]) -> list[tuple[str, int]]:
        """Stashes the rows of requests whose KV went to swap space in host memory (their
        slots are then released as any preempted request's); returns (request, row) for the
        other ranks' shares (`mirror`)."""
        moved = []
        for request_id in request_ids:
            slot = self._slot_of[request_id]
            self._stash(request_id, slot, self._valid[slot])
            moved.append((request_id, slot))
        return moved

    def keep_drafts(self, s: ScheduledRequest, num_kept: int) -> None:
        """A verified speculating request's state: the one after its last kept draft (the
        step wrote it to a draft row of its slot, where it kept fewer than all)."""
        slot = self._slot_of[s.request_id]
        rejected = len(s.draft_token_ids) - num_kept
        if rejected:
            kept = self._draft_row(slot, num_kept)
            self._copy_row(kept, slot)
            self._kept_drafts.append((kept, slot))
            self._valid[slot] -= rejected

    def take_kept_drafts(self) -> list[tuple[int, int]]:
        """The (draft row, slot) copies `keep_drafts` made since the last call, for the other
        tensor-parallel ranks (`mirror`), which make them before their next step."""
        copies, self._kept_drafts = self._kept_drafts, []
        return copies

    def _draft_row(self, slot: int, token: int) -> int:
        """The row of slot `slot` that holds the state after a speculating request's `token`th
        token of its step."""
        return self._first_draft_row + slot * self.num_drafts + token

    def mirror(self, moved: list[tuple[str, int]], dropped: list[str],
               kept_drafts: list[tuple[int, int]]) -> None:  # fmt: skip
        """Another tensor-parallel rank's share of rank 0's `keep_drafts` (first: a state
        stashed next is the kept one), `swap_out` and `release`."""
        for source, target in kept_drafts:
            self._copy_row(source, target)
        for request_id, row in moved:
            self._stash(request_id, row, -1)
        for request_id in dropped:
            del self._stashed[request_id]

    def _stash(self, request_id: str, row: int, position: int) -> None:
        host = torch.device("cpu")
        rows = [t[row].to(host, copy=True) for t in self.layers + self.recurrent]
        self._stashed[request_id] = rows, position

    def _unstash(self, request_id: str, row: int) -> int:
        """Row `row` restored from the request's stashed state; returns its position."""
        rows, position = self._stashed.pop(request_id)
        for t, saved in zip(self.layers + self.recurrent, rows, strict=True):
            t[row].copy_(saved)
        return position

    def step(self, scheduled: list[ScheduledRequest], query_start_loc: list[int],
             scratch: bool = False) -> ConvStep:  # fmt: skip
        """The step's `ConvStep`; `scratch`: a warm-up's, which reads zeros, writes the scratch
        row and takes no slot. Raises RuntimeError where a request would resume without its
        state (a bug: the engine refuses what leads there)."""
        read, write, written = [], [], []
        snapshots: list[int] = []
        for s, first in zip(scheduled, query_start_loc, strict=False):
            if scratch:
                read.append(self._zero_row)
                write.append(self._scratch_row)
                continue
            slot = self._slot_of.get(s.request_id)
            if slot is None:
                swapped = s.request_id in self._stashed
                if s.start_pos != 0 and s.state_restore is None and not swapped:
                    raise RuntimeError(f"request {s.request_id} resumes at position "
                                       f"{s.start_pos} without its convolution state")  # fmt: skip
                if not self._free:
                    raise RuntimeError(f"more running requests than the {self.num_slots} "
                                       "convolution state slots")  # fmt: skip
                slot = self._slot_of[s.request_id] = self._free.pop()
                if swapped:  # (back from swap space: the state it left with)
                    self._valid[slot] = self._unstash(s.request_id, slot)
                elif s.state_restore is not None:  # (a prefix hit: the state after its blocks)
                    self._valid[slot] = s.start_pos
                    self._copy_saved_state(s, slot, restore=True)
            if s.start_pos != 0 and self._valid[slot] != s.start_pos:
                raise RuntimeError(f"request {s.request_id}'s convolution state is not the one "
                                   f"before position {s.start_pos}")  # fmt: skip
            self._copy_saved_state(s, slot, restore=False)  # (the saved state it takes, if any)
            # zeros before the first token; the state so far after it
            read.append(self._zero_row if s.start_pos == 0 else slot)
            write.append(slot)
            written.append((slot, s.start_pos + s.num_tokens))
            drafts = len(s.draft_token_ids)
            if drafts:  # the states after its tokens but the last, for `keep_drafts`
                if drafts > self.num_drafts:
                    raise RuntimeError(f"request {s.request_id} has {drafts} drafts, more than "
                                       f"the {self.num_drafts} draft rows")  # fmt: skip
                snapshots += [-1] * (first - len(snapshots))
                snapshots += [self._draft_row(slot, i) for i in range(drafts)]
        if snapshots:
            snapshots += [-1] * (query_start_loc[-1] - len(snapshots))
        if scratch:
            return self.at_rows((read, write, snapshots), query_start_loc)
        return self.at_rows((read, write, snapshots), query_start_loc, written, self._valid)

    def mirror_step_copies(self, scheduled: list[ScheduledRequest], write_rows: list[int]) -> None:
        """Another tensor-parallel rank's share of the copies rank 0's `step` made: each
        request's row (rank 0's slot, its write row) restored from its stash (back from swap
        space), restored from the saved state its prefix hit resumes from, or saved."""
        for s, row in zip(scheduled, write_rows, strict=True):
            if s.request_id in self._stashed:
                self._unstash(s.request_id, row)
            self._copy_saved_state(s, row, restore=True)
            self._copy_saved_state(s, row, restore=False)

    def _copy_saved_state(self, s: ScheduledRequest, row: int, restore: bool) -> None:
        """Row `row` restored from the saved state a prefix hit resumes from (`restore`), or
        saved as the state after a full block (the prefix cache's), where `s` names one."""
        snapshot = s.state_restore if restore else s.state_save
        if snapshot is not None:
            saved = self._snapshot_row(snapshot)
            self._copy_row(*((saved, row) if restore else (row, saved)))

    def _snapshot_row(self, snapshot: int) -> int:
        if not 0 <= snapshot < self.num_snapshots:
            raise RuntimeError(f"snapshot {snapshot} of {self.num_snapshots}")
        return self.num_slots + 2 + snapshot

    def at_rows(self, rows: tuple[list[int], list[int], list[int]], query_start_loc: list[int],
                written: list[tuple[int, int]] | None = None,
                valid: list[int] | None = None) -> ConvStep:  # fmt: skip
        """A step over the rows rank 0 chose (`ConvStep.rows`): another tensor-parallel rank's,
        whose slots mirror rank 0's (the same rows of its share of the channels); rank 0's own,
        with the rows it marks valid once run (`written`, in `valid`)."""
        taps, keep = self._indices(query_start_loc)
        read, write, snapshots = rows
        return ConvStep(states=self.layers, taps=taps.to(self.device), keep=keep.to(self.device),
                        read_rows=torch.tensor(read, device=self.device),
                        write_rows=torch.tensor(write, device=self.device),
                        snapshot_rows=torch.tensor(snapshots, dtype=torch.long,
                                                   device=self.device), rows=rows,
                        starts=list(query_start_loc), recurrent=self.recurrent,
                        _written=written or [], _valid=valid)  # fmt: skip

    def _indices(self, query_start_loc: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`taps` and `keep` for requests whose rows start at `query_start_loc`: a position
        before a request's chunk is its state row (kernel - 1 of them, the oldest first, after
        the T step rows), any other its step row. (Built as lists: a decode step's few indices
        cost a dozen tensor ops' dispatch otherwise.)"""
        back, num_tokens = self.kernel - 1, query_start_loc[-1]
        taps = [[0] * num_tokens for _ in range(self.kernel)]
        keep: list[int] = []
        for r, (start, end) in enumerate(itertools.pairwise(query_start_loc)):
            state = num_tokens + r * back  # this request's earlier inputs in the table
            inputs = [*range(state, state + back), *range(start, end)]  # oldest first
            for k, row in enumerate(taps):
                row[start:end] = inputs[k : k + end - start]
            keep += inputs[-back:]
        return torch.tensor(taps), torch.tensor(keep)
