"""GGUF loading: dequantization of every supported type, Q/K un-permutation, and a whole tiny
model written as a quantized GGUF (with tokenizer metadata) matching transformers' own GGUF load.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from inflight import LLM, SamplingParams
from inflight.bench.peers import load_hf_gguf
from inflight.model import gguf_loader
from inflight.model.arch import LlamaArchConfig
from inflight.model.gguf_header import read_gguf_header
from inflight.model.gguf_loader import (
    gguf_arch_config,
    iter_gguf_weights,
    read_gguf_index,
    unpermute_qk,
)
from tests.gguf_files import llama_cpp_permute, tiny_gguf_engine, write_tiny_gguf
from tests.parity import hf_greedy, random_prompts

Q = GGMLQuantizationType
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1)
RAW_ONLY = (Q.Q4_K, Q.Q6_K)  # the gguf package dequantizes these but cannot quantize them


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
    path = write_tiny_gguf(tiny_llama, tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    reference = load_hf_gguf(path.parent, path.name, dtype=torch.float32).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))

    # the exact path: a random model's logits have near-ties (3e-4 apart) that 16-bit activations
    # may flip; how far those move real models' tokens is the parity and agreement tests' job
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    # the tokenizer came from GGUF metadata and round-trips text
    text = "The quick brown fox"
    assert llm.tokenizer.decode(llm.tokenizer(text).input_ids) == text


@pytest.mark.parametrize("qtype", (Q.F32, Q.Q8_0), ids=lambda q: q.name)
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "gemma2", "gemma3"])
def test_other_families_ggufs_generate_as_transformers_loading_the_same_file(
    tmp_path, tiny_model_factory, arch, qtype
):
    """Qwen2's GGUF (q/k/v biases, rows not permuted), Qwen3's (per-head q/k norms), Phi-3's
    (fused attn_qkv, ffn_up holding gate and up, a sliding window), Gemma 2's (soft caps, every
    other layer global) and Gemma 3's (norms stored as 1 + w, four a layer, every sixth layer
    global) against transformers loading that file, and the same tokens as from the HF folder
    it came from where the file says all the folder does."""
    folder = tiny_model_factory(arch)
    path = write_tiny_gguf(folder, tmp_path / f"tiny-{arch}-{qtype.name}.gguf", qtype)
    said = {}
    if arch == "gemma2":  # transformers' GGUF reader leaves out Gemma 2's soft caps (taking
        # its defaults, 50 and 30) and assumes a score scale of 256: said as the file says them
        said = {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                "query_pre_attn_scalar": 32}  # fmt: skip
    reference = load_hf_gguf(path.parent, path.name, dtype=torch.float32, **said).eval()
    if arch == "phi3":  # transformers' GGUF reader drops phi3.attention.sliding_window; the
        # model (and llama.cpp) attend within it, as the HF folder's config says
        reference.config.sliding_window = 24
    if arch == "gemma3":  # a Gemma 3 GGUF holds no query_pre_attn_scalar: llama.cpp scales by
        # head_dim (but on the 27B), transformers assumes 256 (every real size's head_dim)
        for layer in reference.model.layers:
            layer.self_attn.scaling = reference.config.head_dim**-0.5
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch_config = llm.core.arch
    assert arch_config.architecture == arch
    on_cpu = llm.core.device.type == "cpu"  # the C++ layer loop is a CPU's
    if arch == "qwen3" and on_cpu:  # the C++ layer loop runs its q and k norms, one per layer
        qk_norms = llm.core.loaded.model.fused_layers.qk_norms
        assert len(qk_norms) == 2 * arch_config.num_layers
        assert all(w.shape == (128,) for w in qk_norms)
    elif arch not in ("qwen2", "qwen3"):
        assert arch_config.sliding_window == 24
    if arch == "gemma3":
        assert arch_config.full_attention_layers == (5,)
        assert (arch_config.local_rope_theta, arch_config.query_pre_attn_scalar) == (1e4, 32)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    if qtype == Q.F32 and not arch.startswith("gemma"):  # the very weights of the folder (the
        # tiny Gemmas' score scale is not their head_dim's, which their GGUF cannot say)
        from_folder = LLM(str(folder), dtype="float32").generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in from_folder] == expected


def _greedy(llm: LLM, prompts: list[list[int]], n: int = 12) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def _experts_from_blocks(llm: LLM) -> bool:
    """Whether every expert's linears multiply from the file's blocks, with no float copy."""
    from inflight.model.packed_linear import PackedLinear

    experts = [m for layer in llm.core.loaded.model.layers for m in layer.experts.modules()
               if isinstance(m, PackedLinear)]  # fmt: skip
    return bool(experts) and all(m.blocks_only for m in experts)


@pytest.mark.parametrize("qtype", (Q.F32, Q.Q8_0), ids=lambda q: q.name)
def test_a_qwen3_moe_gguf_generates_as_transformers_loading_the_same_file(
    tmp_path, tiny_model_factory, qtype
):
    """llama.cpp stores a layer's experts as one stacked tensor per projection
    (`ffn_gate_exps` ...) and their router as `ffn_gate_inp`: the index reads one expert at a
    time, whose linears multiply from its blocks where the kernels read them. The same greedy
    tokens as transformers' load of the file, exact and over the blocks with 16-bit x (the
    default but where AMX tiles take 8-bit x, which moves a random model's near-ties)."""
    from inflight.model.packed_linear import blocks_serve_every_batch

    path = write_tiny_gguf(tiny_model_factory("qwen3_moe_sparse"), tmp_path / "moe.gguf", qtype)
    # transformers' GGUF reader leaves out qwen3moe.expert_feed_forward_length (its experts
    # would be the default 768 wide): said here as the file says it
    reference = load_hf_gguf(
        path.parent, path.name, dtype=torch.float32, moe_intermediate_size=32
    ).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))
    for knob in ("off", "int16"):
        llm = LLM(str(path), dtype="float32", quantized_activations=knob)
        arch = llm.core.arch
        assert (arch.architecture, arch.num_experts, arch.experts_per_token) == ("qwen3_moe", 4, 2)
        assert (arch.expert_intermediate_size, arch.dense_layers, arch.norm_topk_prob) == (
            32, (), True
        )  # fmt: skip
        assert _greedy(llm, prompts) == expected
        blocks = knob == "int16" and qtype != Q.F32 and blocks_serve_every_batch(torch.float32, 16)
        assert _experts_from_blocks(llm) == blocks


