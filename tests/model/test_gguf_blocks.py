"""GGUF block formats beyond the legacy three (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4): `gguf_blocks`
dequantizes every format to gguf's values bit for bit; `gguf_int_linear` with 16-bit x is the
exact product of those weights with x rounded per block of 32, for every format, row count and
a fused weight's mixed packing, rows independent of their batch; a Q4_K_M-style file loads with
every linear kept as its blocks and answers as its dequantized twin does."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from inflight import LLM, SamplingParams
from inflight.kernels import load_extension
from inflight.model.block_embedding import BlockEmbedding
from inflight.model.gguf_blocks import (
    BY_NAME,
    FORMATS,
    dequantize,
    mixed_packing,
    regroup_blocks,
    regrouped_rows,
    regrouped_shape,
)
from inflight.model.loader import estimated_weight_bytes
from inflight.model.packed_linear import PackedLinear, block_formats, blocks_serve_every_batch
from tests.gguf_files import k_quant_mix, quantize_any, write_tiny_gguf
from tests.model.test_gguf_int_linear import (
    assert_exact_over_rounded_x,
    assert_rows_do_not_depend_on_their_batch,
)

Q = GGMLQuantizationType
ALL = [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]
NEW = [Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4]
ext = load_extension()
needs_kernel = pytest.mark.skipif(not ext.gguf_int_linear_available(),
                                  reason="no AVX2 8-column layout here")  # fmt: skip


def blocks_of(n: int, k: int, qtype: GGMLQuantizationType, seed: int = 0) -> torch.Tensor:
    """[n, k / block weights, block bytes] blocks of random weights of varied magnitudes."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2, (n, 1))).astype(np.float32)
    raw = quantize_any(values, qtype)
    block_weights, block_bytes = GGML_QUANT_SIZES[qtype]
    return torch.from_numpy(np.ascontiguousarray(raw)).view(n, k // block_weights, block_bytes)


def random_bytes(n: int, k: int, qtype: GGMLQuantizationType, seed: int = 0) -> torch.Tensor:
    """Blocks of random bytes (every quant and scale bit pattern), finite fp16 scales (MXFP4:
    exponents of weights between 2^-16 and 2^7)."""
    rng = np.random.default_rng(seed)
    block_weights, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block_weights, block_bytes), dtype=np.uint8)
    if qtype == Q.MXFP4:
        raw[..., 0] = rng.integers(112, 132, raw.shape[:2], dtype=np.uint8)
        return torch.from_numpy(raw)
    halves = [208] if qtype == Q.Q6_K else ([0, 2] if qtype in (Q.Q4_1, Q.Q5_1, Q.Q4_K, Q.Q5_K)
                                            else [0])  # fmt: skip
    for at in halves:
        scale = (rng.standard_normal(raw.shape[:2]) * 0.01).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return torch.from_numpy(raw)


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_dequantize_is_gguf_bit_for_bit(qtype):
    for blocks in (blocks_of(12, 512, qtype), random_bytes(12, 512, qtype, seed=1)):
        want = np.asarray(gguf_dequantize(blocks.numpy().reshape(12, -1), qtype), np.float32)
        got = dequantize(blocks).numpy()
        assert got.shape == (12, 512)
        assert np.array_equal(got.view(np.uint32), want.reshape(12, 512).view(np.uint32))
    fmt = FORMATS[GGML_QUANT_SIZES[qtype][1]]  # the kernels' layout keeps the file's bytes
    assert regroup_blocks(blocks).shape == (2, blocks.shape[1], 8 * fmt.file_bytes)


def test_mxfp4_scales_are_powers_of_two_to_the_subnormals_and_the_largest():
    """Every exponent byte, 0 and 1 (subnormal scales) and 255 (2^127) among them."""
    raw = random_bytes(256, 32, Q.MXFP4)
    raw[:, 0, 0] = torch.arange(256, dtype=torch.uint8)
    want = np.asarray(gguf_dequantize(raw.numpy().reshape(256, -1), Q.MXFP4), np.float32)
    got = dequantize(raw).numpy()
    assert np.array_equal(got.view(np.uint32), want.reshape(256, 32).view(np.uint32))
    scales = dequantize(torch.tensor([[[e] + [0x11] * 16] for e in (0, 1, 2, 128, 255)],
                                     dtype=torch.uint8))[:, 0]  # fmt: skip
    assert scales.tolist() == [2.0**-128, 2.0**-127, 2.0**-126, 1.0, 2.0**127]


