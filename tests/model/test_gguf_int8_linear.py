"""The 8-bit-activation GGUF kernel (`kernels/csrc/gguf_int8_linear.cpp`) and the
`int8_activations` knob: the kernel computes exactly the dequantized weights times x rounded per
block of 32 (float64 reference, float32 summation error only), rows independent of their batch,
every row tile and a partial last group of columns, bad inputs refused; the knob regroups every
GGUF weight of a float32 model and sends every batch size to the kernel."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from torch import nn

from inflight import LLM, SamplingParams
from inflight.errors import ConfigError
from inflight.kernels import load_extension
from inflight.model.gguf_loader import KERNEL_BLOCK_TYPES
from inflight.model.packed_linear import (
    GGUF_INT8_SMALL_BATCH_ROWS,
    PackedLinear,
    can_pack,
    regroup_for_int8,
)
from tests.gguf_files import write_tiny_gguf
from tests.model.test_gguf_linear import quantized

Q = GGMLQuantizationType
ext = load_extension()
pytestmark = pytest.mark.skipif(
    not (ext.gguf_int8_linear_available() and can_pack(torch.float32, torch.device("cpu"))),
    reason="no AVX2, FMA and F16C on this CPU",
)


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x rounded as the kernel does: per block of 32, scale max|x| / 127 in float32, x times
    its float32 inverse rounded half to even; returned as the float64 values d * q."""
    blocks = x.numpy().reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint(blocks * inv)
    assert np.abs(q).max() <= 127
    return torch.from_numpy((d.astype(np.float64) * q).reshape(x.shape))


def assert_exact_over_rounded_x(got, x, weight, bias=None) -> None:
    x_hat = rounded(x)
    exact = x_hat @ weight.double().T + (0 if bias is None else bias.double())
    magnitude = x_hat.abs() @ weight.double().abs().T
    assert got.dtype == torch.float32 and got.shape == exact.shape
    assert bool(((got.double() - exact).abs() <= magnitude * x.shape[1] * 2.0**-24).all())


# SmolLM2's projections, widths ending on a partial group of 8 columns, and tiny ones
SHAPES = [(960, 576), (576, 1536), (103, 64), (3, 32)]
ROWS = [1, 2, 3, 4, 5, 8, 19]  # every tile height (1-4), and past one tile


