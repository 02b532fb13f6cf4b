"""KVForecast against the scheduler it forecasts: block counts by hand, and the lowest free
block count over the next steps against actually stepping a copy of the scheduler."""

from __future__ import annotations

import copy

import pytest

from tests.core.helpers import fake_model_output, make_request, make_scheduler, step


def decoding_batch(enable_prefix_caching: bool, **knobs):
    """Five requests, all past their prompts, ending 1 to 23 steps from now (block size 4).
    "d" comes first: with prefix caching the others then share its first block (all prompts
    start with the same tokens), so when one of them ends that block is not freed."""
    s = make_scheduler(num_blocks=64, block_size=4, max_model_len=64,
                       enable_prefix_caching=enable_prefix_caching, **knobs)  # fmt: skip
    s.add_request(make_request("d", 13, 12))
    step(s)
    for rid, prompt_len, max_tokens in [("a", 5, 2), ("b", 9, 7), ("c", 3, 24), ("e", 8, 16)]:
        s.add_request(make_request(rid, prompt_len, max_tokens))
    step(s)
    assert all(r.num_tokens - r.num_computed_tokens == 1 for r in s.running)
    return s


def test_block_counts_by_hand():
    s = decoding_batch(enable_prefix_caching=False, kv_admission="reserve")
    f = s.admission.forecast
    by_id = {r.request_id: r for r in s.running}
    # "d": 13 prompt tokens + 2 sampled, 4 blocks held; at most 25 tokens, the last never
    # computed: 24 in the KV cache, 6 blocks.
    d = by_id["d"]
    assert f.tokens_left(d) == 10
    assert (f.final_blocks(d), f.owed_blocks(d)) == (6, 2)
    owed = {rid: f.owed_blocks(r) for rid, r in by_id.items()}
    assert owed == {"a": 0, "b": 1, "c": 6, "d": 2, "e": 4}  # held: cdiv(prompt, 4)
    assert f.unreserved_blocks(s.running) == s.kv.pool.num_free_blocks - 13
    # Within 6 tokens of their end: "a" (1 left, 2 blocks) and "b" (6 left, 3 blocks + 1 owed).
    assert [r.request_id for r in s.running if f.ends_within(r, 6)] == ["a", "b"]
    assert f.returned_reservation(s.running, 6) == 2 + 3 + 1


@pytest.mark.parametrize("enable_prefix_caching", [False, True])
def test_free_blocks_ahead_against_stepping_the_scheduler(enable_prefix_caching):
    s = decoding_batch(enable_prefix_caching)
    horizon = 25  # past every request's end
    twin = copy.deepcopy(s)
    free_once_scheduled = []  # a request that ends frees its blocks after its step
    for _ in range(horizon):
        out = twin.schedule()
        free_once_scheduled.append(twin.kv.pool.num_free_blocks)
        twin.update_from_output(out, fake_model_output(out))
    ahead = s.admission.forecast.free_blocks_ahead(s.running, horizon)
    if not enable_prefix_caching:  # exact
        assert ahead == free_once_scheduled
    else:
        # A block shared now is counted as staying held, though its other holders may end
        # first: never more than the truth, and the ones that stay shared are not counted.
        assert all(a <= b for a, b in zip(ahead, free_once_scheduled, strict=True))
        assert ahead[:10] == free_once_scheduled[:10]  # before "d", the first holder, ends
        assert ahead != free_once_scheduled
    for h in (1, 6, 12):  # a shorter horizon forecasts the same steps
        assert s.admission.forecast.free_blocks_ahead(s.running, h) == ahead[:h]
    assert s.admission.forecast.lowest_free_blocks(s.running, 6) == min(ahead[:6])


def test_lowest_free_blocks_is_cautious_about_prefills_and_ignores_guesses():
    # A prompt computed 4 tokens a step is assumed to take all its blocks at once.
    s = make_scheduler(num_blocks=64, block_size=4, max_model_len=64, prefill_chunk_size=4,
                       enable_prefix_caching=False)  # fmt: skip
    s.add_request(make_request("p", 20, 4))
    step(s)
    free = s.kv.pool.num_free_blocks
    assert (
        s.admission.forecast.lowest_free_blocks(s.running, 1) == free - 4
    )  # 20 tokens: 5 blocks, 1 held
    s.admission.forecast.probation.add(s.running[0].request_id)  # on probation: not counted
    assert s.admission.forecast.lowest_free_blocks(s.running, 1) == free
