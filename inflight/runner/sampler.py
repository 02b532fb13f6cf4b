"""Batched sampling: one tensor pass over every request that samples this step.

Order of operations (as vLLM): logit bias, min_tokens masking and penalties shape the logits;
greedy rows take the argmax there; the rest are divided by their temperature, filtered by
min-p, top-k and top-p, and drawn by inverting the cumulative distribution with one uniform
number per row. A request with a `seed` draws the number of its k-th output token as a function
of (seed, k) alone (`seeded_uniform`), so its tokens depend neither on what else is in the batch,
nor on a retry, nor on whether speculation proposed them: with the same logits, the same tokens.
Logprobs are those of the raw model distribution (before any processing), for the sampled token
and the top-N.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inflight.core.outputs import Logprobs, ScheduledRequest


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the first maximum of each row, like `argmax(dim=-1)`.

    NOTE: `max(dim=-1)` returns the same index (both pick the first maximum) and is several
    times faster on the CPU for bfloat16.
    """
    return x.max(dim=-1).indices


def token_logprobs(logprobs: torch.Tensor, token_ids: list[int], num_top: int) -> list[Logprobs]:
    """Each row's entry for its token of `token_ids`, from log-probabilities [R, V] in float32:
    the token's value, its rank (1 = most likely) and the `num_top` most likely tokens."""
    ids = torch.tensor(token_ids, device=logprobs.device)[:, None]
    values = logprobs.gather(1, ids)  # [R, 1]
    ranks = ((logprobs > values).sum(dim=-1) + 1).tolist()
    tops: list[list[tuple[int, float]]] = [[] for _ in token_ids]
    if num_top > 0:
        top_values, top_ids = logprobs.topk(num_top, dim=-1)
        tops = [list(zip(i, v, strict=True))
                for i, v in zip(top_ids.tolist(), top_values.tolist(), strict=True)]  # fmt: skip
    return [
        Logprobs(token_id=t, logprob=v, rank=r, top=top)
        for t, v, r, top in zip(token_ids, values[:, 0].tolist(), ranks, tops, strict=True)
    ]


_MASK64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that scatters nearby inputs."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seeded_uniform(seed: int, index: int) -> float:
    """The number in [0, 1) that draws output token `index` of a request seeded `seed`: a pure
    function of the two (a counter-based generator), never of draws made before it."""
    stream = _mix64((seed + 0x9E3779B97F4A7C15) & _MASK64)
    return (_mix64((stream + index * 0x9E3779B97F4A7C15) & _MASK64) >> 11) / 2.0**53


def inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """For each row of non-negative `weights` [S, V] (any positive sum) and `uniform` [S, 1] in
    [0, 1): the first index whose cumulative weight exceeds uniform * sum. Index i is drawn with
    probability weights[i] / sum; a zero weight is never drawn (its cumulative sum equals the
    previous one, and a float sum of non-negative terms never decreases)."""
    cdf = weights.cumsum(dim=-1)
    total = cdf[:, -1:]
    # below the total even where uniform * total rounds up to it, so some index always exceeds
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


