"""The GGUF default model exported as an HF folder (what the vLLM peer loads) is the same model:
inflight generates the same greedy tokens from the folder as from the GGUF file."""

from __future__ import annotations

import pytest

from inflight import LLM, SamplingParams
from inflight.bench import peers
from inflight.bench.vllm_peer import export_hf_folder

pytestmark = pytest.mark.slow


def test_exported_folder_generates_like_the_gguf(default_model, hf_default_model, loaded_float32,
                                                 tmp_path, monkeypatch):  # fmt: skip
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path))
    loads = []

    def load_hf_model(path, dtype):  # the session's copy of what this would load again
        loads.append((path, dtype))
        return hf_default_model

    monkeypatch.setattr(peers, "load_hf_model", load_hf_model)
    folder = export_hf_folder(default_model, "float32")
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    assert export_hf_folder(default_model, "float32") == folder  # cached
    assert loads == [(default_model, "float32")]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    # the folder has no GGUF blocks, so it runs the exact float32 path: compare like with like
    gguf = LLM(str(default_model), dtype="float32", quantized_activations="off",
               loaded_model=loaded_float32("off"))  # fmt: skip
    from_gguf = gguf.generate(prompts, params)
    from_folder = LLM(str(folder), dtype="float32").generate(prompts, params)
    assert [o.outputs[0].token_ids for o in from_folder] == [
        o.outputs[0].token_ids for o in from_gguf
    ]
