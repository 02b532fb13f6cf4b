"""The quantized-activation GGUF kernel (`kernels/csrc/gguf_int_linear.cpp`) and the
`quantized_activations` knob: with 8- and 16-bit x the kernel computes exactly the dequantized
weights times x rounded per block of 32 (float64 reference, float32 summation error only), rows
independent of their batch, every row tile and a partial last group of columns, bad inputs
refused; the knob regroups every GGUF weight of a float32 model and sends it the batch sizes
where it beats oneDNN."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from torch import nn

from inflight import LLM, SamplingParams
from inflight.bench.agreement import quantized_dtype
from inflight.errors import ConfigError
from inflight.kernels import load_extension
from inflight.model.gguf_blocks import regroup_blocks
from inflight.model.gguf_loader import KERNEL_BLOCK_TYPES
from inflight.model.loader import (
    BF16_DECODE_ROWS_MAX_SEQS,
    model_activations,
    resolve_engine_dtype,
    resolve_quantized_activations,
)
from inflight.model.packed_linear import (
    EVERY_BATCH,
    GGUF_INT_SMALL_BATCH_ROWS,
    PackedLinear,
    blocks_serve_every_batch,
    can_pack,
    decode_rows_from_blocks,
    eight_bit_tiles,
    eight_bits_are_faster,
)
from tests.gguf_files import k_quant_mix, write_tiny_gguf
from tests.model.test_gguf_linear import quantized

Q = GGMLQuantizationType
ext = load_extension()
pytestmark = pytest.mark.skipif(
    not (ext.gguf_int_linear_available() and can_pack(torch.float32, torch.device("cpu"))),
    reason="no AVX2, FMA and F16C on this CPU",
)
BITS = [8, 16]


def rounded(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded as the kernel does: per block of 32, scale max|x| / (2^(bits-1) - 1) in
    float32, x times its float32 inverse rounded half to even; as the float64 values d * q."""
    top = np.float32(2 ** (bits - 1) - 1)
    blocks = x.numpy().reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=2, keepdims=True) / top
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv)
    assert np.abs(q).max() <= top
    return torch.from_numpy((d.astype(np.float64) * q).reshape(x.shape))


def assert_exact_over_rounded_x(got, x, weight, bits, bias=None) -> None:
    x_hat = rounded(x, bits)
    exact = x_hat @ weight.double().T + (0 if bias is None else bias.double())
    # the bias is added in float32 too: its rounding scales with the bias, not with the product
    magnitude = x_hat.abs() @ weight.double().abs().T + (0 if bias is None else bias.abs())
    assert got.dtype == torch.float32 and got.shape == exact.shape
    assert bool(((got.double() - exact).abs() <= magnitude * x.shape[1] * 2.0**-24).all())


# SmolLM2's projections, widths ending on a partial group of 8 columns, and tiny ones
SHAPES = [(960, 576), (576, 1536), (103, 64), (3, 32)]
# every tile height (1-4 for 8 columns, 1-8 for 16), past one tile, and past a 64-row panel
ROWS = [1, 2, 3, 4, 5, 8, 19, 70]