class Sampler:
    def __init__(
        self,
        device: torch.device,
        seed: int = 0,
        argmax: Callable[[torch.Tensor], torch.Tensor] = first_argmax,
    ) -> None:
        """`argmax` picks greedy tokens: `first_argmax`, or the C++ kernel with the same
        contract (`inflight.kernels`, an order of magnitude faster on a CPU) when the C++
        kernels are in use."""
        self.device = device
        self.argmax = argmax
        self.generator = torch.Generator(device=device)  # unseeded requests share it
        self.generator.manual_seed(seed)

    def sample(
        self, logits: torch.Tensor, requests: list[ScheduledRequest]
    ) -> tuple[list[int], list[Logprobs | None]]:
        """logits [S, V], one row per request in `requests` -> token ids, logprobs."""
        params = [r.sampling_params for r in requests]
        num_rows = logits.shape[0]
        if all(p.is_greedy and p.logprobs is None and not p.logit_bias and not p.uses_penalties
               and len(r.output_token_ids) >= p.min_tokens
               for r, p in zip(requests, params, strict=True)):  # fmt: skip
            # NOTE: in the model's dtype: converting to float32 first is exact, so it picks the
            # same token, and the copy of a large batch's logits would cost a step's sampling.
            return self.argmax(logits).tolist(), [None] * num_rows
        want_logprobs = [p.logprobs is not None for p in params]
        # A copy in float32: the edits below are in place, and logprobs want full precision.
        logits = logits.to(torch.float32, copy=True)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None

        for row, r in enumerate(requests):
            p = r.sampling_params
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias.keys()), device=self.device)
                bias = torch.tensor(list(p.logit_bias.values()), device=self.device)
                logits[row].index_add_(0, ids, bias)
            if len(r.output_token_ids) < p.min_tokens:
                banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(r.eos_token_ids))
                if banned:
                    logits[row, list(banned)] = float("-inf")
        if any(p.uses_penalties for p in params):
            logits = self._apply_penalties(logits, requests)

        greedy = torch.tensor([p.is_greedy for p in params], device=self.device)
        tokens = self.argmax(logits)
        if not bool(greedy.all()):
            sampled = self._sample_random(logits, requests)
            tokens = torch.where(greedy, tokens, sampled)

        token_list = tokens.tolist()
        logprobs: list[Logprobs | None] = [None] * num_rows
        if raw_logprobs is not None:
            for row, p in enumerate(params):
                if p.logprobs is not None:
                    scores = raw_logprobs[row : row + 1]
                    logprobs[row] = token_logprobs(scores, [token_list[row]], p.logprobs)[0]
        return token_list, logprobs

    def _apply_penalties(
        self, logits: torch.Tensor, requests: list[ScheduledRequest]
    ) -> torch.Tensor:
        num_rows, vocab = logits.shape
        counts = torch.zeros(num_rows, vocab, device=self.device)
        in_prompt = torch.zeros(num_rows, vocab, dtype=torch.bool, device=self.device)
        for row, r in enumerate(requests):
            if r.output_token_ids:
                out = torch.tensor(r.output_token_ids, device=self.device)
                counts[row].index_add_(0, out, torch.ones(len(out), device=self.device))
            if r.sampling_params.repetition_penalty != 1.0:
                in_prompt[row, torch.tensor(r.prompt_token_ids, device=self.device)] = True

        def column(attr: str) -> torch.Tensor:
            values = [getattr(r.sampling_params, attr) for r in requests]
            return torch.tensor(values, device=self.device, dtype=logits.dtype)[:, None]

        rep = column("repetition_penalty")
        seen = in_prompt | (counts > 0)
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
        logits = logits - column("frequency_penalty") * counts
        return logits - column("presence_penalty") * (counts > 0).to(logits.dtype)

    def _sample_random(
        self, logits: torch.Tensor, requests: list[ScheduledRequest]
    ) -> torch.Tensor:
        probs = self._probs(logits, [r.sampling_params for r in requests])
        # NOTE: one random number per row, not per vocabulary entry: an exponential race (argmax
        # of p / Exp(1) noise) drew 3M numbers for 64 rows of 49k, as long as the forward pass
        # on a CPU; the cumulative sum and search cost a fraction of that.
        uniform = torch.rand(len(requests), 1, generator=self.generator, device=self.device)
        for row, r in enumerate(requests):
            if r.sampling_params.seed is not None and not r.sampling_params.is_greedy:
                uniform[row] = self._uniforms(r, 1)
        return inverse_cdf(probs, uniform)

    def _uniforms(self, request: ScheduledRequest, n: int) -> torch.Tensor:
        """The numbers that draw the request's next `n` output tokens: its seed's (indexed by
        output position) if it has one, else the shared generator's."""
        seed = request.sampling_params.seed
        if seed is None:
            return torch.rand(n, generator=self.generator, device=self.device)
        first = len(request.output_token_ids)
        values = [seeded_uniform(seed, first + i) for i in range(n)]
        return torch.tensor(values, dtype=torch.float32, device=self.device)

    def _probs(self, logits: torch.Tensor, params: list) -> torch.Tensor:
        """The distribution each row samples from: temperature, then min-p, top-k, top-p."""
        temperature = torch.tensor(
            [1.0 if p.is_greedy else p.temperature for p in params], device=self.device
        )
        logits = logits / temperature[:, None]
        probs = torch.softmax(logits, dim=-1)

        min_p = torch.tensor([p.min_p for p in params], device=self.device)
        if bool((min_p > 0).any()):
            threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < threshold, 0.0)

        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        if any(top_k) or any(v < 1.0 for v in top_p):
            probs = self._top_k_top_p(probs, top_k, top_p)
        return probs

    def verify(self, logits: torch.Tensor, request: ScheduledRequest) -> list[int]:
        """The request's drafts checked against `logits` [1 + d, V] (the rows of its last
        sampled token and of each draft): the drafts kept, then one token of the model's own.

        Each position's token is the one decoding one at a time would pick there, with the
        same number drawn for it (`_uniforms` by output position): greedy, the argmax; sampled,
        the target distribution inverted at that number. Drafts are kept while each equals
        its position's token, and the first one that does not is replaced by it. A draft is
        so kept with probability p_i(draft), as rejection sampling keeps a proposal that was
        certain of its token, and a seeded request's tokens are those it samples without
        speculation."""
        drafts, params = request.draft_token_ids, request.sampling_params
        if params.is_greedy:
            picked = self.argmax(logits).tolist()
        else:
            probs = self._probs(logits.to(torch.float32), [params] * logits.shape[0])
            uniform = self._uniforms(request, logits.shape[0])[:, None]
            picked = inverse_cdf(probs, uniform).tolist()
        kept = 0
        while kept < len(drafts) and picked[kept] == drafts[kept]:
            kept += 1
        return [*drafts[:kept], picked[kept]]

    def _top_k_top_p(
        self, probs: torch.Tensor, top_k: list[int], top_p: list[float]
    ) -> torch.Tensor:
        vocab = probs.shape[-1]
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        k = torch.tensor([v if v > 0 else vocab for v in top_k], device=self.device)
        ranks = torch.arange(vocab, device=self.device)[None, :]
        sorted_probs = sorted_probs.masked_fill(ranks >= k[:, None], 0.0)
        # Top-p keeps the smallest prefix of the top-k mass that reaches p (the first token stays).
        # (p = 1 becomes 2 so float rounding in the cumsum can never drop a tail token.)
        p = torch.tensor([v if v < 1.0 else 2.0 for v in top_p], device=self.device)[:, None]
        mass_before = (sorted_probs.cumsum(dim=-1) - sorted_probs) / sorted_probs.sum(
            -1, keepdim=True
        )
        sorted_probs = sorted_probs.masked_fill(mass_before >= p, 0.0)
        return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
