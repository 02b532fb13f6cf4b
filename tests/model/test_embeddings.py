"""Embedding models against transformers: a bare Qwen3 decoder saved as Qwen3-Embedding is
(`Qwen3Model`, no LM head, a sentence-transformers folder pooling the last token), its vectors
the final hidden state of each prompt's last token, L2-normalized, as sentence-transformers
computes them; the same folder pooling the mean; prompts split into chunks and batched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inflight import LLM
from inflight.errors import InvalidRequestError
from tests.parity import random_prompts

ST_FLAGS = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens"}


def write_embedding_model(folder: Path, tokenizer_dir: Path, pooling: str) -> Path:
    """A tiny Qwen3-Embedding-shaped folder: the bare decoder's weights and sentence-transformers'
    modules (Transformer, Pooling, Normalize)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-5,
                         initializer_range=0.2, tie_word_embeddings=False)  # fmt: skip
    Qwen3Model(config).eval().save_pretrained(folder)
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**settings, "is_matryoshka": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]))  # fmt: skip
    (folder / "1_Pooling").mkdir()
    flags = {flag: flag == ST_FLAGS[pooling] for flag in ST_FLAGS.values()}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, **flags}))  # fmt: skip
    return folder


@pytest.fixture(scope="module", params=["last", "mean"])
def embedding_model(request, tmp_path_factory, tokenizer_dir):
    folder = tmp_path_factory.mktemp(f"tiny-embedding-{request.param}")
    return request.param, write_embedding_model(folder, tokenizer_dir, request.param)


def reference_vectors(folder: Path, pooling: str, prompts: list[list[int]]) -> torch.Tensor:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    vectors = []
    with torch.inference_mode():
        for prompt in prompts:
            hidden = model(torch.tensor([prompt])).last_hidden_state[0]
            vector = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
            vectors.append(torch.nn.functional.normalize(vector, dim=0))
    return torch.stack(vectors)


def test_embeddings_are_sentence_transformers_pooling_of_transformers_states(embedding_model):
    pooling, folder = embedding_model
    prompts = random_prompts(400, lengths=(1, 9, 30, 70, 70))
    llm = LLM(str(folder), dtype="float32", prefill_chunk_size=8, max_num_batched_tokens=64,
              enable_prefix_caching=True)  # fmt: skip
    assert llm.core.arch.pooling == pooling and llm.core.arch.matryoshka
    # mean pooling reads every position: the prefix cache (twins above) is off for it
    assert llm.core.kv_cache_manager.enable_prefix_caching == (pooling == "last")
    outputs = llm.embed(prompts, use_tqdm=False)
    got = torch.tensor([o.embedding for o in outputs])
    want = reference_vectors(folder, pooling, prompts)
    assert got.shape == (len(prompts), 64)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert all(o.outputs[0].token_ids == [] for o in outputs)
    pool = llm.core.kv_cache_manager.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_an_embedding_model_generates_nothing_and_a_generative_one_embeds_nothing(
    tmp_path, tokenizer_dir, tiny_llama
):
    folder = write_embedding_model(tmp_path, tokenizer_dir, "last")
    with pytest.raises(InvalidRequestError, match="embedding model") as refused:
        LLM(str(folder), dtype="float32").generate(["hello"], use_tqdm=False)
    assert refused.value.code == "model_not_supported"
    with pytest.raises(InvalidRequestError, match="gives no embeddings"):
        LLM(str(tiny_llama), dtype="float32").embed(["hello"], use_tqdm=False)


def test_a_gguf_with_a_pooling_type_embeds_as_its_folder(tmp_path, tokenizer_dir):
    """llama.cpp's `pooling_type` (3: the last token) makes a GGUF an embedding model; its
    vectors are those of the folder it was written from (prompts as token ids: one tokenizer)."""
    from gguf import PoolingType

    from tests.gguf_files import Q, write_tiny_gguf

    folder = write_embedding_model(tmp_path / "folder", tokenizer_dir, "last")
    path = write_tiny_gguf(folder, tmp_path / "embedder.gguf", Q.F32,
                           metadata=lambda w: w.add_pooling_type(PoolingType.LAST))  # fmt: skip
    prompts = random_prompts(400, lengths=(3, 40))
    want = [o.embedding for o in LLM(str(folder), dtype="float32").embed(prompts, use_tqdm=False)]
    llm = LLM(str(path), dtype="float32")
    assert llm.core.arch.pooling == "last"
    got = [o.embedding for o in llm.embed(prompts, use_tqdm=False)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)


def test_pooling_modes_inflight_lacks_are_refused_at_load(tmp_path, tokenizer_dir):
    from inflight.errors import ModelLoadError

    folder = write_embedding_model(tmp_path, tokenizer_dir, "last")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    with pytest.raises(ModelLoadError, match="cls"):
        LLM(str(folder), dtype="float32")
