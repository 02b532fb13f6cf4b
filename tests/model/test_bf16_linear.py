"""inflight's bf16 linear kernel (`kernels/csrc/bf16_linear.cpp`) against exact arithmetic:
each output is the float32 sum of its products rounded once to bf16, so it lies within one bf16
step of the float64 result; a row's output never depends on the rows batched with it; the
shapes the tiling splits (row tiles, panels, K chunks, partial column vectors) are all covered."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from inflight.kernels import load_extension
from inflight.model import packed_linear
from inflight.model.packed_linear import PackedLinear, can_pack

ext = load_extension()
pytestmark = pytest.mark.skipif(
    not (ext.bf16_linear_available() and can_pack(torch.bfloat16, torch.device("cpu"))),
    reason="no AVX-512 BF16 on this CPU",
)


def assert_within_one_bf16_step(got: torch.Tensor, x, weight, bias=None) -> None:
    """|got - exact| <= one bf16 step at the exact value, plus the float32 accumulation error."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weight.double().abs().T
    step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 7)
    accumulation = magnitude * x.shape[1] * 2.0**-24
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    assert bool(((got.double() - exact).abs() <= step + accumulation).all())


# (out_features, in_features): SmolLM2's projections and head, widths that leave partial
# column vectors and blocks, a K long enough for several chunks, and rows 2 KB apart
SHAPES = [(960, 576), (100, 576), (8, 64), (49, 130), (576, 1536), (40, 1024)]
ROWS = [1, 5, 12, 13, 64, 97, 400]  # one tile, full and partial tiles, past one panel of 384


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("rows", ROWS)
def test_kernel_rounds_the_exact_product_once(n, k, rows):
    torch.manual_seed(n * 1000 + rows)
    weight = torch.randn(n, k, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.bfloat16)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    packed = ext.pack_bf16_linear(weight)
    assert_within_one_bf16_step(ext.bf16_linear(x, packed, None, n), x, weight)
    assert_within_one_bf16_step(ext.bf16_linear(x, packed, bias, n), x, weight, bias)


