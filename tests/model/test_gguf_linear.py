"""inflight's GGUF-block linear kernel (`kernels/csrc/gguf_linear.cpp`) and how the loader hands
it a GGUF file's own blocks: every format it reads against float64 arithmetic over the gguf
package's dequantized weights, rows independent of their batch, every row tile and column tail,
bad inputs refused, and a float32 GGUF model using it for small batches only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize
from torch import nn

from inflight import LLM
from inflight.attention import TorchReferenceBackend
from inflight.kernels import load_extension
from inflight.model.gguf_header import read_gguf_header
from inflight.model.gguf_loader import KERNEL_BLOCK_TYPES, gguf_arch_config, iter_gguf_weights
from inflight.model.llama import LlamaModel
from inflight.model.loader import ModuleBlocks, load_hf_arch_config
from inflight.model.packed_linear import GGUF_SMALL_BATCH_ROWS, PackedLinear, can_pack
from tests.gguf_files import write_tiny_gguf

Q = GGMLQuantizationType
ext = load_extension()
pytestmark = pytest.mark.skipif(
    not (ext.gguf_linear_available() and can_pack(torch.float32, torch.device("cpu"))),
    reason="no AVX2, FMA and F16C on this CPU",
)


def quantized(n: int, k: int, qtype: GGMLQuantizationType, seed: int = 0):
    """(GGUF blocks [n, k / 32, block bytes], the float32 weight they dequantize to)."""
    rng = np.random.default_rng(seed)
    raw = quantize(rng.standard_normal((n, k), np.float32), qtype)
    weight = np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(n, k)
    block_size, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = torch.from_numpy(raw.copy()).view(n, k // block_size, block_bytes)
    return blocks, torch.from_numpy(weight)


def assert_close_to_exact(got: torch.Tensor, x, weight, bias=None) -> None:
    """Within float32 accumulation error of the float64 product (K roundings of the magnitudes)."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weight.double().abs().T
    assert got.dtype == torch.float32 and got.shape == exact.shape
    assert bool(((got.double() - exact).abs() <= magnitude * x.shape[1] * 2.0**-24).all())


# SmolLM2's projections, a width that ends on a partial group of 4 columns, and tiny ones
SHAPES = [(960, 576), (576, 1536), (103, 64), (3, 32)]
ROWS = [1, 2, 3, 4, 5, 8, 9, 19]  # every tile height (1-8), and past one tile


