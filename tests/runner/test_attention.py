"""The reference paged-attention backend against dense causal attention, one request at a time."""

from __future__ import annotations

import pytest
import torch

from inflight.attention import TorchReferenceBackend

H, KVH, D, BS = 4, 2, 8, 4


def dense_attention(q, k, v, positions, window=None):
    """q [Q, H, D] at `positions`, k/v [L, KVH, D] for positions 0..L-1."""
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    scores = torch.einsum("qhd,lhd->hql", q, k) / D**0.5
    key_pos = torch.arange(k.shape[0])
    mask = key_pos[None, :] <= positions[:, None]
    if window is not None:
        mask &= key_pos[None, :] > positions[:, None] - window
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hql,lhd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize("window", [None, 5])
def test_mixed_batch_matches_dense_attention(window):
    torch.manual_seed(0)
    # (cached tokens, new tokens): decodes of many lengths (several decode groups), and two
    # prefill chunks (one a continuation)
    shapes = [(7, 1), (0, 9), (12, 1), (5, 6)] + [((i * 7) % 40, 1) for i in range(20)]
    num_blocks = 400
    k_cache = torch.zeros(num_blocks, BS, KVH, D)
    v_cache = torch.zeros(num_blocks, BS, KVH, D)
    free = list(torch.randperm(num_blocks).tolist())  # scattered, non-contiguous blocks

    full_k, full_v, tables = [], [], []
    for cached, new in shapes:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // BS))]
        tables.append(table)
        k, v = torch.randn(total, KVH, D), torch.randn(total, KVH, D)
        full_k.append(k)
        full_v.append(v)
        for pos in range(cached):  # pre-fill the cache with the earlier tokens
            k_cache[table[pos // BS], pos % BS] = k[pos]
            v_cache[table[pos // BS], pos % BS] = v[pos]

    query_start_loc, start_pos, slots, qs, ks, vs = [0], [], [], [], [], []
    for (cached, new), table, k, v in zip(shapes, tables, full_k, full_v, strict=True):
        start_pos.append(cached)
        query_start_loc.append(query_start_loc[-1] + new)
        slots += [table[p // BS] * BS + p % BS for p in range(cached, cached + new)]
        qs.append(torch.randn(new, H, D))
        ks.append(k[cached:])
        vs.append(v[cached:])
    max_blocks = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in tables])

    backend = TorchReferenceBackend(BS, window)
    meta = backend.build_metadata(
        query_start_loc, start_pos, block_tables, torch.tensor(slots), torch.device("cpu")
    )
    assert len(meta.decode) == 2  # 22 decodes: two length groups
    out = backend.forward(torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, meta)

    for i, (cached, new) in enumerate(shapes):
        positions = torch.arange(cached, cached + new)
        want = dense_attention(qs[i], full_k[i], full_v[i], positions, window)
        got = out[query_start_loc[i] : query_start_loc[i + 1]]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