@needs_kernel
@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_regrouping_into_given_memory_overwrites_what_it_held(qtype):
    """The loader hands the layout fresh pages; whatever they hold, every byte is written."""
    blocks = random_bytes(13, 512, qtype)  # 13 columns: the last group has 3 zero columns
    want = regroup_blocks(blocks)
    out = torch.full(regrouped_shape(blocks), 0xA5, dtype=torch.uint8)
    assert regroup_blocks(blocks, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out, want)
    with pytest.raises(ValueError, match="out: contiguous uint8"):
        regroup_blocks(blocks, out=torch.empty(want.shape[0] + 1, *want.shape[1:],
                                               dtype=torch.uint8))  # fmt: skip


@needs_kernel
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("qtype", NEW, ids=lambda q: q.name)
@pytest.mark.parametrize(("n", "k"), [(103, 512), (8, 256), (19, 768)])
def test_kernel_is_the_exact_product_with_x_rounded_per_block(qtype, n, k, bits):
    for blocks in (blocks_of(n, k, qtype, seed=n), random_bytes(n, k, qtype, seed=k)):
        weight = dequantize(blocks)
        packed = regroup_blocks(blocks)
        bias = torch.randn(n)
        for rows in (1, 2, 3, 4, 5, 8, 19, 70):  # every tile height, the unpacked path, panels
            x = torch.randn(rows, k) * torch.rand(rows, k // 32).repeat_interleave(32, dim=1)
            x[0, :32] = 0.0
            got = ext.gguf_int_linear(x, packed, None, n, bits)
            assert_exact_over_rounded_x(got, x, weight, bits)
            got = ext.gguf_int_linear(x, packed, bias, n, bits)
            assert_exact_over_rounded_x(got, x, weight, bits, bias)


@needs_kernel
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("qtype", NEW, ids=lambda q: q.name)
def test_rows_do_not_depend_on_their_batch(qtype, bits):
    packed = regroup_blocks(random_bytes(61, 512, qtype))
    assert_rows_do_not_depend_on_their_batch(packed, 61, 512, bits)


@needs_kernel
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q6_K], ids=lambda q: q.name)
def test_a_batch_past_a_panel_of_wide_rows_is_exact_and_gives_each_row_its_bits(qtype, bits):
    """Batch paths go over x's rows in panels sized to stay in L2 (64 rows, or 1 MiB of 8-bit
    rows: 128 at 8,192 inputs): rows on both sides of a panel's end, and in the last partial
    panel, match the exact product and their own value alone (the layout this CPU reads x of
    `bits` bits over: 16 columns for Q4_1 with 16 bits on AVX-512 VNNI)."""
    n, k = 19, 8192
    blocks = blocks_of(n, k, qtype, seed=3)
    packed = regroup_blocks(blocks, ext.gguf_int_linear_columns(bits) if qtype == Q.Q4_1 else 8)
    x = torch.randn(140, k)
    batched = ext.gguf_int_linear(x, packed, None, n, bits)
    assert_exact_over_rounded_x(batched, x, dequantize(blocks), bits)
    for r in (0, 63, 64, 127, 128, 139):
        assert torch.equal(ext.gguf_int_linear(x[r : r + 1], packed, None, n, bits)[0], batched[r])


TILE_CHECK = """
import sys, torch
from inflight.kernels import load_extension
ext = load_extension()
assert ext.gguf_int_linear_tile_rows() == 0, "INFLIGHT_NO_AMX is set"
cases = torch.load(sys.argv[1])
torch.save([ext.gguf_int_linear(x, packed, None, n, 8) for x, packed, n in cases], sys.argv[2])
"""


