"""GrammarMasks: the model runner's side of structured outputs.

Each constrained request has a matcher (its position in its grammar). In a step, the masks of
the constrained rows that sample are filled on a worker thread while the forward pass runs (both
release the GIL), then applied to those rows' logits only: every other row is untouched, so an
unconstrained request samples exactly what it would alone. After sampling, each matcher accepts
its request's token. Accepting never raises: a matcher that refuses a token (it cannot happen
with the mask applied) fails its own request, not the step.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from inflight.core.outputs import ScheduledRequest

if TYPE_CHECKING:
    import xgrammar as xgr

# bit j of a byte -> that token is banned (True) or allowed
_BANNED_BITS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1) == 0


def ban_bias(bitmask: torch.Tensor, vocab_size: int, dtype: torch.dtype) -> torch.Tensor:
    """int32 [R, ceil(V / 32)] (bit j of word i allows token 32 i + j) -> [R, vocab_size] of 0
    (allowed) and -inf (banned), to add to logits.

    NOTE: one lookup per byte of the mask (a table of 256 x 8 biases) and one `index_add_`
    cost a tenth of unpacking bits to a boolean mask and `masked_fill` on a CPU, and a sixth of
    xgrammar's own CPU kernel (docs/structured_outputs.md).
    """
    table = torch.zeros(256, 8, dtype=dtype, device=bitmask.device)
    table.masked_fill_(_BANNED_BITS.to(bitmask.device), float("-inf"))
    as_bytes = bitmask.contiguous().view(torch.uint8).view(-1).int()  # little-endian words
    return table.index_select(0, as_bytes).view(bitmask.shape[0], -1)[:, :vocab_size]


class GrammarMasks:
    def __init__(self) -> None:
        self.matchers: dict[str, xgr.GrammarMatcher] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="inflight-grammar")

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.matchers.pop(request_id, None)

    def start_fill(self, rows: list[ScheduledRequest]) -> Future[torch.Tensor]:
        """Fills one mask row per request in `rows` (all constrained) on the worker thread.
        The mask is allocated here, on the engine's thread: a fill of 64 rows is large enough
        for PyTorch to run it as an OpenMP region, and one on the worker would start a second
        OpenMP thread pool, which slows every region of the engine's (see async_engine)."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(rows), rows[0].grammar.tokenizer_info.vocab_size)
        return self._pool.submit(self._fill, rows, bitmask)

    def _matcher(self, s: ScheduledRequest) -> xgr.GrammarMatcher:
        matcher = self.matchers.get(s.request_id)
        if matcher is None:
            import xgrammar as xgr

            # created at a request's first sample, dropped when it finishes: a request
            # preempted by recompute keeps its outputs, and so its matcher
            matcher = xgr.GrammarMatcher(s.grammar)
            self.matchers[s.request_id] = matcher
        return matcher

    def _fill(self, rows: list[ScheduledRequest], bitmask: torch.Tensor) -> torch.Tensor:
        for i, s in enumerate(rows):
            self._matcher(s).fill_next_token_bitmask(bitmask, i)
        return bitmask

    @staticmethod
    def apply(logits: torch.Tensor, row_indices: list[int], bitmask: torch.Tensor) -> list[int]:
        """Bans the tokens the grammars disallow (-inf) in the rows `row_indices`, in place.
        Returns the rows whose grammar allows no token at all (left as they are: their requests
        must fail, since nothing can be sampled)."""
        bias = ban_bias(bitmask.to(logits.device), logits.shape[-1], logits.dtype)
        dead = bias.amax(dim=-1) == float("-inf")
        if bool(dead.any()):
            bias[dead] = 0.0
        logits.index_add_(0, torch.tensor(row_indices, device=logits.device), bias)
        return [row for row, d in zip(row_indices, dead.tolist(), strict=True) if d]

    def accept(self, request_id: str, token_id: int) -> tuple[bool, str | None]:
        """Advances a request's matcher: (grammar complete, error). An error fails that request."""
        matcher = self.matchers.get(request_id)
        if matcher is None:
            return False, None
        try:
            if not matcher.accept_token(token_id):
                return False, f"the grammar does not allow token {token_id} here"
            return matcher.is_terminated(), None
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
