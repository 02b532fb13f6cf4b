"""Sampler behaviour on hand-made logits: greedy, filters, penalties, seeds, logprobs."""

from __future__ import annotations

import math

import torch

from inflight.core.outputs import ScheduledRequest
from inflight.runner.sampler import Sampler, inverse_cdf, seeded_uniform
from inflight.sampling_params import SamplingParams

VOCAB = 8


def req(rid: str, prompt=(1,), outputs=(), eos=frozenset({0}), **params) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=rid,
        token_ids=[1],
        start_pos=0,
        block_table=[0],
        sample=True,
        sampling_params=SamplingParams(**params),
        prompt_token_ids=list(prompt),
        output_token_ids=list(outputs),
        eos_token_ids=eos,
    )


def logits_of(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def draw_many(sampler, logits_row, request, n=400) -> list[int]:
    logits = logits_of(logits_row)
    return [sampler.sample(logits, [request])[0][0] for _ in range(n)]


def test_greedy_takes_argmax():
    s = Sampler(torch.device("cpu"))
    tokens, _ = s.sample(logits_of([0, 1, 5, 2, 0, 0, 0, 0]), [req("a", temperature=0)])
    assert tokens == [2]


def test_greedy_ties_take_the_first_maximum_in_both_paths():
    """The bf16 fast path (all greedy) and the float32 path (a penalty) agree with argmax."""
    s = Sampler(torch.device("cpu"))
    row = [0, 5, 1, 5, 5, 0, 0, 0]
    logits = torch.tensor([row, row[::-1]], dtype=torch.bfloat16)
    fast, _ = s.sample(logits, [req("a", temperature=0), req("b", temperature=0)])
    assert fast == [1, 3] == logits.float().argmax(-1).tolist()
    slow, _ = s.sample(logits, [req("c", temperature=0), req("d", temperature=0, logprobs=1)])
    assert slow == [1, 3]


def test_top_k_and_top_p_restrict_the_support():
    row = [3.0, 2.9, 2.8, 2.7, 0, 0, 0, 0]
    s = Sampler(torch.device("cpu"), seed=1)
    assert set(draw_many(s, row, req("k", top_k=2))) == {0, 1}
    # probs ~ [.26, .24, .21, .19, .01 ...]: top_p 0.5 keeps the first two (mass before < 0.5)
    assert set(draw_many(s, row, req("p", top_p=0.5))) == {0, 1}
    # p_i / p_max = e^-0.1, e^-0.2, e^-0.3 = .90, .82, .74: min_p 0.8 keeps three
    assert set(draw_many(s, row, req("m", min_p=0.8))) == {0, 1, 2}


def test_inverse_cdf_draws_each_index_with_its_probability():
    weights = torch.tensor([[0.0, 4.0, 0.0, 2.0, 1.0, 1.0, 0.0, 0.0]])  # sum 8, not normalised
    # uniform u picks the first index whose cumulative weight exceeds 8u: [0, 4, 4, 6, 7, 8, 8, 8]
    for u, want in [(0.0, 1), (0.4999, 1), (0.5, 3), (0.75, 4), (0.875, 5), (0.99999999, 5)]:
        assert inverse_cdf(weights, torch.tensor([[u]])).item() == want
    gen = torch.Generator().manual_seed(0)
    draws = inverse_cdf(weights.expand(20000, -1), torch.rand(20000, 1, generator=gen))
    freq = torch.bincount(draws, minlength=8).float() / 20000
    torch.testing.assert_close(freq, weights[0] / 8, atol=0.015, rtol=0)


def test_temperature_sharpens_and_flattens():
    row = [2.0, 1.0, 0, 0, 0, 0, 0, 0]
    s = Sampler(torch.device("cpu"), seed=2)
    cold = draw_many(s, row, req("c", temperature=0.1))
    hot = draw_many(s, row, req("h", temperature=5.0))
    assert cold.count(0) > 390
    assert len(set(hot)) == VOCAB


def test_seeded_requests_do_not_depend_on_batch_company_or_on_earlier_draws():
    """A seeded request's k-th token is drawn by a number of (seed, k) alone: the same beside
    other requests, under another id, from another sampler, and asked twice."""
    s1, s2 = Sampler(torch.device("cpu"), seed=0), Sampler(torch.device("cpu"), seed=99)
    row = [1.0] * VOCAB
    outputs = [(3,) * k for k in range(20)]  # the k-th draw follows k outputs
    alone = [s1.sample(logits_of(row), [req("x", outputs=o, seed=42)])[0][0] for o in outputs]
    again = [s1.sample(logits_of(row), [req("y", outputs=o, seed=42)])[0][0] for o in outputs]
    crowded = []
    for o in reversed(outputs):
        batch = [req("noise1"), req("x", outputs=o, seed=42), req("noise2", seed=7)]
        crowded.append(s2.sample(logits_of(row, row, row), batch)[0][1])
    assert alone == again == crowded[::-1]
    assert len(set(alone)) > 3  # it really samples
    other_seed = [s1.sample(logits_of(row), [req("x", outputs=o, seed=43)])[0][0] for o in outputs]
    assert other_seed != alone


def test_seeded_uniforms_are_uniform_and_apart_between_seeds():
    values = [seeded_uniform(seed, k) for seed in (0, 1, 2**63 - 1, -5) for k in range(2500)]
    assert all(0.0 <= v < 1.0 for v in values)
    counts = [0] * 10
    for v in values:
        counts[int(v * 10)] += 1
    assert all(abs(c - 1000) < 150 for c in counts), counts  # 10k draws in 10 bins
    assert len(set(values)) == len(values)


def test_penalties_follow_their_definitions():
    s = Sampler(torch.device("cpu"))
    base = [2.0, 2.0, -1.0, 1.0, 0, 0, 0, 0]
    # repetition 2: token 0 (prompt, positive) 2 -> 1; token 2 (output, negative) -1 -> -2
    r = req("r", prompt=(0,), outputs=(2,), repetition_penalty=2.0, temperature=0)
    assert s._apply_penalties(logits_of(base), [r])[0, :4].tolist() == [1.0, 2.0, -2.0, 1.0]
    # frequency 0.5 on token 1 seen twice, presence 1.0 on tokens 1 and 3
    f = req("f", outputs=(1, 1, 3), frequency_penalty=0.5, presence_penalty=1.0)
    assert s._apply_penalties(logits_of(base), [f])[0, :4].tolist() == [2.0, 0.0, -1.0, -0.5]


def test_min_tokens_masks_eos_and_stop_ids_and_logit_bias_applies():
    s = Sampler(torch.device("cpu"))
    row = [9.0, 0, 0, 8.0, 0, 0, 0, 0]
    r = req("m", temperature=0, min_tokens=2, stop_token_ids=[3], max_tokens=5)
    assert s.sample(logits_of(row), [r])[0] == [1]  # eos 0 and stop 3 banned: first of the rest
    b = req("b", temperature=0, logit_bias={5: 100.0})
    assert s.sample(logits_of(row), [b])[0] == [5]


def test_logprobs_are_of_the_raw_distribution_with_rank_and_top_n():
    s = Sampler(torch.device("cpu"))
    row = [1.0, 3.0, 2.0, 0, 0, 0, 0, 0]
    tokens, lps = s.sample(logits_of(row), [req("l", temperature=0, logprobs=2)])
    lp = lps[0]
    expected = torch.log_softmax(logits_of(row), -1)[0]
    assert tokens == [1] and lp.token_id == 1 and lp.rank == 1
    assert math.isclose(lp.logprob, float(expected[1]), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [1, 2]
    _, none = s.sample(logits_of(row), [req("n", temperature=0)])
    assert none == [None]
