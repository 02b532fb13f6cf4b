"""The experts routed on the device (`expert_kernels`, Triton: compiled on a GPU, else under its
interpreter) against the host path (`moe.route`): the pairs' layout, the grouped matmul, and
whole expert layers of each expert family."""

from __future__ import annotations

import pytest
import torch

from inflight import LLM
from inflight.model.arch import CONV_ARCHS, DELTA_ARCHS, EXPERT_ARCHS
from inflight.model.expert_kernels import expert_matmul, group_pairs, max_tiles

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("tokens", "k", "experts", "tile"), [(1, 2, 4, 16), (7, 2, 4, 4), (40, 3, 5, 4), (9, 4, 64, 16)]
)
def test_pairs_are_laid_out_by_expert_in_whole_tiles(tokens, k, experts, tile):
    gen = torch.Generator().manual_seed(tokens)
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    rows, tile_expert = group_pairs(chosen.to(DEVICE), experts, tile)
    rows, tile_expert = rows.cpu(), tile_expert.cpu()
    n = max_tiles(tokens * k, experts, tile)
    assert rows.shape == (n * tile,) and tile_expert.shape == (n,)
    flat = chosen.flatten()
    seen = []
    for t, e in enumerate(tile_expert.tolist()):
        pairs = [p for p in rows[t * tile : (t + 1) * tile].tolist() if p >= 0]
        if e == experts:  # past the used tiles: nothing but padding
            assert not pairs
            continue
        assert all(flat[p] == e for p in pairs)
        seen += pairs
    assert sorted(seen) == list(range(tokens * k)), "every pair once"
    # each expert's pairs in token order, its tiles in a row, experts ascending
    assert seen == sorted(seen, key=lambda p: (int(flat[p]), p))
    used = tile_expert[tile_expert < experts]
    assert torch.equal(used, used.sort().values)


@pytest.mark.parametrize("bias", [False, True])
def test_grouped_matmul_is_each_pairs_expert_linear(bias):
    gen = torch.Generator().manual_seed(0)
    tokens, k, experts, num_in, num_out = 6, 2, 4, 40, 72  # neither a multiple of a block
    x = torch.randn(tokens, num_in, generator=gen)
    w = torch.randn(experts, num_out, num_in, generator=gen)
    b = torch.randn(experts, num_out, generator=gen) if bias else None
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    on = [t.to(DEVICE) if t is not None else None for t in (x, w, b, chosen)]
    rows, tile_expert = group_pairs(on[3], experts, 16)
    got = expert_matmul(on[0], on[1], on[2], rows, tile_expert, tokens * k, k).cpu()
    for p, e in enumerate(chosen.flatten().tolist()):
        want = x[p // k] @ w[e].T + (b[e] if b is not None else 0)
        torch.testing.assert_close(got[p], want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("arch", EXPERT_ARCHS)
def test_expert_layers_routed_on_the_device_match_the_host_path(arch, tiny_model_factory):
    """Each family's routing and activation (Qwen3-MoE's renormalized weights in the model's
    dtype, Mixtral's in float32, gpt-oss's softmax over the best logits, biases and clamped
    gate, GLM-4.5's sigmoid router in groups, Qwen2-MoE's and GLM-4.5's shared expert) through
    the grouped kernels; the model says it can be captured in a graph (but LFM2-MoE)."""
    llm = LLM(str(tiny_model_factory(arch)), dtype="float32", attention_backend="triton")
    model = llm.core.loaded.model
    layer = next(layer for layer in model.layers if layer.sparse)
    # (LFM2-MoE's convolution state and Qwen3.5-MoE's DeltaNet state keep their steps out of
    # graphs whatever their experts)
    stateful = arch in CONV_ARCHS + DELTA_ARCHS
    assert layer.stack is not None and model.graph_capturable == (not stateful)
    x = torch.randn(13, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    x = x.to(DEVICE)
    got = layer.mlp(x, False)
    stack, layer.stack = layer.stack, None
    assert not model.graph_capturable
    torch.testing.assert_close(got, layer.mlp(x, False), rtol=1e-5, atol=1e-5)
    layer.stack = stack
