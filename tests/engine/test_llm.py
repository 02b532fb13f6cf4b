"""The offline API on a tiny model: bad input, chat, stop strings, n, seeds, metrics."""

from __future__ import annotations

import re
from pathlib import Path

import numpy
import pytest

from inflight import LLM, ConfigError, InvalidRequestError, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)


@pytest.mark.parametrize(
    ("make", "param", "message"),
    [
        (lambda: SamplingParams(temperature=-0.1), "temperature", r"must be in \[0, 100\]"),
        (lambda: SamplingParams(temperature=float("nan")), "temperature", "must be finite"),
        (lambda: SamplingParams(top_p=0), "top_p", r"top_p must be in \(0, 1\]"),
        (lambda: SamplingParams(top_p=1.5), "top_p", r"top_p must be in \(0, 1\]"),
        (lambda: SamplingParams(top_p=1e-46), "top_p", "not a normal float32"),
        (lambda: SamplingParams(top_k=2**63), "top_k", "must be in"),
        (lambda: SamplingParams(top_k=-2), "top_k", "must be in"),
        (lambda: SamplingParams(repetition_penalty=5e-324), "repetition_penalty", "must be in"),
        (
            lambda: SamplingParams(repetition_penalty=float("inf")),
            "repetition_penalty",
            "must be finite",
        ),
        (lambda: SamplingParams(max_tokens=0), "max_tokens", r"must be in \[1, "),
        (lambda: SamplingParams(n=0), "n", r"n must be in \[1, "),
        (lambda: SamplingParams(n=1.5), "n", "must be an integer"),
        (lambda: SamplingParams(n=2**31), "n", r"n must be in \[1, 4096\], got 2147483648"),
        (lambda: SamplingParams(seed=2**64), "seed", "must be in"),
        (lambda: SamplingParams(seed=-(2**63) - 1), "seed", "must be in"),
        (
            lambda: SamplingParams(seed=2**64 - 1, n=2),
            "seed",
            "n - 1 must be at most 18446744073709551615",
        ),
        (lambda: SamplingParams(logprobs=21), "logprobs", r"logprobs must be in \[0, 20\]"),
        (lambda: SamplingParams(stop=[""]), "stop", "stop must not contain empty strings"),
        (lambda: SamplingParams(stop=["\ud800"]), "stop", "lone surrogate"),
        (lambda: SamplingParams(logit_bias={5: 1e9}), "logit_bias", r"in \[-100, 100\]"),
        (lambda: SamplingParams(logit_bias={5: float("nan")}), "logit_bias", "finite"),
        (lambda: SamplingParams(ignore_eos="yes"), "ignore_eos", "must be a boolean"),
    ],
)
def test_invalid_sampling_params(make, param, message):
    with pytest.raises(InvalidRequestError, match=message) as info:
        make()
    assert info.value.param == param


def test_bad_prompts_are_rejected_before_the_core(llm):
    ok = SamplingParams(max_tokens=4)
    with pytest.raises(InvalidRequestError, match="prompt must not be empty"):
        llm.generate([""], ok)
    with pytest.raises(InvalidRequestError, match="prompt must not be empty"):
        llm.generate([[]], ok)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate([[1, 10**6]], ok)
    with pytest.raises(
        InvalidRequestError,
        match=r"maximum context length is 128 tokens, but 130 were requested "
        r"\(10 in the prompt, 120 for max_tokens\)",
    ):
        llm.generate([[5] * 10], SamplingParams(max_tokens=120))
    # A bad prompt in a list leaves nothing half-submitted, and the engine keeps serving.
    with pytest.raises(InvalidRequestError):
        llm.generate([[5, 6], ""], ok)
    assert not llm.core.has_unfinished_requests()
    (out,) = llm.generate([[5, 6]], ok, use_tqdm=False)
    assert len(out.outputs[0].token_ids) >= 1