@pytest.mark.skipif(ext.gguf_int_linear_tile_rows() == 0, reason="no AMX tiles here")
def test_amx_tiles_give_the_vector_paths_bits(tmp_path):
    """Every row of 8-bit batches on AMX tiles (all formats; partial row tiles, pairs and
    passes; panels of x's rows over a wide weight) equals the vector path's, which a process
    with INFLIGHT_NO_AMX set takes."""
    rows = ext.gguf_int_linear_tile_rows()
    cases = [(torch.randn(m, k), regroup_blocks(random_bytes(n, k, q, seed=m)), n)
             for q in ALL for n, k, m in ((103, 512, 70), (19, 768, rows))]  # fmt: skip
    cases.append((torch.randn(70, 16384), regroup_blocks(random_bytes(8, 16384, Q.Q4_K)), 8))
    torch.save(cases, tmp_path / "cases.pt")
    env = {**os.environ, "INFLIGHT_NO_AMX": "1"}
    subprocess.run([sys.executable, "-c", TILE_CHECK, tmp_path / "cases.pt", tmp_path / "out.pt"],
                   env=env, check=True)  # fmt: skip
    for (x, packed, n), vector in zip(cases, torch.load(tmp_path / "out.pt"), strict=True):
        assert torch.equal(ext.gguf_int_linear(x, packed, None, n, 8), vector)


@pytest.mark.parametrize("qtype", NEW, ids=lambda q: q.name)
def test_rows_dequantized_in_cpp_are_gguf_bit_for_bit(qtype):
    """`gguf_dequantize_rows` (a K-quant token embedding's lookup): the rows asked for, repeats
    and all, the Python dequantization's bits (gguf's); rows out of range and the legacy
    formats (whose embeddings read their LM head's layout) refused."""
    for blocks in (blocks_of(40, 512, qtype), random_bytes(40, 512, qtype, seed=2)):
        ids = torch.tensor([0, 39, 7, 7, 12])
        got = ext.gguf_dequantize_rows(blocks, ids)
        want = dequantize(blocks[ids]).reshape(5, 512)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert ext.gguf_dequantize_rows(blocks, torch.tensor([], dtype=torch.long)).shape == (0, 512)
    for bad in (40, -1, 2**63 - 1):
        with pytest.raises(RuntimeError, match="of 40"):
            ext.gguf_dequantize_rows(blocks, torch.tensor([1, bad]))
    with pytest.raises(RuntimeError, match="none of"):
        ext.gguf_dequantize_rows(random_bytes(8, 64, Q.Q8_0), torch.tensor([0]))


@needs_kernel
def test_a_mixed_packing_is_its_segments_side_by_side():
    parts = [random_bytes(24, 512, Q.Q4_K), random_bytes(13, 512, Q.Q6_K, 1),
             random_bytes(16, 512, Q.Q8_0, 2)]  # fmt: skip
    packed = mixed_packing(parts)
    bias = torch.randn(53)
    for rows, bits in ((1, 16), (9, 16), (33, 16), (5, 8), (33, 8)):
        x = torch.randn(rows, 512)
        alone, at = [], 0
        for p in parts:
            n = p.shape[0]
            alone.append(ext.gguf_int_linear(x, regroup_blocks(p), bias[at : at + n], n, bits))
            at += n
        assert torch.equal(ext.gguf_int_linear(x, packed, bias, 53, bits), torch.cat(alone, 1))
    x = torch.randn(2, 512)
    with pytest.raises(RuntimeError, match="does not match the mixed packing's 53 columns"):
        ext.gguf_int_linear(x, packed, None, 54, 16)
    with pytest.raises(RuntimeError, match="runs past the packing"):
        ext.gguf_int_linear(x, packed[:-64], None, 53, 16)
    with pytest.raises(RuntimeError, match="truncated header"):
        ext.gguf_int_linear(x, packed[:8], None, 53, 16)
    with pytest.raises(RuntimeError, match=r"none of Q4_0 \(144\).*Q6_K \(1680\)"):
        ext.gguf_int_linear(x, parts[1], None, 13, 16)  # the file's layout, not the kernel's


