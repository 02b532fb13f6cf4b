"""Speculative decoding with n-gram prompt lookup: greedy output is the non-speculative output
token for token (preemption and prefix caching on), sampled output keeps the target
distribution, rejected drafts give their blocks back, and drafting stops where it cannot pay."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.core.outputs import ModelRunnerOutput, ScheduledRequest
from inflight.core.speculation import MODEL_DRAFT, Speculation, StepCostFit
from inflight.runner.sampler import Sampler
from tests.core.helpers import make_request, make_scheduler


def repetitive_prompts(vocab: int, count: int = 12) -> list[list[int]]:
    """Prompts that repeat a phrase, so lookup finds drafts; and plain random ones."""
    rng = random.Random(7)
    prompts = []
    for i in range(count):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
        prompts.append(phrase * rng.randint(2, 5) if i % 3 else phrase + phrase[:2])
    return prompts


def generate(llm: LLM, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("knobs", [
    {},
    {"num_kv_blocks": 40, "kv_block_size": 4},  # a pool that binds: preemption by recompute
])  # fmt: skip
def test_greedy_tokens_are_those_of_decoding_one_at_a_time(tiny_llama, knobs):
    base = {"dtype": "float32", "max_num_seqs": 6, "enable_prefix_caching": True, **knobs}
    plain = LLM(str(tiny_llama), **base)
    prompts = repetitive_prompts(plain.vocab_size)
    params = [SamplingParams(temperature=0, max_tokens=24 + i, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    want = generate(plain, prompts, params)
    spec = LLM(str(tiny_llama), num_speculative_tokens=4, **base)
    assert generate(spec, prompts, params) == want
    speculation = spec.core.scheduler.speculation
    assert speculation.stats.drafted > 0, "lookup must be tested (acceptance: the integration test)"
    if knobs:
        assert spec.core.scheduler.num_preemptions > 0, "the pool was meant to bind"
    assert spec.core.kv_cache_manager.pool.num_used_blocks == 0


@pytest.mark.parametrize("arch", ["gemma3", "gpt_oss", "deepseek_v3", "qwen3_moe"])
def test_verifying_drafts_leaves_every_kind_of_layer_its_tokens(
    tiny_model_factory, monkeypatch, arch
):
    """Banded layers with sinks, latent attention, routed experts: a step that verifies drafts
    (k + 1 rows a request, most drafts rejected, their KV overwritten) gives each request the
    tokens it gets alone without drafts, all at once and chunked in a small pool (which
    preempts where nothing holds global layers). Drafts are forced (the prompt's first tokens),
    as a tiny random model repeats too little for lookup to find many."""

    def always(self, request, limit):
        limit = min(self.k, limit)
        return list(request.prompt_token_ids[:limit]) if limit > 0 else []

    monkeypatch.setattr(Speculation, "propose", always)
    path = str(tiny_model_factory(arch))
    base = {"dtype": "float32", "attention_backend": "cpu", "device": "cpu"}
    prompts = repetitive_prompts(400, count=8)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    want = generate(LLM(path, **base, max_num_seqs=1), prompts, params)
    windowed = arch in ("gemma3", "gpt_oss")  # (a pool that holds their global layers)
    for knobs in ({}, {"num_kv_blocks": 80 if windowed else 12, "max_num_batched_tokens": 32}):
        spec = LLM(path, **base, **knobs, num_speculative_tokens=4)
        assert generate(spec, prompts, params) == want
        assert spec.core.scheduler.speculation.stats.drafted > 100
        assert spec.core.scheduler.num_preemptions > 0 or not knobs or windowed
        assert spec.core.kv_cache_manager.pool.num_used_blocks == 0


def test_seeded_sampled_tokens_are_those_of_sampling_without_speculation(tiny_llama):
    """Verification samples each position with the number plain decoding draws there, so a
    seeded request's tokens do not depend on whether (or what) anything was drafted."""
    base = {"dtype": "float32", "max_num_seqs": 6}
    plain = LLM(str(tiny_llama), **base)
    prompts = repetitive_prompts(plain.vocab_size)
    params = [SamplingParams(temperature=0.2, seed=100 + i, max_tokens=24, ignore_eos=True)
              for i in range(len(prompts))]  # fmt: skip
    want = generate(plain, prompts, params)
    spec = LLM(str(tiny_llama), num_speculative_tokens=4, **base)
    assert generate(spec, prompts, params) == want
    stats = spec.core.scheduler.speculation.stats
    assert stats.accepted > 0 and stats.drafted > stats.accepted  # drafts kept and replaced


def test_rejection_sampling_keeps_the_target_distribution():
    """Two drafts against known distributions: the first token follows p0 whatever the draft,
    and the second follows p1 whenever the first draft was kept."""
    torch.manual_seed(0)
    vocab, trials = 6, 12_000
    logits = torch.randn(3, vocab) * 1.5
    sampler = Sampler(torch.device("cpu"), seed=1)
    params = SamplingParams(temperature=0.8, top_k=5)
    request = ScheduledRequest("r", [0, 2, 4], 10, [0], True, params, [1] * 10, [],
                               draft_token_ids=[2, 4])  # fmt: skip
    first, second = Counter(), Counter()
    for _ in range(trials):
        tokens = sampler.verify(logits, request)
        first[tokens[0]] += 1
        if tokens[0] == 2:
            second[tokens[1]] += 1
    target = sampler._probs(logits.clone(), [params] * 3)
    got0 = torch.tensor([first[t] / trials for t in range(vocab)])
    assert torch.allclose(got0, target[0], atol=0.015), (got0, target[0])
    kept = sum(second.values())
    got1 = torch.tensor([second[t] / kept for t in range(vocab)])
    assert torch.allclose(got1, target[1], atol=0.025), (got1, target[1])
    assert target[0].min() == 0  # top-k removed a token, and it is never drawn
    assert first[int(target[0].argmin())] == 0


def test_rejected_drafts_give_their_blocks_back():
    s = make_scheduler(num_blocks=16, block_size=4, num_speculative_tokens=4)
    s.add_request(make_request("a", prompt_len=6, max_tokens=20))
    request = s.requests["a"]
    request.prompt_token_ids[:] = [5, 6, 7, 8, 5, 6]  # "5 6" recurs: lookup drafts "7 8 5 6"
    out = s.schedule()
    s.update_from_output(out, ModelRunnerOutput({"a": 7}))  # the prompt, then 7
    out = s.schedule()
    (scheduled,) = out.scheduled
    assert scheduled.token_ids == [7, 8, 5, 6, 7] and scheduled.draft_token_ids == [8, 5, 6, 7]
    assert len(s.kv.get_block_table("a")) == 3  # 11 positions
    # the model keeps "8" and samples 9 where the draft said 5
    s.update_from_output(out, ModelRunnerOutput({"a": 9}, accepted_draft_ids={"a": [8]}))
    assert request.output_token_ids == [7, 8, 9]
    assert request.num_computed_tokens == 8 == request.num_tokens - 1
    assert len(s.kv.get_block_table("a")) == 2  # the third block held only rejected slots
    assert s.kv.pool.num_used_blocks == 2
    assert s.speculation.stats.drafted == 4 and s.speculation.stats.accepted == 1


def test_a_stop_inside_the_kept_drafts_ends_there():
    s = make_scheduler(num_blocks=16, block_size=4, num_speculative_tokens=4)
    s.add_request(make_request("a", prompt_len=6, max_tokens=3))
    s.requests["a"].prompt_token_ids[:] = [5, 6, 7, 8, 5, 6]
    out = s.schedule()
    s.update_from_output(out, ModelRunnerOutput({"a": 7}))
    out = s.schedule()
    assert out.scheduled[0].draft_token_ids == [8], "max_tokens 3: room for one draft"
    (done,) = s.update_from_output(out, ModelRunnerOutput({"a": 1}, accepted_draft_ids={"a": [8]}))
    assert done.new_token_ids == [8, 1] and done.finish_reason == "length"
    assert s.kv.pool.num_used_blocks == 0


def test_lookup_finds_the_latest_earlier_occurrence_of_the_longest_suffix():
    spec = Speculation(3)
    r = make_request("a", prompt_len=1, max_tokens=50)
    r.prompt_token_ids[:] = [1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3]
    assert spec.propose(r, 10) == [4, 5, 2]  # "1 2 3"? no: suffix "2 3" last seen before 4
    r.output_token_ids.append(7)  # suffix "3 7": never seen
    assert spec.propose(r, 10) == []
    assert spec.propose(make_request("b", prompt_len=3, max_tokens=5), 0) == []


def test_drafting_stops_where_the_step_time_it_adds_outweighs_acceptance():
    fit = StepCostFit()
    for tokens in (8, 16, 24, 32, 40, 48):  # 8 sequences, 10 ms + 1 ms a token
        fit.observe(tokens, 8, 0.010 + 0.001 * tokens)
    assert fit.seconds_per_token == pytest.approx(0.001)
    # a draft token costs 1 ms for all 8 sequences of a ~20-60 ms step
    assert fit.break_even_rate() == pytest.approx(0.001 * 8 / fit.mean_seconds)
    assert 0.018 < fit.mean_seconds < 0.058 and 0.1 < fit.break_even_rate() < 0.45
    spec = Speculation(4)
    spec.cost = fit
    r = make_request("a", prompt_len=1, max_tokens=50)
    r.prompt_token_ids[:] = [1, 2, 3, 1, 2]
    assert spec.propose(r, 4) == [3, 1, 2]
    spec.on_verified("a", drafted=40, accepted=2)  # 4 of 44 with the prior: 9%
    assert spec.propose(r, 4) == [] and spec.stats.declined == 1


def test_a_draft_model_drafts_only_while_its_passes_cost_less_than_acceptance_saves():
    """4 sequences, 10 ms a plain step, 1 ms a query token; each drafts 4 tokens a step, all
    kept. A drafter pass as costly as a plain step (10 ms, 4 passes for 16 drafts) costs more
    per draft than a plain step's time per sequence: it never pays, however many are kept. A
    pass of 1 ms pays."""

    def fitted(pass_seconds: float) -> StepCostFit:
        fit = StepCostFit()
        for step in range(30):
            drafts = 16 if step % 2 else 0  # steps with and without drafts: a slope to fit
            drafter = 4 * pass_seconds if drafts else 0.0
            fit.observe(4 + drafts, 4, 0.010 + 0.001 * drafts + drafter, drafts)
            fit.observe_drafter(drafter, drafts)
        return fit

    costly, cheap = fitted(0.010), fitted(0.001)
    assert costly.drafter_seconds_per_token == pytest.approx(0.0025)
    assert costly.seconds_per_token == pytest.approx(0.001 + 0.0025)  # the step time's slope
    # (1 + 2.5 + 2.5) ms a draft against ~2.5 ms a token without drafts: > 1, never pays
    assert costly.break_even_rate() > 1.5
    assert 0.3 < cheap.break_even_rate() < 0.9
    for fit, pays in ((costly, False), (cheap, True)):
        spec = Speculation(4, by_model=True)
        spec.cost = fit
        r = make_request("a", prompt_len=3, max_tokens=50)
        spec.propose(r, 4)  # the request's first: acceptance 1/2 assumed
        spec.on_verified("a", drafted=400, accepted=400)
        declined = spec.stats.declined
        assert (spec.propose(r, 4) == [MODEL_DRAFT] * 4) is pays
        assert spec.stats.declined - declined == (0 if pays else 1)


def test_a_stop_string_ends_the_tokens_where_one_at_a_time_would(tiny_llama):
    """A step of kept drafts can carry tokens past a stop string: they are not returned."""
    base = {"dtype": "float32", "max_num_seqs": 4}
    plain = LLM(str(tiny_llama), **base)
    prompts = repetitive_prompts(plain.vocab_size, count=6)
    first = generate(plain, prompts, [SamplingParams(temperature=0, max_tokens=30)] * 6)
    # stop strings: the text of each output's 6th-8th tokens, so each stops mid-output
    stops = [plain.tokenizer.decode(out[5:8]) for out in first]
    params = [SamplingParams(temperature=0, max_tokens=30, stop=[s]) for s in stops]
    want = plain.generate(prompts, params, use_tqdm=False)
    spec = LLM(str(tiny_llama), num_speculative_tokens=4, **base)
    got = spec.generate(prompts, params, use_tqdm=False)
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].text == w.outputs[0].text


def test_the_dashboard_feed_shows_the_share_of_drafts_kept():
    from inflight.metrics.live import LiveFeed
    from inflight.metrics.stats import SpeculationStats, StepStats

    feed = LiveFeed()
    assert feed.state(now=1.0)["events"]["draft_acceptance"] is None  # nothing drafted yet
    first, second = SpeculationStats(drafted=8, accepted=6), SpeculationStats(drafted=2, declined=3)
    feed.add_step(StepStats(t=1.0, duration_s=0.01, speculation=first))
    feed.add_step(StepStats(t=2.0, duration_s=0.01, speculation=second))
    events = feed.state(now=2.5)["events"]
    assert events["draft_acceptance"] == 0.6 and events["drafts_declined"] == 3
