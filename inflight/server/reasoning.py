"""A model's thinking apart from its answer: models that reason in a `<think>...</think>` block
(Qwen3, DeepSeek-R1's distillations, SmolLM3) have it returned as `reasoning_content` beside
`content`, as vLLM's reasoning parsers return it (OpenAI's clients keep the extra field).

The block may open in the output (Qwen3) or at the end of the prompt (templates that force
thinking, DeepSeek-R1's): `opened` says the output starts inside it. An output that is not in a
block is all content (Qwen3 with `enable_thinking: false`, whose template closes an empty block
in the prompt). Streamed, the split is recomputed over the whole text so far, holding back what
may still be the start of a tag, so each part only ever grows.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from inflight.server.tool_parsers import partial_tag_start

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_PARSERS = ("think", "none")


def choose(template: str) -> str:
    """`think` where the model's chat template (`tool_parsers.template_text`) knows the block,
    else `none`."""
    return "think" if THINK_CLOSE in template else "none"


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt ends inside a think block (its output starts there)."""
    return prompt.rstrip().endswith(THINK_OPEN)


def split_reasoning(text: str, opened: bool, final: bool) -> tuple[str, str]:
    """(reasoning, content) of the output so far."""
    body = text
    if not opened:
        stripped = text.lstrip()
        if stripped.startswith(THINK_OPEN):
            body = stripped[len(THINK_OPEN) :]
        elif not final and THINK_OPEN.startswith(stripped):  # (empty, or the tag half written)
            return "", ""
        else:
            return "", text  # no block: an answer
    end = body.find(THINK_CLOSE)
    if end >= 0:
        return body[:end], body[end + len(THINK_CLOSE) :].lstrip()
    if final:  # cut off while thinking
        return body, ""
    return body[: partial_tag_start(body, THINK_CLOSE)], ""


def reasoning_tokens(tokenizer: PreTrainedTokenizerBase, token_ids: list[int], opened: bool) -> int:
    """How many of an output's tokens its think block spans (its tags included): the shortest
    prefix whose text holds the closing tag, all of them where the block never closes, none
    where the output holds no block (usage's `reasoning_tokens`)."""

    def text(n: int) -> str:
        return tokenizer.decode(token_ids[:n], skip_special_tokens=False)

    whole = text(len(token_ids))
    if not opened and not whole.lstrip().startswith(THINK_OPEN):
        return 0
    if THINK_CLOSE not in whole:
        return len(token_ids)
    close = tokenizer.convert_tokens_to_ids(THINK_CLOSE)  # one token in Qwen3's, SmolLM3's, ...
    if isinstance(close, int) and close != tokenizer.unk_token_id and close in token_ids:
        return token_ids.index(close) + 1
    lo, hi = 1, len(token_ids)  # the shortest prefix holding the tag lies in (lo - 1, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if THINK_CLOSE in text(mid) else (mid + 1, hi)
    return hi


@dataclass
class ReasoningStream:
    """One choice's streamed split: fed the cumulative text, returns what is new of each part,
    and the content so far (what tool-call parsing reads)."""

    opened: bool
    _reasoning_sent: int = 0
    _content_sent: int = 0

    def feed(self, text: str, final: bool) -> tuple[str, str, str]:
        """(new reasoning, new content, all content so far)."""
        reasoning, content = split_reasoning(text, self.opened, final)
        new_reasoning = reasoning[self._reasoning_sent :]
        new_content = content[self._content_sent :]
        self._reasoning_sent, self._content_sent = len(reasoning), len(content)
        return new_reasoning, new_content, content