@pytest.mark.parametrize("qtype", KERNEL_BLOCK_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernel_matches_exact_arithmetic_over_the_dequantized_weight(qtype, n, k):
    blocks, weight = quantized(n, k, qtype, seed=n)
    bias = torch.randn(n)
    for rows in ROWS:
        x = torch.randn(rows, k)
        assert_close_to_exact(ext.gguf_linear(x, blocks, None, n), x, weight)
        assert_close_to_exact(ext.gguf_linear(x, blocks, bias, n), x, weight, bias)


@pytest.mark.parametrize("qtype", KERNEL_BLOCK_TYPES, ids=lambda q: q.name)
def test_rows_do_not_depend_on_their_batch(qtype):
    """Each row alone gives the bits it gets in any batch: tiles change, each sum's order not."""
    blocks, _ = quantized(103, 576, qtype)
    x = torch.randn(19, 576)
    batched = ext.gguf_linear(x, blocks, None, 103)
    for r in (0, 3, 7, 8, 18):
        assert torch.equal(ext.gguf_linear(x[r : r + 1], blocks, None, 103)[0], batched[r])
    assert torch.equal(ext.gguf_linear(x[5:11], blocks, None, 103), batched[5:11])


def test_bad_inputs_are_refused():
    blocks, _ = quantized(64, 64, Q.Q4_1)
    x = torch.randn(2, 64)
    assert ext.gguf_linear(x[:0], blocks, None, 64).shape == (0, 64)
    assert torch.equal(ext.gguf_linear(x.T.contiguous().T, blocks, None, 64),
                       ext.gguf_linear(x, blocks, None, 64))  # fmt: skip
    with pytest.raises(RuntimeError, match=r"not Q4_0 \(18\), Q4_1 \(20\) or Q8_0 \(34\)"):
        ext.gguf_linear(x, blocks[:, :, :16].contiguous(), None, 64)
    with pytest.raises(RuntimeError, match="does not match the blocks"):
        ext.gguf_linear(x, blocks, None, 65)
    with pytest.raises(RuntimeError, match=r"x: \[rows, 64\] float32"):
        ext.gguf_linear(x.to(torch.bfloat16), blocks, None, 64)
    with pytest.raises(RuntimeError, match=r"x: \[rows, 64\] float32"):
        ext.gguf_linear(torch.randn(2, 32), blocks, None, 64)
    with pytest.raises(RuntimeError, match=r"bias: \[64\]"):
        ext.gguf_linear(x, blocks, torch.randn(63), 64)
    with pytest.raises(RuntimeError, match="uint8"):
        ext.gguf_linear(x, blocks.float(), None, 64)


def test_packed_linear_uses_the_blocks_for_small_batches_and_onednn_above():
    blocks, weight = quantized(96, 64, Q.Q4_1)
    linear = nn.Linear(64, 96)
    linear.weight.data.copy_(weight)
    packed = PackedLinear(linear, small_batch_rows=64, gguf_blocks=blocks)
    assert (packed.small_kernel, packed.small_batch_rows) == ("gguf", GGUF_SMALL_BATCH_ROWS)
    with torch.inference_mode():
        for rows in (1, GGUF_SMALL_BATCH_ROWS, GGUF_SMALL_BATCH_ROWS + 1, 40):
            x = torch.randn(rows, 64)
            if rows <= GGUF_SMALL_BATCH_ROWS:
                want = ext.gguf_linear(x, blocks, linear.bias, 96)
            else:
                want = torch.ops.mkldnn._linear_pointwise(
                    x, packed.weight, packed.bias, "none", [], ""
                )
            assert torch.equal(packed(x), want)
            torch.testing.assert_close(packed(x), F.linear(x, weight, linear.bias))
    # the blocks are a float32 weight's only; no small-batch kernels asked for, none used
    if can_pack(torch.bfloat16, torch.device("cpu")):
        bf16 = PackedLinear(nn.Linear(64, 96).to(torch.bfloat16), 64, gguf_blocks=blocks)
        assert bf16.small_kernel != "gguf"
    assert PackedLinear(linear, 0, gguf_blocks=blocks).small_batch_rows == 0
    with pytest.raises(ValueError, match=r"GGUF blocks \(96, 2, 20\) do not fit a \[64, 64\]"):
        PackedLinear(nn.Linear(64, 64), 64, gguf_blocks=blocks)


def test_the_loader_keeps_each_matrix_blocks_unpermuted_like_its_values(tmp_path, tiny_llama):
    path = write_tiny_gguf(tiny_llama, tmp_path / "tiny.gguf", Q.Q4_1)
    reader = GGUFReader(path)
    arch = gguf_arch_config(read_gguf_header(path), path)
    blocks: dict[str, torch.Tensor] = {}
    weights = dict(iter_gguf_weights(reader, arch, path, blocks))
    matrices = {name for name, w in weights.items() if w.dim() == 2}
    assert set(blocks) == matrices and any("q_proj" in name for name in blocks)
    for name, b in blocks.items():
        values = dequantize(b.reshape(b.shape[0], -1).numpy(), Q.Q4_1).reshape(weights[name].shape)
        assert np.array_equal(values, weights[name].numpy()), name


def meta_model(folder) -> LlamaModel:
    with torch.device("meta"):
        return LlamaModel(load_hf_arch_config(folder), TorchReferenceBackend(16))


def test_fused_projections_take_blocks_only_when_all_parts_share_one_format(tiny_model_factory):
    tied = meta_model(tiny_model_factory("llama3_rope"))
    assert tied.cfg.tie_word_embeddings
    assert tied.linear_sources()["lm_head"] == ["model.embed_tokens.weight"]
    model = meta_model(tiny_model_factory("llama"))
    sources = model.linear_sources()
    assert sources["lm_head"] == ["lm_head.weight"]
    assert len(sources) == 4 * model.cfg.num_layers + 1
    qkv = sources["layers.0.qkv_proj"]
    assert qkv == [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    assert sources["layers.1.gate_up_proj"] == [
        f"model.layers.1.mlp.{p}_proj.weight" for p in ("gate", "up")
    ]

    blocks = {name: torch.full((rows, 2, 20), i, dtype=torch.uint8)
              for i, (name, rows) in enumerate(zip(qkv, (8, 4, 4), strict=True))}  # fmt: skip
    fused = ModuleBlocks(model, blocks)
    assert list(fused) == ["layers.0.qkv_proj"]
    want = torch.cat([blocks[n] for n in qkv])
    assert torch.equal(fused["layers.0.qkv_proj"], want)
    assert torch.equal(fused.pop("layers.0.qkv_proj"), want)  # and its parts go with it
    assert fused == {} and blocks == {} and fused.pop("layers.0.qkv_proj") is None
    blocks = {name: torch.full((rows, 2, 20), i, dtype=torch.uint8)
              for i, (name, rows) in enumerate(zip(qkv, (8, 4, 4), strict=True))}  # fmt: skip
    blocks[qkv[1]] = torch.zeros(4, 1, 34, dtype=torch.uint8)  # k_proj in Q8_0: no fused blocks
    assert ModuleBlocks(model, blocks) == {}
    del blocks[qkv[1]]
    assert ModuleBlocks(model, blocks) == {}


@pytest.mark.parametrize("qtype", (Q.Q4_1, Q.Q8_0), ids=lambda q: q.name)
def test_a_float32_gguf_model_multiplies_small_batches_from_its_blocks(tmp_path, tiny_llama, qtype):
    path = write_tiny_gguf(tiny_llama, tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    llm = LLM(str(path), dtype="float32", attention_backend="cpu", device="cpu",
              quantized_activations="off")  # fmt: skip
    model = llm.core.loaded.model
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(linears) == 4 * model.cfg.num_layers + 1
    assert {(m.small_kernel, m.small_batch_rows) for m in linears} == {
        ("gguf", GGUF_SMALL_BATCH_ROWS)
    }
    assert model.fused_layers.small_batch_rows == GGUF_SMALL_BATCH_ROWS
    assert model.lm_head.small_weight.shape[2] == GGML_QUANT_SIZES[qtype][1]
    # bfloat16 has no GGUF kernel; the reference attention backend brings no CPU kernels
    for kwargs in ({"dtype": "bfloat16"}, {"dtype": "float32", "attention_backend": "torch"}):
        if kwargs["dtype"] == "bfloat16" and not can_pack(torch.bfloat16, torch.device("cpu")):
            continue
        other = LLM(
            str(path), device="cpu", quantized_activations="off", **kwargs
        ).core.loaded.model
        assert all(getattr(m, "small_kernel", "") != "gguf" for m in other.modules())