def test_unknown_and_invalid_knobs(tiny_llama):
    with pytest.raises(ConfigError, match="unknown knob 'max_num_seq'"):
        LLM(str(tiny_llama), max_num_seq=4)
    with pytest.raises(ConfigError, match="max_num_seqs must be >= 1"):
        LLM(str(tiny_llama), max_num_seqs=0)
    with pytest.raises(ConfigError, match="batching must be"):
        LLM(str(tiny_llama), batching="dynamic")
    with pytest.raises(ConfigError, match="kv_admission must be on-demand or reserve"):
        LLM(str(tiny_llama), kv_admission="guaranteed")
    with pytest.raises(ConfigError, match="fewer than max_model_len=512"):
        LLM(str(tiny_llama), max_model_len=512, num_kv_blocks=4)


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("max_num_seqs", 2.5, "max_num_seqs must be an integer, got 2.5"),
        ("max_num_seqs", True, "max_num_seqs must be an integer, got True"),
        ("kv_block_size", float("nan"), "kv_block_size must be an integer, got nan"),
        ("kv_cache_memory_bytes", float("inf"), "kv_cache_memory_bytes must be an integer"),
        ("num_kv_blocks", "64", "num_kv_blocks must be an integer, got '64'"),
        ("seed", 1.5, "seed must be an integer"),
        ("seed", 2**64, "seed must be in [-9223372036854775808, 18446744073709551615], got 184"),
        ("num_speculative_tokens", 1.5, "num_speculative_tokens must be an integer"),
        ("enable_prefix_caching", "no", "enable_prefix_caching must be true or false, got 'no'"),
        ("reuse_decoded_kv", 1, "reuse_decoded_kv must be true or false, got 1"),
        ("aging_s", float("nan"), "aging_s must be a number, got nan"),
        ("slo_ttft", "1", "slo_ttft must be a number"),
        ("model", 123, "model must be a path (a model folder or GGUF file), got 123"),
        ("speculative_model", b"/tmp", "speculative_model must be a path"),
        ("tenant_weights", 5, "tenant_weights must be (tenant, positive finite weight) pairs"),
        ("tenant_weights", (("a", float("nan")),), "tenant_weights must be (tenant, positive"),
    ],
)
def test_knobs_of_the_wrong_kind_are_refused_before_loading(tiny_llama, knob, value, message):
    """A float where an integer goes would fail in torch's shapes after loading, and a flag
    given "no" would be taken as true: each is refused first, naming the knob."""
    knobs = {"model": str(tiny_llama), knob: value}
    with pytest.raises(ConfigError, match=re.escape(message)):
        LLM(**knobs)


def test_a_model_path_may_be_a_path_object(tiny_llama):
    llm = LLM(Path(tiny_llama), dtype="float32", num_kv_blocks=16)
    assert llm.core.config.model.model == str(tiny_llama)


def test_integral_floats_are_taken_as_integers(tiny_llama):
    """2e6 bytes, as Python writes it, is the integer it names (and numpy's integers are too)."""
    llm = LLM(str(tiny_llama), kv_cache_memory_bytes=2e6, max_num_seqs=numpy.int64(3))
    assert llm.core.config.cache.kv_cache_memory_bytes == 2_000_000
    assert type(llm.core.config.scheduler.max_num_seqs) is int


def test_chat_uses_the_template(llm):
    (out,) = llm.chat(
        [{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=3), use_tqdm=False
    )
    expected = llm.tokenizer(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    ).input_ids
    assert out.prompt_token_ids == expected


def test_n_samples_and_seeds(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=123, max_tokens=12, ignore_eos=True)
    (a,) = llm.generate(["The quick brown fox"], params, use_tqdm=False)
    (b,) = llm.generate(["The quick brown fox"], params, use_tqdm=False)
    assert [o.index for o in a.outputs] == [0, 1, 2]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1  # different seeds per sample
    # the same seeded request gives the same tokens whatever else is in the batch
    crowd = [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)] * 5
    outs = llm.generate(
        ["The quick brown fox"] + ["other prompt"] * 5,
        [SamplingParams(temperature=1.0, seed=123, max_tokens=12, ignore_eos=True), *crowd],
        use_tqdm=False,
    )
    assert outs[0].outputs[0].token_ids == a.outputs[0].token_ids


def test_stop_strings_end_generation(llm):
    (free,) = llm.generate(
        ["Numbers like"], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), False
    )
    text = free.outputs[0].text
    assert len(text) > 6
    stop = text[3:6]
    (stopped,) = llm.generate(
        ["Numbers like"],
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),
        use_tqdm=False,
    )
    out = stopped.outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    assert not llm.core.has_unfinished_requests()
    assert llm.core.kv_cache_manager.pool.num_used_blocks == 0


def test_outputs_carry_timings_and_logprobs(llm):
    (out,) = llm.generate(
        [[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, logprobs=2), use_tqdm=False
    )
    m = out.metrics
    assert 0 <= m.queue_time <= m.ttft <= m.e2e_latency
    completion = out.outputs[0]
    assert [lp.token_id for lp in completion.logprobs] == completion.token_ids
    assert all(lp.rank == 1 and len(lp.top) == 2 for lp in completion.logprobs)  # greedy


def test_dtype_takes_torch_dtypes_and_vllms_names_as_well_as_strings(tiny_llama):
    """`dtype=torch.float32`, `"float"` or `"half"`, as vLLM takes them; anything else is
    refused with the names it takes."""
    import torch

    from inflight.config import EngineConfig, ModelConfig

    assert ModelConfig(dtype=torch.bfloat16).dtype == "bfloat16"
    assert ModelConfig(dtype=torch.half).dtype == ModelConfig(dtype="half").dtype == "float16"
    assert ModelConfig(dtype="float").dtype == "float32"
    assert EngineConfig.from_knobs(dtype="half").model.dtype == "float16"
    llm = LLM(str(tiny_llama), dtype=torch.float32, num_kv_blocks=16)
    assert llm.core.loaded.model.norm.weight.dtype == torch.float32
    for bad in (torch.float64, torch.int8, "float64", ["float32"], None):
        with pytest.raises(ConfigError, match="dtype must be auto, bfloat16, float16 or float32"):
            ModelConfig(dtype=bad)
