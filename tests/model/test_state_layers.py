"""What the state that some layers carry between steps in place of KV must survive, for each
family that has it (`runner/conv_state.py`): LFM2's short convolutions and Qwen3.5's DeltaNet
layers (their convolution inputs and state matrices). Each tiny model is held to transformers'
greedy tokens through preemption (recompute), requests coming and going through few slots, a
failed batch run again in halves, aborts, prefix-cache hits that resume from a saved state, and
swapping to host memory and back; what would lose the state is refused."""

from __future__ import annotations

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.errors import ConfigError
from inflight.request import FinishReason
from tests.parity import (
    assert_same_outputs,
    assert_state_slots_free,
    greedy_outputs,
    greedy_reference,
    greedy_tokens,
)

# on a GPU the engine runs on CUDA, where tensor parallelism (CPU ranks) and the C++ kernels
# (host memory) are refused
CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU ranks and the C++ kernels: not on a GPU"
)


@pytest.fixture(scope="module", params=["lfm2", "qwen3_5"])
def stateful(request, tiny_model_factory):
    """A tiny stateful model's folder, 16 prompts and transformers' greedy tokens for them."""
    folder = tiny_model_factory(request.param)
    return folder, *greedy_reference(folder)


def test_preempted_requests_recompute_their_state(stateful):
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), dtype="float32", kv_block_size=4, num_kv_blocks=40,
              max_num_batched_tokens=96)  # fmt: skip
    assert greedy_tokens(llm, prompts, max_tokens) == expected
    assert llm.core.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    assert_state_slots_free(llm)


@pytest.mark.parametrize("knobs", [{"max_num_seqs": 1}, {"max_num_seqs": 3,
                                                          "prefill_chunk_size": 5}])  # fmt: skip
def test_requests_come_and_go_through_few_slots(stateful, knobs):
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), dtype="float32", **knobs)
    assert greedy_tokens(llm, prompts, max_tokens) == expected
    assert_state_slots_free(llm)


@pytest.mark.parametrize("backend", [pytest.param("cpu", marks=CPU_ONLY), "torch"])
def test_a_batch_failing_midway_is_run_again_from_its_rebuilt_state(stateful, backend):
    """A step of several requests that fails after the stateful layers advanced their state in
    place is run again in halves, each request's state first rebuilt from its tokens: every
    request gets the tokens it gets alone. Where the C++ kernels run the layers as one call
    (`FusedDecoderLayers`: LFM2's, Qwen3.5's) it fails once it has run every layer; otherwise
    the last layer's MLP fails, after the stateful layers (Qwen3.5's DeltaNet layer in PyTorch
    with `torch`)."""
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), dtype="float32", prefill_chunk_size=8, max_num_batched_tokens=64,
              attention_backend=backend)  # fmt: skip
    model, runner = llm.core.loaded.model, llm.core.runner
    fused = model.fused_layers is not None
    assert fused == (backend == "cpu" and model.fusable)
    calls, failures, batch = [], [], [0]
    run_batch = runner._run

    def counted(scheduled):
        batch[0] = len(scheduled)
        return run_batch(scheduled)

    runner._run = counted

    def failing(run):
        def call(x, *args, **kwargs):
            out = run(x, *args, **kwargs)
            calls.append(x.shape[0])
            # three faults from the sixth pass on, where requests are past their first chunk,
            # in steps of several requests (a rebuild runs one)
            if len(calls) > 5 and batch[0] > 1 and len(failures) < 3:
                failures.append(x.shape[0])
                raise RuntimeError("a fault after the stateful layers ran")
            return out

        return call

    if fused:
        model.fused_layers.run = failing(model.fused_layers.run)
    else:
        model.layers[-1].mlp = failing(model.layers[-1].mlp)
    assert greedy_tokens(llm, prompts, max_tokens) == expected
    assert len(failures) == 3
    assert_state_slots_free(llm)


@pytest.mark.parametrize("beside", [16, 1])
def test_a_request_whose_inputs_break_a_step_fails_alone_mid_decode(stateful, beside):
    """A request that breaks every step it is in, once past its prompt, fails alone: the
    requests beside it (15, or one: left alone once the poisoned one fails its rebuild), their
    state rows rebuilt from their tokens before the batch's halves run, get their own tokens,
    and every slot comes back."""
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), dtype="float32", max_num_batched_tokens=64)
    poison = [9, 9, 9, 9, 9]

    def hook(s):
        if s.prompt_token_ids == poison and len(s.output_token_ids) >= 3:
            raise RuntimeError("poisoned input")

    llm.core.runner.fault_hook = hook
    prompts, max_tokens, expected = prompts[:beside], max_tokens[:beside], expected[:beside]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
              for n in [12, *max_tokens]]  # fmt: skip
    outs = llm.generate([poison, *prompts], params, use_tqdm=False)
    poisoned = outs.pop(0).outputs[0]
    assert poisoned.finish_reason == "error" and len(poisoned.token_ids) == 3
    assert [o.outputs[0].token_ids for o in outs] == expected
    llm.core.runner.fault_hook = None
    assert_state_slots_free(llm)