def regroup(blocks: torch.Tensor, bits: int) -> torch.Tensor:
    """Blocks in the layout the kernel reads x of `bits` bits over on this CPU."""
    return regroup_blocks(blocks, ext.gguf_int_linear_columns(bits))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("qtype", KERNEL_BLOCK_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernel_is_the_exact_product_with_x_rounded_per_block(qtype, n, k, bits):
    blocks, weight = quantized(n, k, qtype, seed=n)
    packed = regroup(blocks, bits)
    columns = ext.gguf_int_linear_columns(bits)
    assert packed.shape == (-(-n // columns), k // 32, columns * blocks.shape[2])
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k) * torch.rand(rows, k // 32).repeat_interleave(32, dim=1)
        x[0, :32] = 0.0  # an all-zero block: scale 0
        got = ext.gguf_int_linear(x, packed, None, n, bits)
        assert_exact_over_rounded_x(got, x, weight, bits)
        got = ext.gguf_int_linear(x, packed, bias, n, bits)
        assert_exact_over_rounded_x(got, x, weight, bits, bias)
        # a bf16 engine's x: widened exactly, y rounded to bf16 once
        x_bf16 = x.to(torch.bfloat16)
        got = ext.gguf_int_linear(x_bf16, packed, bias, n, bits)
        assert torch.equal(
            got, ext.gguf_int_linear(x_bf16.float(), packed, bias, n, bits).bfloat16()
        )


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("qtype", KERNEL_BLOCK_TYPES, ids=lambda q: q.name)
def test_rows_do_not_depend_on_their_batch(qtype, bits):
    blocks, _ = quantized(103, 576, qtype)
    assert_rows_do_not_depend_on_their_batch(regroup(blocks, bits), 103, 576, bits)


def assert_rows_do_not_depend_on_their_batch(packed, n: int, k: int, bits: int) -> None:
    """Rows of a 70-row batch (every tile height, the unpacked path, past a panel) give the same
    bits alone and in slices."""
    x = torch.randn(70, k)
    batched = ext.gguf_int_linear(x, packed, None, n, bits)
    for r in (0, 3, 4, 18, 65, 69):
        alone = ext.gguf_int_linear(x[r : r + 1], packed, None, n, bits)
        assert torch.equal(alone[0], batched[r])
    assert torch.equal(ext.gguf_int_linear(x[5:11], packed, None, n, bits), batched[5:11])


def test_sixteen_bits_are_far_closer_to_the_exact_product_than_eight():
    blocks, weight = quantized(576, 1536, Q.Q4_1)
    x = torch.randn(4, 1536)
    exact = x.double() @ weight.double().T
    error = {bits: ((ext.gguf_int_linear(x, regroup(blocks, bits), None, 576, bits).double()
                     - exact).norm()
                    / exact.norm()).item() for bits in BITS}  # fmt: skip
    assert error[8] < 1e-2 and error[16] < error[8] / 100


def test_regrouping_moves_bytes_and_nothing_else():
    blocks, _ = quantized(13, 64, Q.Q4_1)  # 2 groups of 8 columns, the last 3 zero
    packed = regroup_blocks(blocks)
    zeros = torch.zeros(3 * 2 * 20, dtype=torch.uint8)
    assert torch.equal(packed.reshape(-1).sort().values,
                       torch.cat([blocks.reshape(-1), zeros]).sort().values)  # fmt: skip
    # group 0, block 1: 8 fp16 scales, 8 offsets, then chunk j = bytes 4j..4j+3 of each column
    g = packed[0, 1]
    assert torch.equal(g[:16].view(8, 2), blocks[:8, 1, 0:2])
    assert torch.equal(g[16:32].view(8, 2), blocks[:8, 1, 2:4])
    assert torch.equal(g[32:].view(4, 8, 4), blocks[:8, 1, 4:].reshape(8, 4, 4).transpose(0, 1))
    assert not packed[1, :, :16].view(2, 8, 2)[:, 5:].any()  # columns 13-15: zero scales


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_bad_inputs_are_refused(qtype):
    blocks, _ = quantized(64, 64, qtype)
    packed = regroup_blocks(blocks)
    x = torch.randn(2, 64)

    def run(x=x, packed=packed, bias=None, n=64, bits=8):
        return ext.gguf_int_linear(x, packed, bias, n, bits)

    assert run(x[:0]).shape == (0, 64)
    assert torch.equal(run(x.T.contiguous().T), run(x))
    with pytest.raises(RuntimeError, match=r"none of Q4_0 \(144\), Q4_1 \(160\), Q8_0 \(272\)"):
        run(packed=blocks)  # the file's layout, not the regrouped one
    with pytest.raises(RuntimeError, match="does not match the packing's 8 groups"):
        run(n=65)
    with pytest.raises(RuntimeError, match=r"x: \[rows, 64\] float32 or bfloat16"):
        run(x.to(torch.float16))
    # a bf16 engine's x: widened exactly, y rounded to bf16 once
    x_bf16 = x.to(torch.bfloat16)
    assert torch.equal(run(x_bf16), run(x_bf16.float()).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"bias: \[64\]"):
        run(bias=torch.randn(63))
    with pytest.raises(RuntimeError, match="activation_bits must be 8 or 16, got 4"):
        run(bits=4)
    poisons = (float("nan"), float("inf"), -float("inf"), 1e-40)  # 1e-40: denormal
    # x of a float32 engine and of a bf16 one (which the 16-column layout widens itself)
    for bits, dtype, poison in itertools.product(BITS, (torch.float32, torch.bfloat16), poisons):
        bad = x.clone()
        bad[0, :32] = 0.0
        bad[0, 3] = poison
        bad = bad.to(dtype)
        layout = regroup(blocks, bits)
        out = run(bad, layout, bits=bits)  # no crash; the poisoned row only
        assert torch.equal(out[1], run(x.to(dtype), layout, bits=bits)[1])
        assert torch.isfinite(out[0]).all() == (poison == 1e-40)
        # a batch past the unpacked path's thresholds: still the poisoned row alone
        many = torch.cat([bad, torch.randn(10, 64, dtype=dtype)])
        out = run(many, layout, bits=bits)
        assert torch.equal(out[1:], run(many[1:], layout, bits=bits))
        assert torch.isfinite(out[0]).all() == (poison == 1e-40)
        # and the poisoned row's own bits, NaN included, as alone (AMX tiles take 11 rows)
        alone = run(bad[:1], layout, bits=bits)[0]
        bits_of = torch.int32 if dtype == torch.float32 else torch.int16
        assert torch.equal(out[0].view(bits_of), alone.view(bits_of))


@pytest.mark.parametrize("bits", BITS)
def test_packed_linear_sends_every_batch_to_the_integer_kernel_and_keeps_no_float_copy(bits):
    blocks, weight = quantized(96, 64, Q.Q4_1)
    linear = nn.Linear(64, 96)
    linear.weight.data.copy_(weight)
    packed = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks, activation_bits=bits)
    assert packed.small_kernel == f"gguf-int{bits}" and packed.decode_weight is None
    assert packed.small_batch_rows == GGUF_INT_SMALL_BATCH_ROWS[bits] == EVERY_BATCH
    assert packed.blocks_only and packed.weight.is_meta  # its shape alone, no float copy
    assert packed.weight.shape == (96, 64)
    with torch.inference_mode():
        for rows in (0, 1, 9, 16, 17, 300):
            x = torch.randn(rows, 64)
            want = ext.gguf_int_linear(x, regroup(blocks, bits), linear.bias, 96, bits)
            assert torch.equal(packed(x), want)
            assert torch.equal(packed(x, True), want)  # decode rows: no path of their own
    exact = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks)
    assert exact.small_kernel == "gguf" and not exact.activation_bits
    linear.weight = None  # as the loader leaves it: the blocks are needed then
    assert PackedLinear(linear, 64, gguf_blocks=blocks, activation_bits=bits).blocks_only
    with pytest.raises(ValueError, match="without its float weight needs GGUF blocks"):
        PackedLinear(linear, 64, gguf_blocks=blocks)


@pytest.mark.skipif(not decode_rows_from_blocks(torch.bfloat16, 16),
                    reason="no 16-column layout (AVX-512 VNNI)")  # fmt: skip
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_a_bf16_weight_takes_every_batch_from_its_blocks_and_keeps_no_bf16_copy(qtype):
    """Prompt rows and decode rows alike through the 16-column layout (16-bit x): no bf16
    packing beside the blocks, and a row's values the same whatever shares its batch."""
    dtype = torch.bfloat16
    if not can_pack(dtype, torch.device("cpu")):
        pytest.skip(f"no oneDNN {dtype}")
    blocks, weight = quantized(96, 64, qtype)
    linear = nn.Linear(64, 96).to(dtype)
    linear.weight.data.copy_(weight)
    packed = PackedLinear(linear, EVERY_BATCH, gguf_blocks=blocks, activation_bits=16)
    assert packed.blocks_only and packed.weight.is_meta and packed.decode_weight is None
    assert packed.small_kernel == "gguf-int16" and packed.activation_bits == 16
    wide = regroup(blocks, 16)
    assert torch.equal(packed.small_weight, wide)
    with torch.inference_mode():
        for rows in (1, 9, 70, 300):
            x = torch.randn(rows, 64, dtype=dtype)
            want = ext.gguf_int_linear(x, wide, packed.bias, 96, 16)
            assert torch.equal(packed(x), want)
            assert torch.equal(packed(x, torch.tensor([0])), want)  # decodes: no path apart
            assert torch.equal(packed(x[-1:]), want[-1:])
    linear.weight = None  # as the loader leaves it
    alone = PackedLinear(linear, EVERY_BATCH, blocks, activation_bits=16, dtype=dtype)
    assert alone.blocks_only and torch.equal(alone.small_weight, wide)
    with pytest.raises(ValueError, match="without its float weight needs GGUF blocks"):
        PackedLinear(linear, 64, blocks, activation_bits=16, dtype=dtype)  # oneDNN's knob


@pytest.mark.skipif(not decode_rows_from_blocks(torch.bfloat16, 16),
                    reason="no 16-column layout (AVX-512 VNNI)")  # fmt: skip
def test_with_onednn_for_large_batches_bf16_decode_rows_take_the_blocks_and_prompt_rows_bf16():
    """`INFLIGHT_ONEDNN_BF16=1` (a small-batch limit of 64 rows): the bf16 packing and oneDNN's
    for the prompt rows, the blocks for the decode rows."""
    dtype = torch.bfloat16
    if not can_pack(dtype, torch.device("cpu")):
        pytest.skip(f"no oneDNN {dtype}")
    blocks, weight = quantized(96, 64, Q.Q4_1)
    linear = nn.Linear(64, 96).to(dtype)
    linear.weight.data.copy_(weight)
    packed = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks, activation_bits=16)
    assert not packed.blocks_only
    assert packed.decode_weight is not None and not packed.activation_bits
    assert packed.small_kernel == "bf16"
    wide = regroup(blocks, 16)

    def through_blocks(x):
        return ext.gguf_int_linear(x, wide, packed.bias, 96, 16)

    with torch.inference_mode():
        for rows in (1, 9, 70, 300):
            x = torch.randn(rows, 64, dtype=dtype)
            assert torch.equal(packed(x, True), through_blocks(x))
            assert torch.equal(packed(x), packed._dense(x))  # no decode rows named
            decodes = torch.tensor([0, rows - 1]) if rows > 1 else torch.tensor([0])
            mixed = packed(x, decodes)
            assert torch.equal(mixed[decodes], through_blocks(x[decodes]))
            prompts = torch.ones(rows, dtype=torch.bool)
            prompts[decodes] = False
            assert torch.equal(mixed[prompts], packed._dense(x[prompts]))
            # a decode row's values do not depend on the rows beside it
            assert torch.equal(mixed[0], through_blocks(x[:1])[0])