@pytest.mark.parametrize("qtype", KERNEL_BLOCK_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernel_is_the_exact_product_with_x_rounded_per_block(qtype, n, k):
    blocks, weight = quantized(n, k, qtype, seed=n)
    packed = regroup_for_int8(blocks)
    assert packed.shape == ((n + 7) // 8, k // 32, 8 * blocks.shape[2])
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k) * torch.rand(rows, k // 32).repeat_interleave(32, dim=1)
        x[0, :32] = 0.0  # an all-zero block: scale 0
        assert_exact_over_rounded_x(ext.gguf_int8_linear(x, packed, None, n), x, weight)
        assert_exact_over_rounded_x(ext.gguf_int8_linear(x, packed, bias, n), x, weight, bias)


@pytest.mark.parametrize("qtype", KERNEL_BLOCK_TYPES, ids=lambda q: q.name)
def test_rows_do_not_depend_on_their_batch(qtype):
    blocks, _ = quantized(103, 576, qtype)
    packed = regroup_for_int8(blocks)
    x = torch.randn(19, 576)
    batched = ext.gguf_int8_linear(x, packed, None, 103)
    for r in (0, 3, 4, 18):
        assert torch.equal(ext.gguf_int8_linear(x[r : r + 1], packed, None, 103)[0], batched[r])
    assert torch.equal(ext.gguf_int8_linear(x[5:11], packed, None, 103), batched[5:11])


def test_regrouping_moves_bytes_and_nothing_else():
    blocks, _ = quantized(13, 64, Q.Q4_1)  # 2 groups of 8 columns, the last 3 zero
    packed = regroup_for_int8(blocks)
    zeros = torch.zeros(3 * 2 * 20, dtype=torch.uint8)
    assert torch.equal(packed.reshape(-1).sort().values,
                       torch.cat([blocks.reshape(-1), zeros]).sort().values)  # fmt: skip
    # group 0, block 1: 8 fp16 scales, 8 offsets, then chunk j = bytes 4j..4j+3 of each column
    g = packed[0, 1]
    assert torch.equal(g[:16].view(8, 2), blocks[:8, 1, 0:2])
    assert torch.equal(g[16:32].view(8, 2), blocks[:8, 1, 2:4])
    assert torch.equal(g[32:].view(4, 8, 4), blocks[:8, 1, 4:].reshape(8, 4, 4).transpose(0, 1))
    assert not packed[1, :, :16].view(2, 8, 2)[:, 5:].any()  # columns 13-15: zero scales


def test_bad_inputs_are_refused():
    blocks, _ = quantized(64, 64, Q.Q4_1)
    packed = regroup_for_int8(blocks)
    x = torch.randn(2, 64)
    assert ext.gguf_int8_linear(x[:0], packed, None, 64).shape == (0, 64)
    assert torch.equal(ext.gguf_int8_linear(x.T.contiguous().T, packed, None, 64),
                       ext.gguf_int8_linear(x, packed, None, 64))  # fmt: skip
    with pytest.raises(RuntimeError, match=r"not Q4_0 \(144\), Q4_1 \(160\) or Q8_0 \(272\)"):
        ext.gguf_int8_linear(x, blocks, None, 64)  # the file's layout, not the regrouped one
    with pytest.raises(RuntimeError, match="does not match the packing's 8 groups"):
        ext.gguf_int8_linear(x, packed, None, 65)
    with pytest.raises(RuntimeError, match=r"x: \[rows, 64\] float32"):
        ext.gguf_int8_linear(x.to(torch.bfloat16), packed, None, 64)
    with pytest.raises(RuntimeError, match=r"bias: \[64\]"):
        ext.gguf_int8_linear(x, packed, torch.randn(63), 64)
    nan = x.clone()
    nan[0, 3] = float("nan")
    out = ext.gguf_int8_linear(nan, packed, None, 64)  # no crash; the poisoned row only
    assert torch.isfinite(out[1]).all()


def test_packed_linear_sends_every_batch_to_the_integer_kernel():
    blocks, weight = quantized(96, 64, Q.Q4_1)
    linear = nn.Linear(64, 96)
    linear.weight.data.copy_(weight)
    packed = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks, int8_activations=True)
    assert (packed.small_kernel, packed.small_batch_rows) == (
        "gguf-int8",
        GGUF_INT8_SMALL_BATCH_ROWS,
    )
    with torch.inference_mode():
        for rows in (1, 9, 300):
            x = torch.randn(rows, 64)
            want = ext.gguf_int8_linear(x, regroup_for_int8(blocks), linear.bias, 96)
            assert torch.equal(packed(x), want)
    exact = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks)
    assert exact.small_kernel == "gguf" and not exact.int8_activations


def test_the_knob_regroups_a_float32_gguf_model_and_reuse_must_agree(tmp_path, tiny_llama, caplog):
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny-q4_1.gguf", Q.Q4_1)
    llm = LLM(str(path), dtype="float32", device="cpu", int8_activations=True)
    model = llm.core.loaded.model
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert {m.small_kernel for m in linears} == {"gguf-int8"}
    assert model.fused_layers.int8_activations
    assert model.fused_layers.small_batch_rows == GGUF_INT8_SMALL_BATCH_ROWS
    exact = LLM(str(path), dtype="float32", device="cpu")
    prompt = [[5, 9, 11, 3, 17, 2, 8]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert len(out) == 6  # a tiny random model's tokens: their values are the kernel tests' job
    with pytest.raises(ConfigError, match="loaded with int8_activations=True"):
        LLM(loaded_model=llm.core.loaded, dtype="float32", device="cpu")
    with pytest.raises(ConfigError, match="loaded with int8_activations=False"):
        LLM(loaded_model=exact.core.loaded, dtype="float32", device="cpu", int8_activations=True)
    # the reference backend brings no CPU kernels: the knob says it has no effect
    with caplog.at_level(logging.WARNING, logger="inflight.model.loader"):
        LLM(str(path), dtype="float32", device="cpu", attention_backend="torch",
            int8_activations=True)  # fmt: skip
    assert "int8_activations has no effect" in caplog.text
