"""KVForecast: what the block pool will look like over the next steps, for admission.

Two questions the scheduler asks beyond "is a block free now":
- Under `kv_admission="reserve"`, every running request is owed the blocks of its longest
  length (prompt + max_tokens, capped by `max_model_len`, less the last token, which is sampled
  but never computed); a newcomer is admitted only into blocks nobody is owed, so no running
  request ever runs out of blocks.
- Predictive admission counts blocks that running requests certain to end within `horizon`
  steps hand back. Certain: decoding, at most `horizon` tokens from max_tokens or
  max_model_len, and not itself admitted on a prediction (only ordinary requests are sure to be
  scheduled every step, one token a step).

Pure arithmetic over the KV manager's block tables: nothing here changes state. Only the
admission module (`admission.py`) asks it. Counts are of the pool's pages (`kv.pages_for`:
blocks, for a model of one KV group).
"""

from __future__ import annotations

from itertools import accumulate

from inflight.core.kv_cache_manager import KVCacheManager
from inflight.core.sizing import peak_pages
from inflight.request import Request


class KVForecast:
    def __init__(self, kv: KVCacheManager, max_model_len: int, chunk: int = 1) -> None:
        self.kv = kv
        self.max_model_len = max_model_len
        self.chunk = chunk  # the most tokens a step computes for a request
        # ids of requests admitted on a prediction: not sure to be scheduled every step
        self.probation: set[str] = set()

    # ---------------------------------------------------------- one request
    def tokens_left(self, r: Request) -> int:
        return r.tokens_left(self.max_model_len)

    def final_blocks(self, r: Request) -> int:
        """Blocks the request holds at its longest: KV for every token but the last sampled
        (the most pages it ever holds, where a window's pages overlap a prompt chunk)."""
        final_len = min(r.num_prompt_tokens + r.sampling_params.max_tokens, self.max_model_len)
        return peak_pages(final_len - 1, self.kv.block_size, self.kv.group_windows, self.chunk)

    def owed_blocks(self, r: Request) -> int:
        """Blocks the request has yet to take to reach its longest length."""
        return max(0, self.final_blocks(r) - self.kv.num_held_for_reservation(r.request_id))

    def ends_within(self, r: Request, horizon: int) -> bool:
        return (
            r.is_decoding and r.request_id not in self.probation and self.tokens_left(r) <= horizon
        )

    def _unshared_blocks(self, r: Request) -> int:
        """Blocks the request alone holds: freed when it ends."""
        blocks = self.kv.pool.blocks
        return sum(1 for b in self.kv.held_pages(r.request_id) if blocks[b].ref_count == 1)

    # ------------------------------------------------------------ the batch
    def unreserved_blocks(self, running: list[Request]) -> int:
        """Free blocks no running request is owed (negative while requests admitted on a
        prediction borrow some)."""
        return self.kv.pool.num_free_blocks - sum(self.owed_blocks(r) for r in running)

    def returned_reservation(self, running: list[Request], horizon: int) -> int:
        """Under `reserve`: what requests certain to end within `horizon` steps give back,
        their unshared blocks and the blocks they are still owed."""
        return sum(
            self._unshared_blocks(r) + self.owed_blocks(r)
            for r in running
            if self.ends_within(r, horizon)
        )

    def net_freed_blocks(self, running: list[Request], horizon: int) -> int:
        """On demand: blocks requests certain to end within `horizon` steps free, minus the
        blocks every decoding request takes meanwhile."""
        total = 0
        for r in running:
            if not r.is_decoding:
                continue  # mid-prefill: its growth is its prompt, its end is not near
            steps = min(self.tokens_left(r), horizon)
            total -= max(0, self.kv.pages_for(r.num_tokens + steps)
                         - self.kv.num_held(r.request_id))  # fmt: skip
            if self.ends_within(r, horizon):
                total += self._unshared_blocks(r)
        return total

    def free_blocks_ahead(self, running: list[Request], horizon: int) -> list[int]:
        """Free blocks once each of the next `horizon` steps (1 = this one) is scheduled, if
        every ordinary running request computes a token a step (a prefill: all its known
        tokens now) and those that end within the horizon free their unshared blocks the step
        after their last token. Requests admitted on a prediction are left out. Exact when no
        block is shared; a block shared now counts as held to the end, though its other
        holders may end first, so with sharing this is a lower bound."""
        gained = [0] * (horizon + 2)  # gained[t]: free blocks gained at step t
        for r in running:
            if r.request_id in self.probation:
                continue
            held = self.kv.num_held(r.request_id)
            ends = self.ends_within(r, horizon)
            last_step = self.tokens_left(r) if ends else horizon
            taken, final = 0, self.final_blocks(r)
            # At step t the request holds pages_for(num_tokens + t - 1) pages, at most its final
            # count (`cdiv(num_tokens + t - 1, block_size)` blocks with one KV group: a block is
            # taken at the first step whose tokens cross into it; a windowed group gives one
            # back as often as it takes one).
            for step in range(1, last_step + 1):
                now = min(self.kv.pages_for(r.num_tokens + step - 1), final)
                if not self.kv.windowed:  # (held past it: drafts' blocks, kept if accepted)
                    now = max(now, held + taken)
                if now == held + taken and now >= final:
                    break
                gained[step] -= now - (held + taken)
                taken = now - held
            if ends:
                gained[last_step + 1] += taken + self._unshared_blocks(r)
        free = self.kv.pool.num_free_blocks
        return [free + g for g in accumulate(gained[1 : horizon + 1])]

    def lowest_free_blocks(self, running: list[Request], horizon: int) -> int:
        """The fewest free blocks over the next `horizon` steps: what a request admitted on a
        prediction may take without ever taking a block an ordinary request will need."""
        return min(self.free_blocks_ahead(running, horizon))
