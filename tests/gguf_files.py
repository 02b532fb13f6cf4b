"""Tiny models written as llama.cpp-style GGUF files, for the loading and kernel tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

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
    file_type = "ALL_F32" if qtype == GGMLQuantizationType.F32 else f"MOSTLY_{qtype.name}"
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
        if array.ndim == 2 and qtype != GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name(name), array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
