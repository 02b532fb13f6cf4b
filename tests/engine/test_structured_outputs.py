"""Structured outputs in the engine, on the tiny model: constraints hold, a constrained request
never changes its neighbours' tokens, bad constraints are refused before queueing, and a
constrained request that breaks fails alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.errors import InvalidRequestError
from inflight.sampling_params import StructuredOutputs
from inflight.structured import GrammarMasks
from inflight.structured.masks import ban_bias

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 20},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["kind", "age", "tags"],
}
PHONE = r"[0-9]{3}-[0-9]{4}"


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), dtype="float32", max_model_len=256, num_kv_blocks=96)


def prompts(n: int) -> list[list[int]]:
    return [[5 + i, 20 + 3 * i, 40 + i, 60 + 2 * i][: 2 + i % 3] for i in range(n)]


def constrained(seed: int, **spec) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=120,
                          structured_outputs=StructuredOutputs(**spec))  # fmt: skip


def texts(outs) -> list[str]:
    return [o.outputs[0].text for o in outs]


def test_constraints_hold(llm):
    outs = llm.generate(prompts(12), [
        *(constrained(i, json=SCHEMA) for i in range(4)),
        *(constrained(i, regex=PHONE) for i in range(4)),
        *(constrained(i, choice=['say "yes"', "no", "ünïcode"]) for i in range(4)),
    ], use_tqdm=False)  # fmt: skip
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)
    for text in texts(outs[:4]):
        jsonschema.validate(json.loads(text), SCHEMA)
    assert all(re.fullmatch(PHONE, t) for t in texts(outs[4:8]))
    assert set(texts(outs[8:])) <= {'say "yes"', "no", "ünïcode"}


def test_unconstrained_requests_keep_their_tokens_beside_constrained_ones(llm):
    plain = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)] * 4
    plain += [SamplingParams(temperature=1.0, seed=i, max_tokens=16, ignore_eos=True)
              for i in range(4)]  # fmt: skip
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts(8), plain, use_tqdm=False)]
    neighbours = [constrained(i, json=SCHEMA) for i in range(8)]
    outs = llm.generate(prompts(8) + prompts(16)[8:], plain + neighbours, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[:8]] == alone
    for text in texts(outs[8:]):
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_complete_grammar_stops_even_under_ignore_eos(llm):
    choice = StructuredOutputs(choice=["alpha", "beta"])
    params = SamplingParams(
        temperature=1.0, seed=1, max_tokens=50, ignore_eos=True, structured_outputs=choice
    )
    (out,) = llm.generate([prompts(1)[0]], params, use_tqdm=False)
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].text in ("alpha", "beta")


def test_max_tokens_cuts_a_grammar_with_length(llm):
    params = constrained(0, regex="a+b")  # never forced to end
    params.max_tokens = 5
    params.temperature = 0  # the tiny model keeps choosing "a"s? either way: 5 tokens, a prefix
    (out,) = llm.generate([prompts(1)[0]], params, use_tqdm=False)
    completion = out.outputs[0]
    if completion.finish_reason == "length":
        assert len(completion.token_ids) == 5 and re.fullmatch("a+b?", completion.text)
    else:
        assert re.fullmatch("a+b", completion.text)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"json": "{not json"}, "not valid JSON"),
        ({"json": {"type": 5}}, "not a valid JSON schema"),
        ({"json": {"type": "object", "properties": {"a": {"minLength": -1}}}}, "not a valid"),
        ({"regex": "(("}, "does not compile"),
        ({"grammar": "root ::= undefined_rule"}, "does not compile"),
    ],
)
def test_constraints_that_do_not_compile_are_refused_before_queueing(llm, spec, message):
    with pytest.raises(InvalidRequestError, match=message) as e:
        llm.generate([prompts(1)[0]], constrained(0, **spec), use_tqdm=False)
    assert e.value.param == "structured_outputs"
    assert not llm.core.has_unfinished_requests()


@pytest.mark.parametrize(
    "spec",
    [{}, {"regex": "a", "choice": ["a"]}, {"choice": []}, {"regex": ""}, {"json": 5},
     {"regex": "\ud800"}, {"grammar": "x" * (64 * 1024 + 1)}],
)  # fmt: skip
def test_malformed_constraints_are_typed_errors(spec):
    with pytest.raises(InvalidRequestError) as e:
        StructuredOutputs(**spec)
    assert e.value.param == "structured_outputs"


def test_compiled_grammars_are_cached_by_their_text(llm):
    grammars = llm.input_processor.grammars
    first = grammars.compile(StructuredOutputs(json={"type": "object", "properties": {}}))
    before = grammars.stats.cold
    again = grammars.compile(StructuredOutputs(json='{"type": "object", "properties": {}}'))
    assert again is first and grammars.stats.cold == before
    assert grammars.compile(StructuredOutputs(regex="x+")) is not first


def test_min_tokens_and_a_constraint_are_refused():
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(min_tokens=2, structured_outputs=StructuredOutputs(regex="a"))
    assert e.value.param == "min_tokens"


@pytest.mark.parametrize("where", ["fill", "accept"])
def test_a_constrained_request_that_breaks_fails_alone(llm, monkeypatch, where):
    plain = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] * 6
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts(6), plain, use_tqdm=False)]
    poison = [9, 9, 9, 9]
    masks = llm.core.runner.grammar_masks
    poisoned_ids: set[str] = set()
    if where == "fill":
        real = masks._matcher

        def matcher(s):
            if s.prompt_token_ids == poison and len(s.output_token_ids) == 2:
                poisoned_ids.add(s.request_id)
                raise RuntimeError("matcher broke")
            return real(s)

        monkeypatch.setattr(masks, "_matcher", matcher)
    else:
        real_accept = masks.accept

        def accept(request_id, token_id):
            if len(poisoned_ids) == 0 and request_id in masks.matchers:
                poisoned_ids.add(request_id)
                return False, "matcher refused"
            return real_accept(request_id, token_id)

        monkeypatch.setattr(masks, "accept", accept)
    outs = llm.generate(
        [*prompts(3), poison, *prompts(6)[3:]],
        [*plain[:3], constrained(0, regex="[a-z]{8}"), *plain[3:]],
        use_tqdm=False,
    )
    broken = outs.pop(3).outputs[0]
    assert broken.finish_reason == "error"
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert llm.core.kv_cache_manager.pool.num_used_blocks == 0
    assert not masks.matchers  # every matcher dropped with its request


def test_constrained_requests_survive_recompute_preemption(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=10,
              max_num_seqs=8)  # fmt: skip
    outs = llm.generate(prompts(8), [constrained(i, json=SCHEMA) for i in range(8)],
                        use_tqdm=False)  # fmt: skip
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for text in texts(outs):
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ban_bias_matches_xgrammar(dtype):
    import xgrammar as xgr

    vocab = 1000
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, (vocab + 31) // 32), dtype=torch.int32)
    logits = torch.zeros(3, vocab)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
    bias = ban_bias(bitmask, vocab, dtype)
    assert bias.dtype == dtype and torch.equal(bias.float(), logits)


def test_applying_masks_touches_only_constrained_rows_and_reports_dead_rows():
    logits = torch.randn(4, 64)
    before = logits.clone()
    bitmask = torch.tensor([[0b1010, 0], [0, 0]], dtype=torch.int32)  # row 1 allows nothing
    dead = GrammarMasks.apply(logits, [1, 3], bitmask)
    assert dead == [3]
    assert torch.equal(logits[[0, 2, 3]], before[[0, 2, 3]])
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert allowed == [1, 3]