@needs_kernel
@pytest.mark.parametrize("bits", [8, 16])
def test_many_linears_in_one_call_give_each_ones_bits(bits):
    """`gguf_int_linear_many` (a decode token's experts: small products sharing one parallel
    region) gives each product gguf_int_linear's bits: a row alone, rows of each tile height,
    a batch that takes the unpacked or tile-unit path beside them, formats mixed (in one
    packing too), a partial last group of columns, a legacy format in the 16-column layout,
    and no rows at all."""
    legacy = regroup_blocks(random_bytes(40, 256, Q.Q4_0, 5), ext.gguf_int_linear_columns(bits))
    packed = [regroup_blocks(random_bytes(103, 512, Q.Q4_K)),
              regroup_blocks(random_bytes(64, 256, Q.Q6_K, 1)),
              mixed_packing([random_bytes(24, 512, Q.Q4_K, 2), random_bytes(13, 512, Q.Q6_K, 3)]),
              regroup_blocks(random_bytes(40, 512, Q.Q5_K, 4)), legacy,
              regroup_blocks(random_bytes(24, 256, Q.MXFP4, 6))]  # fmt: skip
    shapes = [(103, 512), (64, 256), (37, 512), (40, 512), (40, 256), (24, 256)]
    rows = [1, 4, 3, 70, 2, 0]
    xs = [torch.randn(m, k) for (_, k), m in zip(shapes, rows, strict=True)]
    outs = [torch.full((m, n), float("nan")) for (n, _), m in zip(shapes, rows, strict=True)]
    ext.gguf_int_linear_many(xs, packed, [n for n, _ in shapes], outs, bits)
    for x, w, (n, _), got in zip(xs, packed, shapes, outs, strict=True):
        assert torch.equal(got, ext.gguf_int_linear(x, w, None, n, bits))
    with pytest.raises(RuntimeError, match="out_features"):
        ext.gguf_int_linear_many(xs[:1], packed[:1], [112], outs[:1], bits)
    with pytest.raises(RuntimeError, match="one packing"):
        ext.gguf_int_linear_many(xs, packed[:2], [n for n, _ in shapes], outs, bits)


@needs_kernel
def test_packed_linear_takes_a_fused_weight_in_mixed_formats():
    q, v = random_bytes(16, 256, Q.Q4_K), random_bytes(8, 256, Q.Q6_K, 1)
    linear = torch.nn.Linear(256, 24, bias=False)
    linear.weight = None
    packed = PackedLinear(linear, 64, [q, v], activation_bits=16)
    assert packed.blocks_only and packed.small_weight.dim() == 1
    x = torch.randn(5, 256)
    weight = torch.cat([dequantize(q), dequantize(v)])
    with torch.inference_mode():
        assert_exact_over_rounded_x(packed(x), x, weight, 16)
    with pytest.raises(ValueError, match="do not fit a"):
        PackedLinear(linear, 64, [q, q], activation_bits=16)
    assert block_formats(torch.float32, 8) == set(BY_NAME)
    assert PackedLinear(linear, 64, [q, v], activation_bits=8).blocks_only
    # the exact kernel reads the legacy formats only: no blocks to take, no float weight either
    assert block_formats(torch.float32, 0) == {"Q4_0", "Q4_1", "Q8_0"}
    with pytest.raises(ValueError, match="without its float weight"):
        PackedLinear(linear, 64, [q, v])


@pytest.fixture(scope="module")
def k_mix_file(tiny_model_factory, tmp_path_factory):
    folder = tiny_model_factory("llama_wide")
    return write_tiny_gguf(folder, tmp_path_factory.mktemp("kmix") / "tiny-q4_k_m.gguf", None,
                           mix=k_quant_mix)  # fmt: skip


