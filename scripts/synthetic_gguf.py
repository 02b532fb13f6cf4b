"""Writes a GGUF file in the shapes of a real Llama model, with random weights and SmolLM2's
tokenizer (from the default model's file), for memory and speed benchmarks at sizes no package
ships. Weights are N(0, 0.02), norms 1: the text is noise, the shapes, bytes and kernels real.

    .venv/bin/python scripts/synthetic_gguf.py llama-3.2-3b --type Q4_0 --out /tmp/llama3b-q4_0.gguf

`--type` is any type the `gguf` package quantizes (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1);
for the K-quant mixes (Q4_K_M, Q5_K_M, Q6_K) write F16 and convert it with llama.cpp's
`llama-quantize` (built beside `llama-server`, see docs/benchmarks.md):
`llama-quantize in-f16.gguf out-q4_k_m.gguf Q4_K_M`. Tensors are generated and quantized one at
a time and written as they come, so memory stays near one tensor's size whatever the model's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType
from gguf.quants import quantize
from tqdm import tqdm

from inflight.model.loader import default_model_path

# (layers, hidden, intermediate, heads, kv heads, rope theta, context) of the real models
SHAPES = {
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 500000.0, 131072),
    "llama-3.2-3b": (28, 3072, 8192, 24, 8, 500000.0, 131072),
    "llama-3.1-8b": (32, 4096, 14336, 32, 8, 500000.0, 131072),
}
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                  "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                  "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")  # fmt: skip


def tensors(layers: int, hidden: int, inter: int, heads: int, kv_heads: int, vocab: int):
    """(GGUF name, shape in numpy order) of every tensor, llama.cpp's names."""
    head_dim = hidden // heads
    yield "token_embd.weight", (vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (hidden,)
        yield b + "attn_q.weight", (heads * head_dim, hidden)
        yield b + "attn_k.weight", (kv_heads * head_dim, hidden)
        yield b + "attn_v.weight", (kv_heads * head_dim, hidden)
        yield b + "attn_output.weight", (hidden, heads * head_dim)
        yield b + "ffn_norm.weight", (hidden,)
        yield b + "ffn_gate.weight", (inter, hidden)
        yield b + "ffn_up.weight", (inter, hidden)
        yield b + "ffn_down.weight", (hidden, inter)
    yield "output_norm.weight", (hidden,)
    yield "output.weight", (vocab, hidden)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=list(SHAPES))
    parser.add_argument("--type", default="F16", help="F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    qtype = GGMLQuantizationType[args.type]
    layers, hidden, inter, heads, kv_heads, theta, context = SHAPES[args.shape]
    source = GGUFReader(default_model_path())
    vocab = len(source.fields["tokenizer.ggml.tokens"].contents())

    w = GGUFWriter(args.out, "llama")
    w.add_name(f"synthetic {args.shape}")
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(vocab)
    w.add_file_type(int(LlamaFileType[f"MOSTLY_{qtype.name}"]))
    for key in TOKENIZER_KEYS:  # SmolLM2's tokenizer, as its GGUF holds it
        field = source.fields.get(key)
        if field is not None:
            w.add_key_value(key, field.contents(), field.types[0],
                            field.types[-1] if len(field.types) > 1 else None)  # fmt: skip
    rng = np.random.default_rng(args.seed)
    specs = list(tensors(layers, hidden, inter, heads, kv_heads, vocab))
    for name, shape in specs:  # headers first: the writer streams the data afterwards
        if len(shape) == 1:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            size = quantize(np.zeros((1, shape[1]), np.float32), qtype).nbytes * shape[0]
            # (a dtype other than uint8: the shape given is then the values', not the bytes')
            w.add_tensor_info(name, shape, np.dtype(np.float32), size, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, shape in tqdm(specs, desc=f"writing {args.out.name}", unit="tensor"):
        if len(shape) == 1:
            w.write_tensor_data(np.ones(shape, np.float32))
            continue
        rows = []
        for start in range(0, shape[0], 4096):  # a slice at a time: float32 stays small
            n = min(4096, shape[0] - start)
            values = rng.standard_normal((n, shape[1]), dtype=np.float32) * np.float32(0.02)
            rows.append(quantize(values, qtype))
        w.write_tensor_data(np.concatenate(rows))
    w.close()
    print(f"{args.out}: {args.out.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1:])
