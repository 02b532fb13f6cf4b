"""Which cached prefixes a state-carrying model can resume from: a sequence's state (LFM2's
convolution inputs, Qwen3.5's DeltaNet matrices too) saved after a full block's last token, by
that block's chained hash, in one of `capacity` snapshot rows of the runner's state
(`runner/conv_state.py`), the least recently used given up first.

A cached KV block alone cannot resume such a model: its convolution and recurrent layers need
the state after the block, which no block holds. So a prefix hit of these models reaches only
as far as the last of its blocks with a snapshot (`KVCacheManager.get_computed_blocks`). A
snapshot is taken at the start of a step whose request has just computed a full block (its
state committed, `ConvState`'s row valid there): the scheduler ends a prompt's chunk at the
prompt's last full block for it, and where it leaves other prompts' cached blocks
(`KVCacheManager.state_boundaries`), and a decode reaches a block's end every `block_size`
tokens.
The core decides the rows; the runner copies (`ScheduledRequest.state_save`, `state_restore`).
"""

from __future__ import annotations

from collections import OrderedDict


class StateSnapshots:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._rows: OrderedDict[int, int] = OrderedDict()  # block hash -> row, oldest use first
        self._free = list(range(capacity - 1, -1, -1))
        self.num_saved = 0  # snapshots taken
        self.num_evicted = 0  # ... and given up for newer ones

    def __len__(self) -> int:
        return len(self._rows)

    def lookup(self, block_hash: int) -> int | None:
        """The row holding the state after the block of `block_hash`, now the most recently
        used; None if none does."""
        row = self._rows.get(block_hash)
        if row is not None:
            self._rows.move_to_end(block_hash)
        return row

    def save(self, block_hash: int) -> int | None:
        """A row for the state after the block of `block_hash` (a free one, or the least
        recently used one's), recorded now: the runner copies into it before the step's
        forward pass runs. None where it is saved already or there are no rows."""
        if block_hash in self._rows or not self.capacity:
            return None
        if self._free:
            row = self._free.pop()
        else:
            _, row = self._rows.popitem(last=False)
            self.num_evicted += 1
        self._rows[block_hash] = row
        self.num_saved += 1
        return row
