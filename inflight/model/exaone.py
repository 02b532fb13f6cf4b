"""EXAONE 3.0 and 3.5 (`ExaoneForCausalLM`, GGUF `exaone`): the Llama decoder (3.5's RoPE
llama3-scaled) under GPT-2-style checkpoint names (`transformer.h.N.attn.attention.q_proj`,
`mlp.c_fc_0` ...), mapped onto Llama's at load as transformers maps them (before a rank cuts
its share, which it finds by Llama's names). A GGUF file holds Llama's names already."""

from __future__ import annotations

from inflight.model.llama import LlamaModel

# EXAONE 3's names -> Llama's, in order (`out_proj` once it is under `self_attn`)
LLAMA_NAMES = {
    r"^transformer\.wte\.": "model.embed_tokens.",
    r"^transformer\.h\.": "model.layers.",
    r"^transformer\.ln_f\.": "model.norm.",
    r"\.attn\.attention\.": ".self_attn.",
    r"\.self_attn\.out_proj\.": ".self_attn.o_proj.",
    r"\.ln_1\.": ".input_layernorm.",
    r"\.ln_2\.": ".post_attention_layernorm.",
    r"\.mlp\.c_fc_0\.": ".mlp.gate_proj.",
    r"\.mlp\.c_fc_1\.": ".mlp.up_proj.",
    r"\.mlp\.c_proj\.": ".mlp.down_proj.",
}


class ExaoneModel(LlamaModel):
    checkpoint_names = LLAMA_NAMES