def test_experts_routed_in_passes_of_a_few_tokens_give_the_same_bits(
    tmp_path, tiny_model_factory, monkeypatch
):
    """A step's tokens go through the host-routed experts a pass at a time (bounding the
    gathered rows a long prompt holds): over the blocks, a prompt's logprobs are the same bits
    in passes of 3 tokens as in one pass."""
    from inflight.model import moe
    from inflight.model.packed_linear import blocks_serve_every_batch

    if not blocks_serve_every_batch(torch.float32, 16):
        pytest.skip("no AVX2 integer kernels here")
    path = write_tiny_gguf(tiny_model_factory("qwen3_moe_sparse"), tmp_path / "moe.gguf", Q.Q8_0)
    prompts = random_prompts(200, lengths=(30, 64))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=1)

    def run() -> list:
        llm = LLM(str(path), dtype="float32")
        assert _experts_from_blocks(llm)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].token_ids, o.prompt_logprobs) for o in outputs]

    one_pass = run()
    monkeypatch.setattr(moe, "EXPERT_PASS_TOKENS", 3)
    assert run() == one_pass


def test_a_mixtral_gguf_generates_as_its_hf_folder(tmp_path, tiny_model_factory):
    """Mixtral's GGUF is a `llama` file with experts (Q/K rows permuted as llama's are): in F32
    the same greedy tokens as transformers on the HF folder it came from (without the folder's
    sliding window, which a llama file cannot say); in Q8_0 the same over the blocks (16-bit x)
    as exact."""
    from transformers import AutoModelForCausalLM

    folder = tiny_model_factory("mixtral")
    reference = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, sliding_window=None
    ).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))
    path = write_tiny_gguf(folder, tmp_path / "mixtral-f32.gguf", Q.F32)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.num_experts, arch.experts_per_token) == ("mixtral", 4, 2)
    assert (arch.expert_intermediate_size, arch.sliding_window) == (32, None)
    assert _greedy(llm, prompts) == expected
    path = write_tiny_gguf(folder, tmp_path / "mixtral-q8_0.gguf", Q.Q8_0)
    exact = _greedy(LLM(str(path), dtype="float32", quantized_activations="off"), prompts)
    llm = LLM(str(path), dtype="float32", quantized_activations="int16")
    assert _greedy(llm, prompts) == exact


