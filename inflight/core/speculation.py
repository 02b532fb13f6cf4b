"""Speculative decoding, the core's side: n-gram prompt lookup proposes draft tokens (or a
draft model will, in the runner), and an online cost model decides, request by request and step
by step, whether drafting pays.

Drafts come from the request's own tokens: the longest suffix of `NGRAM_MAX`..`NGRAM_MIN`
tokens that occurred before, and the tokens that followed its latest earlier occurrence. With a
`speculative_model`, the scheduler only makes room (`MODEL_DRAFT` placeholders, their KV slots
allocated) and the runner's drafter writes the tokens just before the forward pass.

Drafts are verified in the same forward pass as everyone else's tokens (more query tokens of
the request in the flat batch): the runner keeps the longest prefix the target model agrees
with (greedy: the same tokens; sampled: rejection sampling, which keeps the target
distribution) and adds one token of its own; the scheduler gives the rejected drafts' KV slots
back.

Whether drafting pays. A step's time grows by `c` seconds per query token (fitted online to the
engine's step records), plus, with a draft model, its passes' time per draft `c'`; drafting `d`
tokens for one request gains its acceptance rate `a` times `d` tokens and costs `(c + c') * d`
seconds of the whole batch, which without drafts makes `B` tokens every `T0` seconds (the mean
step time less what its `D` drafts cost): `(c + c') * d * B / T0` tokens. So a request drafts
while `a > (c + c') * B / T0`. On a CPU decoding one stream, `T0` is mostly reading the weights
and `c` is small: drafting pays at low acceptance. In a full batch, `B` is large and `c` is most
of `T0 / B`: it pays only where lookup is nearly always right. A draft model as costly as the
target never pays (`c'` alone is about `T0 / B`). A request without history counts as accepting
half its drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.core.step_cost import StepCostFit
from inflight.metrics.stats import SpeculationStats
from inflight.request import Request

NGRAM_MAX = 4  # longest suffix looked up
NGRAM_MIN = 2  # shortest: a single repeated token predicts little
PRIOR_DRAFTED, PRIOR_ACCEPTED = 4, 2  # a newcomer's acceptance rate: 1/2 until it has its own
MODEL_DRAFT = -1  # a draft slot the runner's draft model fills in before the forward pass


@dataclass(slots=True)
class _RequestState:
    index: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> end, latest
    indexed_to: int = 0  # n-grams ending at positions <= this are in the index
    # the request's tokens, extended as it samples (not a fresh prompt + outputs list a step)
    tokens: list[int] = field(default_factory=list)
    drafted: int = PRIOR_DRAFTED
    accepted: int = PRIOR_ACCEPTED


class Speculation:
    def __init__(
        self, num_speculative_tokens: int, by_model: bool = False,
        cost: StepCostFit | None = None,
    ) -> None:  # fmt: skip
        self.k = num_speculative_tokens
        self.by_model = by_model  # a draft model writes the drafts (`runner/drafter.py`)
        self.cost = cost if cost is not None else StepCostFit()  # the scheduler's, shared
        self._states: dict[str, _RequestState] = {}
        self.stats = SpeculationStats()

    @staticmethod
    def applies_to(request: Request) -> bool:
        """Drafts are verified by plain sampling: no grammar, logprobs, penalties, bias, and
        past `min_tokens` (whose masking depends on the position)."""
        p = request.sampling_params
        return (
            request.grammar is None
            and p.logprobs is None
            and not p.uses_penalties
            and not p.logit_bias
            and request.num_output_tokens >= p.min_tokens
        )

    def propose(self, request: Request, limit: int) -> list[int]:
        """Up to `min(k, limit)` draft tokens for a decoding request (possibly none)."""
        limit = min(self.k, limit)
        if limit <= 0 or not self.applies_to(request):
            return []
        state = self._states.get(request.request_id)
        if state is None:
            tokens = [] if self.by_model else list(request.prompt_token_ids)
            state = self._states[request.request_id] = _RequestState(tokens=tokens)
        if self.by_model:  # slots for the drafts; the runner's drafter writes them
            return self._if_it_pays(state, [MODEL_DRAFT] * limit)
        tokens = state.tokens
        tokens += request.output_token_ids[len(tokens) - request.num_prompt_tokens :]
        end = len(tokens)
        for stop in range(state.indexed_to + 1, end):  # every n-gram but the current suffix
            for n in range(NGRAM_MIN, min(NGRAM_MAX, stop) + 1):
                state.index[tuple(tokens[stop - n : stop])] = stop
        state.indexed_to = max(state.indexed_to, end - 1)
        for n in range(min(NGRAM_MAX, end), NGRAM_MIN - 1, -1):
            start = state.index.get(tuple(tokens[end - n :]))
            if start is not None:
                return self._if_it_pays(state, tokens[start : start + limit])
        return []

    def _if_it_pays(self, state: _RequestState, draft: list[int]) -> list[int]:
        if state.accepted / state.drafted > self.cost.break_even_rate():
            return draft
        self.stats.declined += 1
        return []

    def on_verified(self, request_id: str, drafted: int, accepted: int) -> None:
        state = self._states.get(request_id)
        if state is not None and drafted:
            state.drafted += drafted
            state.accepted += accepted
        self.stats.drafted += drafted
        self.stats.accepted += accepted

    def on_finished(self, request_id: str) -> None:
        self._states.pop(request_id, None)
