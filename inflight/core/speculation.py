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
engine's step records); drafting `d` tokens for one request gains its acceptance rate `a` times
`d` tokens and costs `c * d` seconds of the whole batch, which makes `B` tokens every `T`
seconds: `c * d * B / T` tokens. So a request drafts while `a > c * B / T`. On a CPU decoding
one stream, `T` is mostly reading the weights and `c` is small: drafting pays at low acceptance.
In a full batch, `B` is large and `c` is most of `T / B`: it pays only where lookup is nearly
always right. A request without history counts as accepting half its drafts. A draft model's
own passes add to the step time the fit sees, roughly in proportion to the drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inflight.request import Request

NGRAM_MAX = 4  # longest suffix looked up
NGRAM_MIN = 2  # shortest: a single repeated token predicts little
PRIOR_DRAFTED, PRIOR_ACCEPTED = 4, 2  # a newcomer's acceptance rate: 1/2 until it has its own
DECAY = 0.95  # weight of older steps in the cost fit (~20 steps)
MODEL_DRAFT = -1  # a draft slot the runner's draft model fills in before the forward pass


@dataclass(slots=True)
class _RequestState:
    index: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> end, latest
    indexed_to: int = 0  # n-grams ending at positions <= this are in the index
    # the request's tokens, extended as it samples (not a fresh prompt + outputs list a step)
    tokens: list[int] = field(default_factory=list)
    drafted: int = PRIOR_DRAFTED
    accepted: int = PRIOR_ACCEPTED


class StepCostFit:
    """Exponentially weighted least squares of step time on query tokens, and the mean step
    time and batch size: what `Speculation` weighs drafts with."""

    def __init__(self) -> None:
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.mean_seconds = self.mean_seqs = 0.0

    def observe(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        if not num_seqs:
            return
        x, y = float(num_tokens), seconds
        self.n = DECAY * self.n + 1.0
        self.sx, self.sy = DECAY * self.sx + x, DECAY * self.sy + y
        self.sxx, self.sxy = DECAY * self.sxx + x * x, DECAY * self.sxy + x * y
        w = 1 - DECAY
        first = self.mean_seconds == 0.0
        self.mean_seconds = seconds if first else (1 - w) * self.mean_seconds + w * seconds
        self.mean_seqs = num_seqs if first else (1 - w) * self.mean_seqs + w * num_seqs

    @property
    def seconds_per_token(self) -> float | None:
        """The fitted slope, or None while the steps seen vary too little to fit one."""
        var = self.sxx / max(self.n, 1e-9) - (self.sx / max(self.n, 1e-9)) ** 2
        if self.n < 4 or var < 1.0:
            return None
        cov = self.sxy / self.n - (self.sx / self.n) * (self.sy / self.n)
        return max(0.0, cov / var)

    def break_even_rate(self) -> float:
        """The acceptance rate above which a draft token pays (0 until a slope is fitted)."""
        slope = self.seconds_per_token
        if slope is None or self.mean_seconds <= 0:
            return 0.0
        return slope * self.mean_seqs / self.mean_seconds


class Speculation:
    def __init__(self, num_speculative_tokens: int, by_model: bool = False) -> None:
        self.k = num_speculative_tokens
        self.by_model = by_model  # a draft model writes the drafts (`runner/drafter.py`)
        self.cost = StepCostFit()
        self._states: dict[str, _RequestState] = {}
        self.num_drafted = 0  # draft tokens scheduled
        self.num_accepted = 0  # of those, kept
        self.num_declined = 0  # proposals not drafted because drafting would not pay

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
        self.num_declined += 1
        return []

    def on_verified(self, request_id: str, drafted: int, accepted: int) -> None:
        state = self._states.get(request_id)
        if state is not None and drafted:
            state.drafted += drafted
            state.accepted += accepted
        self.num_drafted += drafted
        self.num_accepted += accepted

    def on_finished(self, request_id: str) -> None:
        self._states.pop(request_id, None)
