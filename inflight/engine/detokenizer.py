"""Incremental detokenization with hold-back for partial UTF-8 and for stop strings.

Text is decoded over a sliding window of token ids (a few prompt tokens give context for
leading spaces). A delta whose decoding ends in U+FFFD is an incomplete UTF-8 sequence: it is
held back until the next token completes it. With stop strings, the last `longest stop - 1`
characters are held back too, since they may be the start of a stop string; a found stop string
(and everything after it) is cut, unless `include_stop_str_in_output`.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase

from inflight.sampling_params import SamplingParams

# Prompt tokens decoded before the output so a first output token's leading space survives.
CONTEXT_TOKENS = 5


def decoder_of(tokenizer: PreTrainedTokenizerBase) -> Callable[..., str]:
    """The fast tokenizer's own (Rust) `decode` where transformers' would return the same text
    (no clean-up of spaces): its Python wrapper costs more than the decoding itself, and runs
    twice per token of every running request, every step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tokenizer.decode
    return backend.decode


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.ids = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all output text decoded so far (after any stop-string cut)
        self.sent = 0  # characters of `text` already handed out
        self.stop_string: str | None = None
        self.num_consumed = 0  # of the tokens given to the last `add_tokens`
        self.hold = max((len(s) for s in params.stop), default=1) - 1
        self._decode_ids = decoder_of(tokenizer)

    def _decode(self, ids: list[int]) -> str:
        return self._decode_ids(ids, skip_special_tokens=self.params.skip_special_tokens)

    def add_tokens(self, token_ids: list[int]) -> str | None:
        """Consumes new tokens up to the one that completes a stop string (`num_consumed` of
        them: a step of kept speculative drafts may bring tokens past it); returns the stop
        string if one now ends the output."""
        self.num_consumed = 0
        for token_id in token_ids:
            if self.stop_string is not None:
                break
            self.num_consumed += 1
            self.ids.append(token_id)
            prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
            full = self._decode(self.ids[self.prefix_offset :])
            if len(full) <= len(prefix) or full.endswith("\ufffd"):
                continue
            searched_from = max(0, len(self.text) - self.hold)
            self.text += full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self._find_stop(searched_from)
        return self.stop_string

    def _find_stop(self, start: int) -> None:
        best: tuple[int, str] | None = None
        for stop in self.params.stop:
            i = self.text.find(stop, start)
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is not None:
            i, stop = best
            self.text = self.text[: i + len(stop) if self.params.include_stop_str_in_output else i]
            self.stop_string = stop

    def take_delta(self, finished: bool) -> str:
        """The text not yet handed out, minus what must still be held back unless finished."""
        end = (
            len(self.text)
            if finished or self.stop_string
            else max(self.sent, len(self.text) - self.hold)
        )
        delta = self.text[self.sent : end]
        self.sent = end
        return delta