def test_the_knob_regroups_a_float32_gguf_model_and_reuse_must_agree(tmp_path, tiny_llama, caplog):
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q8_0.gguf", Q.Q8_0)
    llm = LLM(str(path), dtype="float32", device="cpu", quantized_activations="int16")
    model = llm.core.loaded.model
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert {m.small_kernel for m in linears} == {"gguf-int16"}
    assert all(m.decode_weight is None for m in linears)
    assert model.fused_layers.activation_bits == 16
    assert model.fused_layers.small_batch_rows == GGUF_INT_SMALL_BATCH_ROWS[16]
    exact = LLM(str(path), dtype="float32", device="cpu", quantized_activations="off")
    prompt = [[5, 9, 11, 3, 17, 2, 8]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(out) == 6  # a tiny random model's tokens: their values are the kernel tests' job
    # auto: int16 for a file of 8-bit weights in float32 (int8 where 8-bit x is the faster)
    if eight_bits_are_faster():
        with pytest.raises(ConfigError, match="loaded with quantized_activations='int16'"):
            LLM(loaded_model=llm.core.loaded, dtype="float32", device="cpu")
    else:
        LLM(loaded_model=llm.core.loaded, dtype="float32", device="cpu")
    with pytest.raises(ConfigError, match="loaded with quantized_activations='int16'"):
        LLM(loaded_model=llm.core.loaded, dtype="float32", device="cpu",
            quantized_activations="off")  # fmt: skip
    with pytest.raises(ConfigError, match="loaded with quantized_activations='off'"):
        LLM(loaded_model=exact.core.loaded, dtype="float32", device="cpu",
            quantized_activations="int8")  # fmt: skip
    with pytest.raises(ConfigError, match=r"holds torch\.float32 weights, this engine computes in"):
        LLM(loaded_model=exact.core.loaded, dtype="bfloat16", device="cpu",
            quantized_activations="off")  # fmt: skip
    with pytest.raises(ConfigError, match="quantized_activations must be auto, off, int16 or int8"):
        LLM(str(path), quantized_activations="int4")
    # the reference backend brings no CPU kernels: the knob says it has no effect, when asked
    # for; auto's int16 says nothing where it does not apply (an HF folder's float weights)
    with caplog.at_level(logging.WARNING, logger="inflight.model.loader"):
        LLM(str(tiny_llama), dtype="float32", device="cpu", num_kv_blocks=16)
        assert "quantized_activations has no effect" not in caplog.text
        LLM(str(path), dtype="float32", device="cpu", attention_backend="torch",
            quantized_activations="int8")  # fmt: skip
    assert "quantized_activations has no effect" in caplog.text


def test_auto_sends_bf16_decode_rows_to_the_blocks_for_a_few_seats_or_without_amx(
    tmp_path, tiny_llama
):
    """Up to BF16_DECODE_ROWS_MAX_SEQS sequences a bf16 step reads its weights and the blocks
    win; past them, on a CPU with AMX tiles, bf16's batches run on the tiles and take the
    rows; without AMX the blocks keep them at any seats. float32 takes the blocks at any size."""
    wide = decode_rows_from_blocks(torch.bfloat16, 16)
    bf16, fp32, few = torch.bfloat16, torch.float32, BF16_DECODE_ROWS_MAX_SEQS
    q8 = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q8_0.gguf", Q.Q8_0)
    assert resolve_quantized_activations("auto", bf16, few, q8) == "int16"
    many = "off" if wide and eight_bit_tiles() else "int16"
    assert resolve_quantized_activations("auto", bf16, few + 1, q8) == many
    faster = eight_bits_are_faster() and blocks_serve_every_batch(fp32, 8)
    assert resolve_quantized_activations("auto", fp32, 256, q8) == ("int8" if faster else "int16")
    for asked in ("off", "int16", "int8"):
        assert resolve_quantized_activations(asked, bf16, 256, q8) == asked
    if not (wide and can_pack(bf16, torch.device("cpu"))):
        return
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q4_1.gguf", Q.Q4_1)
    for seats, from_blocks in ((few, True), (64, many == "int16")):
        llm = LLM(str(path), dtype="bfloat16", device="cpu", max_num_seqs=seats)
        linears = [m for m in llm.core.loaded.model.modules() if isinstance(m, PackedLinear)]
        # every row from the blocks, no bf16 copy (or, past the seats on AMX, none of them)
        assert {m.blocks_only and m.weight.is_meta for m in linears} == {from_blocks}
        assert llm.core.loaded.quantized_activations == ("int16" if from_blocks else "off")


def _layers_in(layer_type: Q, rest: Q):
    """A mix: `layer_type` for the layers' weights, `rest` for the embedding and the LM head."""
    return lambda name: layer_type if name.startswith("blk.") else rest


@pytest.mark.parametrize(
    ("name", "mix", "wanted"),
    [
        ("q4_k_m", k_quant_mix, "int8"),  # Q4_K and Q6_K layers, a Q5_0 embedding
        ("q6_k", _layers_in(Q.Q6_K, Q.Q8_0), "int8"),
        # by count: the MLP's three 512 x 256 weights outweigh attention's four
        ("q4_k-mlp", lambda n: Q.Q4_K if "ffn" in n else Q.Q5_0, "int8"),
        # Gemma 3's file: where rows do not fill 256-weight blocks, Q5_0; K-quants in down alone
        ("q5_k-down", lambda n: Q.Q5_K if "ffn_down" in n else Q.Q5_0, "int16"),
        ("q4_0", _layers_in(Q.Q4_0, Q.Q4_0), "int16"),
        ("q8_0", _layers_in(Q.Q8_0, Q.Q8_0), "int16"),
        # the LM head does not count: llama.cpp gives a Q4_0 file's Q6_K
        ("q4_0-q6_k-head", _layers_in(Q.Q4_0, Q.Q6_K), "int16"),
        ("f16", _layers_in(Q.F16, Q.F16), "int16"),
    ],
)
def test_auto_rounds_x_to_8_bits_for_k_quant_files(tmp_path, tiny_model_factory, name, mix, wanted):
    """llama.cpp's rounding where K-quant blocks hold most of the layers' weights, or wherever
    8-bit x is the faster (AMX tiles, AVX-512 VNNI); 16 bits where the legacy formats do.
    Where blocks serve every float32 batch only: a bf16 engine and an HF folder keep int16."""
    folder = tiny_model_factory("llama_wide")
    path = write_tiny_gguf(folder, tmp_path / f"tiny-{name}.gguf", None, mix=mix)
    fp32, bf16 = torch.float32, torch.bfloat16
    every_batch = blocks_serve_every_batch(fp32, 8)
    if eight_bits_are_faster() and name != "f16":  # any layer weight in blocks
        wanted = "int8"
    assert model_activations(path, fp32) == (wanted if every_batch else "int16")
    assert resolve_quantized_activations("auto", fp32, 256, path) == model_activations(path, fp32)
    assert model_activations(path, bf16) == "int16"
    assert model_activations(folder, fp32) == "int16"
    if every_batch and wanted == "int8":
        llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=16, max_model_len=64)
        assert llm.core.loaded.quantized_activations == "int8"
        assert llm.core.loaded.model.fused_layers.activation_bits == 8