def test_a_gpt_oss_gguf_with_mxfp4_experts_generates_as_its_hf_folder(tmp_path, tiny_model_factory):
    """gpt-oss as llama.cpp's converter writes it (`gpt-oss`: gate and up stacks split from the
    interleaved checkpoint, biases stacked beside them, the sinks as `attn_sinks`, YaRN and the
    window in metadata, every other layer global): in F32 the same greedy tokens as
    transformers on the HF folder it came from, once the folder says what llama.cpp fixes (the
    SwiGLU limit of 7, YaRN's whole-dimension ramp); with its experts in MXFP4 (the published
    file's format) the experts multiply from their blocks, and the same tokens as the exact path
    over the same file."""
    import shutil

    from transformers import AutoModelForCausalLM

    from inflight.model.packed_linear import blocks_serve_every_batch

    folder = tmp_path / "hf"
    shutil.copytree(tiny_model_factory("gpt_oss"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["swiglu_limit"] = 7.0
    config["rope_parameters"]["truncate"] = True
    (folder / "config.json").write_text(json.dumps(config))
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = random_prompts(reference.config.vocab_size, lengths=(2, 9, 30, 64, 100))
    expected = hf_greedy(reference, prompts, [12] * len(prompts))
    path = write_tiny_gguf(folder, tmp_path / "gpt-oss-f32.gguf", Q.F32)
    llm = LLM(str(path), dtype="float32", quantized_activations="off")
    arch = llm.core.arch
    assert (arch.architecture, arch.num_experts, arch.experts_per_token) == ("gpt_oss", 4, 2)
    assert arch.attention_sinks and arch.qkv_bias and arch.o_bias and arch.swiglu_limit == 7.0
    assert (arch.sliding_window, arch.full_attention_layers) == (24, (1,))
    assert arch.rope_scaling_dict["rope_type"] == "yarn" and arch.rope_scaling_dict["truncate"]
    assert _greedy(llm, prompts) == expected

    def mxfp4_experts(name: str) -> GGMLQuantizationType:
        return Q.MXFP4 if "_exps" in name else Q.Q8_0

    path = write_tiny_gguf(folder, tmp_path / "gpt-oss-mxfp4.gguf", None, mix=mxfp4_experts)
    exact = _greedy(LLM(str(path), dtype="float32", quantized_activations="off"), prompts)
    llm = LLM(str(path), dtype="float32")
    blocks = blocks_serve_every_batch(torch.float32, 16)
    assert _experts_from_blocks(llm) == blocks
    # (over blocks: the float32 router and the fused C++ loop, sinks and biases in it)
    assert (llm.core.loaded.model.fused_layers is not None) == blocks
    assert _greedy(llm, prompts) == exact


def test_a_llama3_rope_gguf_generates_as_its_hf_folder(tmp_path, tiny_model_factory):
    """A Llama 3.x GGUF carries its RoPE scaling as `rope_freqs` (a divisor per frequency), not
    as config: the same tokens as the HF folder, which the parity tests hold to transformers;
    and again from the cached index (the factors survive its JSON)."""
    folder = tiny_model_factory("llama3_rope")
    path = write_tiny_gguf(folder, tmp_path / "tiny-llama3.gguf", Q.F32)
    prompts = random_prompts(400, lengths=(2, 9, 30, 64, 100))  # past the 64 "original" positions
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = [
        o.outputs[0].token_ids
        for o in LLM(str(folder), dtype="float32").generate(prompts, params, use_tqdm=False)
    ]
    for _ in range(2):  # read, then cached
        llm = LLM(str(path), dtype="float32", quantized_activations="off")
        assert llm.core.arch.rope_freq_factors is not None
        assert llm.core.arch.rope_scaling is None  # the factors stand for it
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == want


def test_a_second_load_maps_the_tensors_from_the_cached_index(tmp_path, tiny_llama, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE", str(tmp_path / "cache"))
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", Q.Q4_1)
    reader = GGUFReader(path)
    want_arch = gguf_arch_config(read_gguf_header(path), path)
    want = dict(iter_gguf_weights(reader, want_arch, path))

    first = read_gguf_index(path)  # parses the file and writes the index
    (saved,) = (tmp_path / "cache" / "gguf-index").iterdir()
    monkeypatch.setattr(gguf_loader, "read_gguf_header", lambda p: pytest.fail("parsed again"))
    second = read_gguf_index(path)
    for index in (first, second):
        assert index.arch == want_arch
        got = dict(iter_gguf_weights(index, index.arch, path))
        assert list(got) == list(want)
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), name

    saved.write_text("{not json")  # a damaged index is parsed again, not trusted
    monkeypatch.setattr(gguf_loader, "read_gguf_header", read_gguf_header)
    assert read_gguf_index(path).arch == want_arch
    assert json.loads(saved.read_text())["arch"]["num_layers"] == want_arch.num_layers


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_an_embedding_kept_as_blocks_looks_up_gguf_dequantized_rows(tmp_path, tiny_llama, qtype):
    from inflight.model.block_embedding import BlockEmbedding
    from inflight.model.gguf_blocks import dequantize as dequantize_rows
    from inflight.model.packed_linear import blocks_serve_every_batch

    rng = np.random.default_rng(3)
    values = (rng.standard_normal((40, 64)) * rng.uniform(0.01, 3, (40, 1))).astype(np.float32)
    raw = quantize(values, qtype)
    want = dequantize(raw, qtype)
    blocks = torch.from_numpy(raw.reshape(40, 2, -1).copy())
    assert torch.equal(dequantize_rows(blocks).reshape(40, 64), torch.from_numpy(want))
    embedding = BlockEmbedding(blocks, torch.float32)
    ids = torch.tensor([[3, 39], [0, 3]])
    assert torch.equal(embedding(ids), torch.from_numpy(want)[ids])
    with pytest.raises(ValueError, match="GGUF blocks of a known format"):
        BlockEmbedding(blocks[..., :15], torch.float32)  # no format is 15 bytes
    if not blocks_serve_every_batch(torch.float32, 16):
        return
    # a model whose linears run from their blocks holds no float copy of its vocabulary either
    path = write_tiny_gguf(tiny_llama, tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    llm = LLM(str(path), dtype="float32")
    model = llm.core.loaded.model
    assert isinstance(model.embed_tokens, BlockEmbedding) and model.lm_head.weight.is_meta
    exact = LLM(str(path), dtype="float32", quantized_activations="off").core.loaded.model
    ids = torch.arange(model.cfg.vocab_size)
    assert torch.equal(model.embed_tokens(ids), exact.embed_tokens(ids))
    vocab_rows = model.cfg.vocab_size * model.cfg.hidden_size
    assert all(p.numel() < vocab_rows for p in model.parameters())  # no float copy left


@pytest.mark.parametrize("qtype", (Q.F32, Q.Q8_0), ids=lambda q: q.name)
def test_a_gemma_gguf_generates_as_transformers_with_its_weights(tmp_path, tiny_model_factory,
                                                                  qtype):  # fmt: skip
    """Gemma's GGUF (`gemma`: its norms stored as the 1 + w applied, under Llama's names, Q/K
    rows as they are) against transformers with the file's weights."""
    from tests.parity import assert_gguf_generates_as_its_weights

    folder = tiny_model_factory("gemma")
    llm = tiny_gguf_engine(folder, tmp_path / "gemma.gguf", qtype)
    assert (llm.core.arch.architecture, llm.core.arch.sliding_window) == ("gemma", None)
    assert_gguf_generates_as_its_weights(llm, folder, qtype)