def test_aborted_requests_give_their_slots_back_and_others_keep_their_tokens(stateful):
    """Clients that vanish mid-generation: their requests end (abort), their slots go back, and
    the requests beside them and after them get transformers' tokens in the slots they free."""
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), dtype="float32", max_num_seqs=3, prefill_chunk_size=8)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts[:8], params[:8], strict=True)]
    got: dict[str, list[int]] = {}
    for _ in range(4):
        _step(llm, got)
    _abort_then_finish(llm, set(ids[:2]), dict(zip(ids, expected, strict=False)), got)


def _step(llm: LLM, got: dict[str, list[int]]) -> None:
    for out in llm.step():
        got[out.request_id] = out.outputs[0].token_ids


def _abort_then_finish(llm: LLM, aborted: set[str], expected: dict[str, list[int]],
                       got: dict[str, list[int]]) -> None:  # fmt: skip
    """Aborts `aborted`, runs the rest to their end: each gets its `expected` tokens, and every
    slot comes back."""
    llm.core.finish_requests(list(aborted), FinishReason.ABORT)
    while llm.core.has_unfinished_requests():
        _step(llm, got)
    for request_id, tokens in expected.items():
        if request_id not in aborted:
            assert got[request_id] == tokens, f"request {request_id} diverged"
    assert_state_slots_free(llm)


