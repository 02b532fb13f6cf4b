"""The parity prompts: 10 raw texts and 6 chat questions, 7 to ~350 tokens on SmolLM2. The
integration tests check token-for-token parity with transformers on them, and
`inflight bench agreement` measures how far an inexact knob moves greedy output on them."""

from __future__ import annotations

from typing import Any

PARAGRAPH = (
    "Static batching wastes the accelerator: a batch waits for its longest request, and padding "
    "eats the rest. Continuous batching schedules at the level of iterations instead, so that "
    "finished sequences leave at once and waiting requests take their place. "
)

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "Hello",
    PARAGRAPH + "In one sentence, the main idea is",
    PARAGRAPH * 3 + "Summary:",
    PARAGRAPH * 6 + "The key benefit is",
]
CHAT_PROMPTS = [
    "What is the tallest mountain on Earth?",
    "Write a haiku about autumn leaves.",
    "Explain what a KV cache is in two sentences.",
    "List three fruits that are red.",
    "Translate 'good morning' into French.",
    "What is 12 times 11?",
]


def parity_prompts(tokenizer: Any) -> list[list[int]]:
    """The 16 prompts as token ids: the raw ones as they are, the chat ones through the model's
    chat template with the assistant's turn opened (as raw text for a model without one: a
    base model's)."""
    prompts = [tokenizer(p).input_ids for p in RAW_PROMPTS]
    if not tokenizer.chat_template:
        return prompts + [tokenizer(q).input_ids for q in CHAT_PROMPTS]
    for question in CHAT_PROMPTS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    return prompts