@pytest.mark.skipif(
    not blocks_serve_every_batch(torch.float32, 16),
    reason="no AVX2 8-column layout here",
)
def test_a_k_quant_file_keeps_every_weight_as_blocks_and_answers_as_its_dequantized_twin(
    k_mix_file,
):
    # 16-bit x, whose rounding keeps the exact path's values to a few thousandths (auto's 8 bits,
    # test_gguf_int_linear's, move them more)
    llm = LLM(str(k_mix_file), dtype="float32", device="cpu", quantized_activations="int16")
    model = llm.core.loaded.model
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.blocks_only and m.weight.is_meta for m in linears)
    # q and k in Q4_K beside a Q6_K v: one mixed packing
    assert {m.small_weight.dim() for m in linears} == {1, 3}
    assert model.layers[0].qkv_proj.small_weight.dim() == 1
    assert isinstance(model.embed_tokens, BlockEmbedding)
    assert model.embed_tokens.format.name == "Q5_0"
    loaded = llm.core.loaded.weight_bytes
    estimate = estimated_weight_bytes(k_mix_file, torch.float32, "auto")
    assert abs(estimate - loaded) <= 0.05 * loaded
    exact = LLM(str(k_mix_file), dtype="float32", device="cpu", quantized_activations="off")
    assert not any(getattr(m, "blocks_only", False) for m in exact.core.loaded.model.modules())
    prompts = [[5, 9, 11, 3, 17, 2, 8], [40, 41, 42], list(range(60, 100))]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    ours = llm.generate(prompts, params, use_tqdm=False)
    twin = exact.generate(prompts, params, use_tqdm=False)
    for a, b in zip(ours, twin, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert la.logprob == pytest.approx(lb.logprob, abs=5e-3)


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_a_tied_embedding_looks_its_rows_up_in_the_lm_heads_layout(qtype):
    """The 8-column layout, read back row by row, gives the file's rows bit for bit (43 rows:
    the last group padded), so the embedding needs no copy of its own: the legacy formats'
    bytes put back in order (from the 16-column layout too), the others' blocks undone in C++."""
    fmt = FORMATS[GGML_QUANT_SIZES[qtype][1]]
    blocks = random_bytes(43, 512, qtype, seed=5)
    layout = regroup_blocks(blocks)
    ids = torch.tensor([[0, 7, 8, 42], [41, 13, 13, 1]])
    want = BlockEmbedding(blocks, torch.float32)(ids)
    if fmt.legacy:
        assert torch.equal(regrouped_rows(layout, ids.flatten(), fmt.file_bytes),
                           blocks[ids.flatten()])  # fmt: skip
        wide = regroup_blocks(blocks, 16)  # (a bf16 engine's LM head's)
        assert torch.equal(regrouped_rows(wide, ids.flatten(), fmt.file_bytes, 16),
                           blocks[ids.flatten()])  # fmt: skip
        shared = BlockEmbedding.over_layout(wide, fmt, 43, torch.float32)
        assert torch.equal(shared(ids).view(torch.int32), want.view(torch.int32))
        with pytest.raises(ValueError, match="not the 8- or 16-column layout of 50 rows"):
            BlockEmbedding.over_layout(wide, fmt, 50, torch.float32)
    shared = BlockEmbedding.over_layout(layout, fmt, 43, torch.float32)
    assert torch.equal(shared(ids).view(torch.int32), want.view(torch.int32))
    with pytest.raises(ValueError, match="not the 8- or 16-column layout of 50 rows"):
        BlockEmbedding.over_layout(layout, fmt, 50, torch.float32)
    if not fmt.legacy:
        for bad in (43, -1, 2**63 - 1):  # the padded group's columns are no rows either
            with pytest.raises(RuntimeError, match="of 43"):
                ext.gguf_dequantize_layout_rows(layout, torch.tensor([bad]), 43)


def test_a_layout_lookup_refuses_a_legacy_or_misshapen_layout():
    legacy = regroup_blocks(random_bytes(16, 64, Q.Q8_0))
    with pytest.raises(RuntimeError, match="5-bit, K-quant or MXFP4"):
        ext.gguf_dequantize_layout_rows(legacy, torch.tensor([0]), 16)
    layout = regroup_blocks(random_bytes(16, 256, Q.Q4_K))
    for rows in (17, 8, 0, -1, 2**63 - 1):
        with pytest.raises(RuntimeError, match="ceil"):
            ext.gguf_dequantize_layout_rows(layout, torch.tensor([0]), rows)


@pytest.mark.skipif(not blocks_serve_every_batch(torch.float32, 16),
                    reason="no AVX2 8-column layout here")  # fmt: skip
def test_a_tied_k_quant_model_holds_its_vocabulary_once(tmp_path, tiny_model_factory):
    """As llama.cpp writes a tied Q4_K_M model: a Q6_K embedding, which is the LM head too."""
    path = write_tiny_gguf(tiny_model_factory("llama_wide_tied"), tmp_path / "tied.gguf", None,
                           mix=lambda name: Q.Q6_K if name.startswith("token_embd")
                           else k_quant_mix(name))  # fmt: skip
    llm = LLM(str(path), dtype="float32", device="cpu")
    model = llm.core.loaded.model
    assert model.cfg.tie_word_embeddings and model.embed_tokens.regrouped
    assert model.embed_tokens.format.name == "Q6_K"
    assert model.embed_tokens.blocks.data_ptr() == model.lm_head.small_weight.data_ptr()
    loaded = llm.core.loaded.weight_bytes
    assert abs(estimated_weight_bytes(path, torch.float32, "auto") - loaded) <= 0.05 * loaded
    exact = LLM(str(path), dtype="float32", device="cpu", quantized_activations="off")
    ids = torch.tensor([0, 5, 399, 17, 5])
    assert torch.equal(model.embed_tokens(ids), exact.core.loaded.model.embed_tokens(ids))


@pytest.mark.skipif(not blocks_serve_every_batch(torch.bfloat16, 16),
                    reason="no 16-column layout (AVX-512 VNNI)")  # fmt: skip
@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0])
def test_a_bf16_engine_holds_a_legacy_files_weights_as_their_blocks_alone(
    tmp_path, tiny_model_factory, qtype
):
    """No bf16 copy beside the blocks (nor one built and dropped at load): every row through
    the 16-column layout, the memory the estimate said, the embedding's rows the exact path's."""
    path = write_tiny_gguf(tiny_model_factory("qwen3"), tmp_path / "m.gguf", qtype)
    llm = LLM(str(path), dtype="bfloat16", device="cpu")
    loaded = llm.core.loaded
    linears = [m for m in loaded.model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.blocks_only and m.weight.is_meta for m in linears)
    assert {m.small_kernel for m in linears} == {"gguf-int16"}
    model = loaded.model  # the vocabulary held once: the LM head's 16-column layout
    assert model.cfg.tie_word_embeddings and model.embed_tokens.regrouped
    assert model.embed_tokens.blocks.data_ptr() == model.lm_head.small_weight.data_ptr()
    estimate = estimated_weight_bytes(path, torch.bfloat16, "auto")
    assert abs(estimate - loaded.weight_bytes) <= 0.05 * loaded.weight_bytes
    exact = LLM(str(path), dtype="bfloat16", device="cpu", quantized_activations="off")
    assert loaded.weight_bytes < 0.6 * exact.core.loaded.weight_bytes  # (Q8_0: 34 bytes a 32)
    ids = torch.tensor([0, 5, 399, 17])
    assert torch.equal(loaded.model.embed_tokens(ids), exact.core.loaded.model.embed_tokens(ids))