@pytest.mark.parametrize(("n", "k"), [(96, 64), (49, 130), (8, 64)])
def test_packing_is_the_weight_in_pair_major_blocks_of_32_columns(n, k):
    """Whole blocks and a last one padded with zero columns, into given memory whatever it
    held (the loader hands it fresh pages) or into the packing's own."""
    torch.manual_seed(n)
    weight = torch.randn(n, k, dtype=torch.bfloat16)
    blocks = -(-n // 32)
    padded = torch.zeros(blocks * 32, k // 2, 2, dtype=torch.bfloat16)
    padded[:n] = weight.view(n, k // 2, 2)
    want = padded.view(blocks, 32, k // 2, 2).transpose(1, 2)
    assert torch.equal(ext.pack_bf16_linear(weight), want)
    out = torch.full((blocks, k // 2, 32, 2), float("nan"), dtype=torch.bfloat16)
    assert ext.pack_bf16_linear(weight, out).data_ptr() == out.data_ptr()
    assert torch.equal(out, want)
    with pytest.raises(RuntimeError, match="out: bfloat16"):
        ext.pack_bf16_linear(weight, torch.empty(blocks + 1, k // 2, 32, 2, dtype=torch.bfloat16))


@pytest.mark.parametrize(("n", "k"), [(960, 576), (96, 1024)])
def test_rows_do_not_depend_on_their_batch(n, k):
    """Each row alone gives the bits it gets in any batch (tiles and panels change, sums do not;
    a 1,024-wide x of many rows is read from a copy with its rows further apart)."""
    torch.manual_seed(0)
    weight = torch.randn(n, k, dtype=torch.bfloat16)
    packed = ext.pack_bf16_linear(weight)
    x = torch.randn(420, k, dtype=torch.bfloat16)
    batched = ext.bf16_linear(x, packed, None, n)
    for r in (0, 11, 12, 95, 383, 384, 419):
        assert torch.equal(ext.bf16_linear(x[r : r + 1], packed, None, n)[0], batched[r])
        assert torch.equal(ext.bf16_linear(x[r : r + 7], packed, None, n)[0], batched[r])


def test_strided_and_empty_inputs():
    torch.manual_seed(1)
    weight = torch.randn(64, 128, dtype=torch.bfloat16)
    packed = ext.pack_bf16_linear(weight)
    wide = torch.randn(6, 200, dtype=torch.bfloat16)
    x = wide[:, :128]  # rows with a stride wider than the row
    assert torch.equal(
        ext.bf16_linear(x, packed, None, 64), ext.bf16_linear(x.contiguous(), packed, None, 64)
    )
    assert ext.bf16_linear(x[:0], packed, None, 64).shape == (0, 64)


def test_bad_shapes_are_refused():
    weight = torch.randn(64, 128, dtype=torch.bfloat16)
    packed = ext.pack_bf16_linear(weight)
    with pytest.raises(RuntimeError, match="even"):
        ext.pack_bf16_linear(torch.randn(64, 127, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bfloat16"):
        ext.pack_bf16_linear(torch.randn(64, 128))
    with pytest.raises(RuntimeError, match=r"x: \[rows, 128\] bfloat16"):
        ext.bf16_linear(torch.randn(2, 64, dtype=torch.bfloat16), packed, None, 64)
    with pytest.raises(RuntimeError, match="does not match the packed weight"):
        ext.bf16_linear(torch.randn(2, 128, dtype=torch.bfloat16), packed, None, 96)
    with pytest.raises(RuntimeError, match="bias"):
        ext.bf16_linear(torch.randn(2, 128, dtype=torch.bfloat16), packed,
                        torch.randn(63, dtype=torch.bfloat16), 64)  # fmt: skip


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_uses_the_kernel_for_small_batches_and_onednn_above(bias):
    torch.manual_seed(3)
    linear = nn.Linear(576, 960, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(linear, small_batch_rows=16)
    assert packed.small_batch_rows == 16 and packed.small_weight is not None
    for rows in (1, 16):
        x = torch.randn(rows, 576, dtype=torch.bfloat16)
        want = ext.bf16_linear(x, packed.small_weight, linear.bias, 960)
        assert torch.equal(packed(x), want)
        assert_within_one_bf16_step(packed(x), x, linear.weight, linear.bias)
    for rows in (17, 300):  # oneDNN: bit-identical to F.linear
        x = torch.randn(rows, 576, dtype=torch.bfloat16)
        assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))


def test_packed_linear_keeps_onednn_for_odd_widths():
    linear = nn.Linear(575, 64).to(torch.bfloat16)  # k pairs need an even in_features
    packed = PackedLinear(linear, small_batch_rows=64)
    assert packed.small_batch_rows == 0 and packed.small_weight is None
    x = torch.randn(3, 575, dtype=torch.bfloat16)
    assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_takes_every_batch_through_the_kernel_by_default(bias, monkeypatch):
    """The loader's default: every batch through the kernel, so a row rounds the same alone as
    in any batch (oneDNN splits a lone row's sum otherwise), and no oneDNN copy is kept;
    `INFLIGHT_ONEDNN_BF16=1` sends batches past 64 rows to oneDNN, with both packings."""
    monkeypatch.delenv("INFLIGHT_ONEDNN_BF16", raising=False)
    assert packed_linear.bf16_small_batch_rows() == packed_linear.EVERY_BATCH
    torch.manual_seed(4)
    linear = nn.Linear(1536, 576, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(linear, packed_linear.bf16_small_batch_rows())
    assert not packed.dense_copy and packed.weight.is_meta and packed.small_kernel == "bf16"
    x = torch.randn(300, 1536, dtype=torch.bfloat16)
    alone = torch.cat([packed(x[r : r + 1]) for r in range(300)])
    for rows in (2, 65, 300):
        assert torch.equal(packed(x[:rows]), alone[:rows])
    assert torch.equal(packed(x[:6].view(2, 3, 1536)), alone[:6].view(2, 3, 576))
    assert packed(x[:0]).shape == (0, 576)
    assert_within_one_bf16_step(alone, x, linear.weight, linear.bias)

    monkeypatch.setenv("INFLIGHT_ONEDNN_BF16", "1")
    limit = packed_linear.bf16_small_batch_rows()
    assert limit == packed_linear.ONEDNN_BF16_ABOVE_ROWS
    both = PackedLinear(linear, limit)
    assert both.dense_copy and both.small_weight is not None
    assert torch.equal(both(x[:limit]), alone[:limit])
    assert torch.equal(both(x), F.linear(x, linear.weight, linear.bias))  # oneDNN's