@pytest.mark.parametrize("reuse_decoded_kv", [False, True])
def test_a_conversation_resumes_from_the_state_saved_after_its_last_full_block(
    stateful, reuse_decoded_kv
):
    """A conversation's second turn (the first's prompt, its answer and a new message) starts
    from the state saved after the first prompt's last full block, and gives the tokens and
    log-probabilities it gets without the cache (`assert_same_outputs`): the answer, computed as
    decodes, is computed again as prompt rows. With `reuse_decoded_kv` it starts from the state
    saved as the answer ended a block: the same tokens, log-probabilities to float32 rounding (a
    decode attends in another order than a prompt chunk). The hits are exactly the blocks up to
    the state it resumes from."""
    folder, prompts, _, _ = stateful
    firsts = [prompts[1], prompts[6]]
    plain = LLM(str(folder), dtype="float32", enable_prefix_caching=False)
    llm = LLM(str(folder), dtype="float32", max_num_seqs=16, reuse_decoded_kv=reuse_decoded_kv)
    kv = llm.core.kv_cache_manager
    first = greedy_outputs(llm, firsts, 21)
    assert_same_outputs(first, greedy_outputs(plain, firsts, 21))
    assert kv.prefix_stats.hits == 0
    # a step starts after every 16th computed token (a prompt's chunk ends at its last full
    # block for it): a state is saved at each, up to the last token the first turn computed
    # (up to its prompt's last full block, unless decoded blocks serve others)
    last = [len(prompt) + (21 - 1 if reuse_decoded_kv else 0) for prompt in firsts]
    saved = [p for prompt_end in last for p in range(16, prompt_end + 1, 16)]
    assert len(kv.snapshots) == len(saved) and kv.snapshots.num_evicted == 0
    seconds = [prompt + out[0] + [7, 8, 9] for prompt, out in zip(firsts, first, strict=True)]
    got, want = greedy_outputs(llm, seconds, 9), greedy_outputs(plain, seconds, 9)
    if reuse_decoded_kv:
        assert [g[0] for g in got] == [w[0] for w in want]
        for (_, g), (_, w) in zip(got, want, strict=True):
            torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=0, atol=1e-5)
        assert kv.prefix_stats.hits == sum((len(p) + 21 - 2) // 16 * 16 for p in firsts)
    else:
        assert_same_outputs(got, want)
        assert kv.prefix_stats.hits == sum(len(p) // 16 * 16 for p in firsts)
    assert_state_slots_free(llm)


def test_requests_sharing_a_system_prompt_resume_where_it_ends(stateful):
    """A system prompt shared by requests, each prompt computed in one chunk: the first saves a
    state only after its own last full block, where no other request's prompt goes; the second
    finds the first's blocks up to where their prompts part, but no state there, so it ends a
    chunk there and saves one; every later request resumes from it. Tokens and
    log-probabilities as without the cache."""
    folder, prompts, _, _ = stateful
    system = prompts[-1][:40]  # two full blocks of 16, then 8 tokens of a third
    asked = [system + prompts[i] for i in (8, 9, 10, 11)]
    assert len({p[32:48] for p in map(tuple, asked)}) == 4  # (parted within the third block)
    plain = LLM(str(folder), dtype="float32", enable_prefix_caching=False)
    llm = LLM(str(folder), dtype="float32")
    kv = llm.core.kv_cache_manager
    got = greedy_outputs(llm, asked[:1], 6) + greedy_outputs(llm, asked[1:2], 6)
    assert kv.prefix_stats.hits == 0  # (the second saved the state after the shared blocks)
    got += greedy_outputs(llm, asked[2:], 6)
    assert kv.prefix_stats.hits == 2 * 32
    assert_same_outputs(got, greedy_outputs(plain, asked, 6))
    assert_state_slots_free(llm)


def test_saved_states_serve_hits_under_preemption_and_few_rows(stateful):
    """Requests sharing prefixes in a pool that preempts, with 3 seats (so 3 saved states,
    the least recently used given up): every token and log-probability as without the cache."""
    folder, prompts, _, _ = stateful
    shared = [prompts[5][:20] + p for p in prompts[:8]] + [prompts[5]] * 3
    knobs = {"dtype": "float32", "kv_block_size": 4, "num_kv_blocks": 32, "max_num_seqs": 3,
             "max_num_batched_tokens": 32}  # fmt: skip
    want = greedy_outputs(LLM(str(folder), **knobs, enable_prefix_caching=False), shared, 12)
    llm = LLM(str(folder), **knobs)
    assert_same_outputs(greedy_outputs(llm, shared, 12), want)
    assert_same_outputs(greedy_outputs(llm, shared, 12), want)  # (from saved states too)
    kv = llm.core.kv_cache_manager
    assert kv.prefix_stats.hits > 0 and kv.snapshots.num_evicted > 0
    assert llm.core.scheduler.num_preemptions > 0
    assert_state_slots_free(llm)


@pytest.mark.parametrize("saved", [0, 1, 40])
def test_the_number_of_saved_states_is_a_knob(stateful, saved):
    """`num_saved_states` rows of saved states (0: such a model takes no hits at all, for none
    could resume): a conversation's second turn gives the uncached tokens and log-probabilities
    whatever the number, and hits the first prompt's full blocks where a state is kept."""
    folder, prompts, _, _ = stateful
    firsts = [prompts[1], prompts[6]]
    plain = LLM(str(folder), dtype="float32", enable_prefix_caching=False)
    llm = LLM(str(folder), dtype="float32", num_saved_states=saved)
    assert llm.core.runner.conv_state.num_snapshots == saved
    first = greedy_outputs(llm, firsts, 21)
    seconds = [prompt + out[0] + [7, 8, 9] for prompt, out in zip(firsts, first, strict=True)]
    assert_same_outputs(greedy_outputs(llm, seconds, 9), greedy_outputs(plain, seconds, 9))
    hits = llm.core.kv_cache_manager.prefix_stats.hits
    if saved == 0:
        assert hits == 0 and llm.core.kv_cache_manager.pool.num_cached_blocks == 0
    elif saved == 1:  # (the second first turn's states pushed out the first's)
        assert hits == len(firsts[1]) // 16 * 16
    else:
        assert hits == sum(len(p) // 16 * 16 for p in firsts)
    assert_state_slots_free(llm)


@CPU_ONLY
def test_two_ranks_resume_from_their_shares_of_a_saved_state(stateful):
    """Split over ranks, each saves and restores its share of the states in the rows rank 0's
    core chose (`ConvState.mirror_step_copies`): a conversation's second turn gives one rank's
    tokens from the same hits."""
    folder, prompts, _, _ = stateful
    firsts = [prompts[1], prompts[6]]
    turns = []
    for ranks in (1, 2):
        llm = LLM(str(folder), dtype="float32", max_num_seqs=4, tensor_parallel_size=ranks)
        first = greedy_tokens(llm, firsts, [21, 21])
        seconds = [p + out + [7, 8, 9] for p, out in zip(firsts, first, strict=True)]
        turns.append((first, greedy_tokens(llm, seconds, [9, 9]),
                      llm.core.kv_cache_manager.prefix_stats.hits))  # fmt: skip
        if ranks == 2:
            assert llm.core.runner.conv_state.num_snapshots == 4
            llm.core.workers.close()
    assert turns[0] == turns[1] and turns[0][2] == sum(len(p) // 16 * 16 for p in firsts)


SWAPPING = {"dtype": "float32", "kv_block_size": 4, "num_kv_blocks": 40,
            "max_num_batched_tokens": 96, "preemption_mode": "swap"}  # fmt: skip


def test_swapped_requests_resume_from_their_stashed_state(stateful):
    """Preempted by swapping, a request's KV goes to swap space and its state to host memory
    (`ConvState.swap_out`), charged to the swap space; it resumes from both, where it left off,
    with transformers' tokens."""
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), **SWAPPING)
    kv = llm.core.kv_cache_manager
    assert kv.swap_state_blocks >= 1
    assert greedy_tokens(llm, prompts, max_tokens) == expected
    scheduler = llm.core.scheduler
    assert scheduler.num_swaps > 0 and scheduler.num_swaps == scheduler.num_preemptions
    assert_state_slots_free(llm)


def test_a_request_aborted_while_swapped_out_drops_its_state(stateful):
    """Requests that end while swapped out give back their swap blocks and their stashed
    states; the others resume with their own tokens."""
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), **SWAPPING)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    got: dict[str, list[int]] = {}
    kv = llm.core.kv_cache_manager
    while not kv.swapped:  # (a step's runner stashes what its core swapped out)
        _step(llm, got)
    aborted = set(kv.swapped)
    assert llm.core.runner.conv_state.num_stashed == len(aborted) >= 1
    _abort_then_finish(llm, aborted, dict(zip(ids, expected, strict=True)), got)