@pytest.mark.skipif(not blocks_serve_every_batch(torch.float32, 16),
                    reason="no AVX2 8-column layout here")  # fmt: skip
def test_a_tied_q8_0_model_holds_its_vocabulary_once(tmp_path, tiny_model_factory):
    path = write_tiny_gguf(tiny_model_factory("qwen3"), tmp_path / "tied.gguf",
                           GGMLQuantizationType.Q8_0)  # fmt: skip
    llm = LLM(str(path), dtype="float32", device="cpu")
    model = llm.core.loaded.model
    assert model.cfg.tie_word_embeddings and model.embed_tokens.regrouped
    assert model.embed_tokens.blocks.data_ptr() == model.lm_head.small_weight.data_ptr()
    loaded = llm.core.loaded.weight_bytes
    assert abs(estimated_weight_bytes(path, torch.float32, "auto") - loaded) <= 0.05 * loaded
    exact = LLM(str(path), dtype="float32", device="cpu", quantized_activations="off")
    # the exact path dequantizes the embedding at load: the same values
    assert not getattr(exact.core.loaded.model.embed_tokens, "regrouped", False)
    ids = torch.tensor([0, 5, 399, 17])
    assert torch.equal(model.embed_tokens(ids), exact.core.loaded.model.embed_tokens(ids))