def test_auto_computes_a_k_quant_gguf_in_float32_on_a_bf16_cpu(tmp_path, tiny_llama, monkeypatch):
    """bf16 would dequantize its blocks to bf16 copies (it keeps blocks only for the legacy
    formats' decode rows, with the 16-column layout); float32 keeps the file's bytes. A file
    without blocks, an explicit dtype and the exact path keep the CPU's bf16."""
    monkeypatch.setattr("inflight.platform.cpu_supports_bf16", lambda: True)
    cpu, bf16, fp32 = torch.device("cpu"), torch.bfloat16, torch.float32
    q5 = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q5_0.gguf", Q.Q5_0)
    q4 = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q4_1.gguf", Q.Q4_1)
    f16 = write_tiny_gguf(tiny_llama, tmp_path / "tiny-f16.gguf", Q.F16)
    blocks = load_extension().gguf_int_linear_available()
    legacy_in_bf16 = decode_rows_from_blocks(bf16, 16)
    assert resolve_engine_dtype("auto", cpu, q5) == (fp32 if blocks else bf16)
    assert resolve_engine_dtype("auto", cpu, q5, "int8") == (fp32 if blocks else bf16)
    assert resolve_engine_dtype("auto", cpu, q4) == (fp32 if blocks and not legacy_in_bf16
                                                     else bf16)  # fmt: skip
    assert resolve_engine_dtype("auto", cpu, q5, "off") == bf16
    assert resolve_engine_dtype("auto", cpu, f16) == bf16
    assert resolve_engine_dtype("bfloat16", cpu, q5) == bf16
    assert resolve_engine_dtype("auto", cpu, tiny_llama) == bf16
    # `bench agreement`'s exact reference takes the quantized kinds' dtype, not the exact one's
    assert quantized_dtype({"model": str(q5), "device": "cpu"}) == ("float32" if blocks
                                                                    else "bfloat16")  # fmt: skip
    assert quantized_dtype({"model": str(q5), "dtype": "bfloat16"}) == "bfloat16"
    if blocks:
        llm = LLM(str(q5), device="cpu", num_kv_blocks=16, max_model_len=64)
        assert llm.core.dtype == fp32 and llm.core.loaded.model.layers[0].qkv_proj.blocks_only