@CPU_ONLY
def test_two_ranks_swap_their_shares_of_a_state(stateful):
    """Split over ranks, each stashes its share of a swapped request's state from the row rank
    0 names, and restores it into the row the request resumes in: transformers' tokens."""
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), **SWAPPING, tensor_parallel_size=2)
    try:
        assert greedy_tokens(llm, prompts, max_tokens) == expected
        assert llm.core.scheduler.num_swaps > 0
        assert_state_slots_free(llm)
    finally:
        llm.core.workers.close()


@pytest.mark.parametrize("knobs", [
    {},
    {"attention_backend": "torch"},  # (the layers' PyTorch ops)
    {"kv_block_size": 4, "num_kv_blocks": 40, "max_num_batched_tokens": 96},  # recompute
    SWAPPING,
    pytest.param({"tensor_parallel_size": 2}, marks=CPU_ONLY),
])  # fmt: skip
def test_speculating_requests_resume_from_the_state_after_their_last_kept_draft(
    stateful, monkeypatch, knobs
):
    """Drafts that are right for 0 to k tokens, then wrong (forced: the answer's next tokens,
    spoiled from a point that moves), verified in steps beside other requests: each request's
    state after a step is the one after its last kept draft (`ConvState.keep_drafts`, on every
    rank), so every request gets transformers' tokens, through preemption and swaps too."""
    from inflight.core.speculation import Speculation

    folder, prompts, max_tokens, expected = stateful
    answers = {tuple(p): e for p, e in zip(prompts, expected, strict=True)}
    proposed = {"drafts": 0, "all right": 0, "some wrong": 0}

    def drafts(self, request, limit):
        answer = answers[tuple(request.prompt_token_ids)]
        n = len(request.output_token_ids)
        true = answer[n : n + min(self.k, limit)]
        right = (7 * n + len(answer)) % (len(true) + 1)
        proposed["drafts"] += len(true)
        proposed["all right" if right == len(true) else "some wrong"] += bool(true)
        return true[:right] + [t - 1 if t else 1 for t in true[right:]]

    monkeypatch.setattr(Speculation, "propose", drafts)
    llm = LLM(str(folder), **{"dtype": "float32", **knobs}, num_speculative_tokens=3)
    try:
        assert greedy_tokens(llm, prompts, max_tokens) == expected
        assert proposed["drafts"] > 100 and proposed["all right"] > 10
        assert proposed["some wrong"] > 10
        if "num_kv_blocks" in knobs:
            assert llm.core.scheduler.num_preemptions > 0
        assert_state_slots_free(llm)
    finally:
        if llm.core.workers is not None:
            llm.core.workers.close()


def test_a_draft_model_drafts_for_a_state_carrying_target(stateful, tiny_llama, monkeypatch):
    """A draft model that attends in every layer writes the drafts (every step: the cost rule
    held off); the target's state follows what it keeps, so its tokens are transformers'."""
    from inflight.core.speculation import StepCostFit

    monkeypatch.setattr(StepCostFit, "break_even_rate", lambda self: 0.0)
    folder, prompts, max_tokens, expected = stateful
    llm = LLM(str(folder), dtype="float32", speculative_model=str(tiny_llama),
              num_speculative_tokens=2)  # fmt: skip
    assert greedy_tokens(llm, prompts, max_tokens) == expected
    assert llm.core.scheduler.speculation.stats.drafted > 100
    assert_state_slots_free(llm)


def test_a_draft_model_that_carries_state_is_refused(stateful, tiny_llama):
    """The drafter keeps KV alone: a state-carrying draft model is refused, naming why."""
    folder, *_ = stateful
    with pytest.raises(ConfigError, match="carries a state"):
        LLM(str(tiny_llama), dtype="float32", speculative_model=str(folder),
            num_speculative_tokens=2)  # fmt: skip
