"""Helpers for token-for-token parity against Hugging Face transformers (greedy, float32)."""

from __future__ import annotations

import random

import torch

PROMPT_LENGTHS = (1, 3, 7, 12, 17, 25, 31, 40, 48, 55, 63, 70, 81, 90, 100, 120)


def random_prompts(vocab_size: int, lengths=PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


def mixed_max_tokens(n: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(8, 24) for _ in range(n)]


@torch.inference_mode()
def hf_greedy(model, prompts: list[list[int]], max_new_tokens: list[int]) -> list[list[int]]:
    """One prompt at a time, so no padding can disturb the reference; never stops at EOS."""
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt, n in zip(prompts, max_new_tokens, strict=True):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            pad_token_id=0,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs
