"""GGUF loading: dequantization of every supported type, Q/K un-permutation, and a whole tiny
model written as a quantized GGUF (with tokenizer metadata) matching transformers' own GGUF load.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType
from gguf.quants import dequantize, quantize

from inflight import LLM, SamplingParams
from inflight.model import gguf_loader
from inflight.model.arch import LlamaArchConfig
from inflight.model.gguf_loader import (
    gguf_arch_config,
    iter_gguf_weights,
    read_gguf_index,
    unpermute_qk,
)
from tests.parity import hf_greedy, random_prompts

Q = GGMLQuantizationType
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1)
RAW_ONLY = (Q.Q4_K, Q.Q6_K)  # the gguf package dequantizes these but cannot quantize them

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows (written from its documented behaviour)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(hf: str) -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, layer, rest = hf.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_TO_GGUF[part]}.{kind}"


def write_tiny_gguf(hf_folder: Path, out: Path, qtype: GGMLQuantizationType) -> Path:
    """Writes the tiny HF Llama in `hf_folder` as a llama.cpp-style GGUF, 2D weights in `qtype`."""
    from safetensors.torch import load_file

    cfg = json.loads((hf_folder / "config.json").read_text())
    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["id"] for t in tok["added_tokens"]}
    for t in tok["added_tokens"]:
        vocab[t["id"]] = (t["content"], t["id"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]

    w = GGUFWriter(out, "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_vocab_size(cfg["vocab_size"])
    file_type = "ALL_F32" if qtype == Q.F32 else f"MOSTLY_{qtype.name}"
    w.add_file_type(int(LlamaFileType[file_type]))  # what llama.cpp's converter writes
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if i in specials else 1 for i in range(len(vocab))])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    for name, tensor in load_file(hf_folder / "model.safetensors").items():
        array = tensor.float().numpy()
        if name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, cfg["num_key_value_heads"])
        if array.ndim == 2 and qtype != Q.F32:
            w.add_tensor(gguf_name(name), quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(name), array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(8 * 4 * 3, dtype=np.float32).reshape(8 * 4, 3)
    for heads in (1, 2, 4):
        assert np.array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)
        assert not np.array_equal(llama_cpp_permute(w, heads), w)


@pytest.mark.parametrize("qtype", QUANTIZABLE + RAW_ONLY, ids=lambda q: q.name)
def test_every_supported_type_dequantizes_like_the_gguf_package(tmp_path, qtype):
    rows, cols = 4, 256
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype in RAW_ONLY:
        rng = np.random.default_rng(0)
        raw = rng.integers(0, 256, size=(rows, cols // block * type_size), dtype=np.uint8)
        # keep the f16 super-block scales finite: set their high bytes to small exponents
        raw[:, 1::type_size] &= 0x3B
    else:
        raw = quantize(np.random.default_rng(0).standard_normal((rows, cols), np.float32), qtype)
    path = tmp_path / "t.gguf"
    w = GGUFWriter(path, "llama")
    w.add_tensor("token_embd.weight", raw, raw_dtype=qtype if qtype != Q.F32 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    reader = GGUFReader(path)
    arch = LlamaArchConfig("qwen2", 1, cols, 1, 1, 1, 1, 1, 1e-5, 1.0, 1, True)
    ((name, tensor),) = list(iter_gguf_weights(reader, arch, path))
    expected = dequantize(reader.tensors[0].data, qtype).reshape(rows, cols)
    assert name == "model.embed_tokens.weight" and tensor.shape == (rows, cols)
    np.testing.assert_array_equal(tensor.numpy(), expected)
    assert np.isfinite(expected).all()


@pytest.mark.parametrize("qtype", (Q.F32, Q.Q8_0, Q.Q4_1), ids=lambda q: q.name)
def test_quantized_tiny_gguf_matches_transformers_loading_the_same_file(
    tmp_path, tiny_llama, qtype
):
    from transformers import AutoModelForCausalLM

    path = write_tiny_gguf(tiny_llama, tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    reference = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))

    llm = LLM(str(path), dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    # the tokenizer came from GGUF metadata and round-trips text
    text = "The quick brown fox"
    assert llm.tokenizer.decode(llm.tokenizer(text).input_ids) == text


def test_a_second_load_maps_the_tensors_from_the_cached_index(tmp_path, tiny_llama, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path / "cache"))
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", Q.Q4_1)
    reader = GGUFReader(path)
    want_arch = gguf_arch_config(reader, path)
    want = dict(iter_gguf_weights(reader, want_arch, path))

    first = read_gguf_index(path)  # parses the file and writes the index
    (saved,) = (tmp_path / "cache" / "gguf-index").iterdir()
    monkeypatch.setattr(gguf_loader, "open_gguf", lambda p: pytest.fail("parsed again"))
    second = read_gguf_index(path)
    for index in (first, second):
        assert index.arch == want_arch
        got = dict(iter_gguf_weights(index, index.arch, path))
        assert list(got) == list(want)
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), name

    saved.write_text("{not json")  # a damaged index is parsed again, not trusted
    monkeypatch.setattr(gguf_loader, "open_gguf", GGUFReader)
    assert read_gguf_index(path).arch == want_arch
    assert json.loads(saved.read_text())["arch"]["num_layers"] == want_arch.num_layers
