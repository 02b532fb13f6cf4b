from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from inflight.engine.detokenizer import IncrementalDetokenizer
from inflight.sampling_params import SamplingParams

TEXT = " Émigré café 🚀🙂 and the quick brown fox"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def stream(tokenizer, text: str, params: SamplingParams, prompt: str = "Hello"):
    detok = IncrementalDetokenizer(tokenizer, tokenizer(prompt).input_ids, params)
    deltas = []
    for token_id in tokenizer(text).input_ids:
        stop = detok.add_tokens([token_id])
        deltas.append(detok.take_delta(finished=stop is not None))
        if stop is not None:
            break
    deltas.append(detok.take_delta(finished=True))
    return deltas, detok


def test_partial_utf8_is_held_back_and_text_is_exact(tokenizer):
    ids = tokenizer(TEXT).input_ids
    assert len(ids) > len(TEXT.split())  # multi-byte characters span several tokens
    deltas, _ = stream(tokenizer, TEXT, SamplingParams())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT


def test_stop_string_cuts_output_and_is_never_streamed(tokenizer):
    deltas, detok = stream(tokenizer, TEXT, SamplingParams(stop=["quick", "zzz"]))
    assert detok.stop_string == "quick"
    assert "".join(deltas) == " Émigré café 🚀🙂 and the "
    assert not any("qu" in d for d in deltas)  # the held-back prefix of the stop never leaked


def test_stop_string_can_be_kept(tokenizer):
    params = SamplingParams(stop=["café"], include_stop_str_in_output=True)
    deltas, _ = stream(tokenizer, TEXT, params)
    assert "".join(deltas) == " Émigré café"


def test_earliest_stop_string_wins(tokenizer):
    deltas, detok = stream(tokenizer, TEXT, SamplingParams(stop=["fox", "🙂"]))
    assert detok.stop_string == "🙂" and "".join(deltas) == " Émigré café 🚀"


def test_tokens_past_a_stop_string_in_one_call_are_not_consumed(tokenizer):
    """A step of kept speculative drafts brings several tokens at once: those after the one
    that completes the stop string are left out (`num_consumed`)."""
    ids = tokenizer(TEXT).input_ids
    one_at_a_time = stream(tokenizer, TEXT, SamplingParams(stop=["quick"]))[1]
    detok = IncrementalDetokenizer(tokenizer, tokenizer("Hello").input_ids,
                                   SamplingParams(stop=["quick"]))  # fmt: skip
    assert detok.add_tokens(ids) == "quick"
    assert detok.num_consumed < len(ids)
    assert detok.ids == one_at_a_time.ids  # the same tokens as fed one by one up to the stop
    assert detok.take_delta(finished=True) == " Émigré café 🚀🙂 and the "
