"""The reference paged-attention backend against dense causal attention, one request at a time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from inflight.attention import TorchReferenceBackend, make_backend
from inflight.attention.backend import is_scaled
from inflight.attention.cpu_kernel import CpuKernelBackend, to_kernel_layout
from inflight.attention.triton_backend import TritonBackend
from inflight.attention.triton_decode import MIN_PARTITION
from inflight.errors import ConfigError

H, KVH, D, BS = 4, 2, 8, 4
GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Triton kernels on CPU tensors: only under its interpreter (conftest: machines without CUDA)
INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton compiles for the GPU")


def dense_attention(q, k, v, positions, window=None, scale=None, softcap=None, sinks=None):
    """q [Q, H, D] at `positions`, k/v [L, KVH, D] for positions 0..L-1; `sinks` [H]: a logit
    per head in each softmax's denominator (gpt-oss's, as transformers computes it)."""
    k = k.repeat_interleave(H // KVH, dim=1)
    v = v.repeat_interleave(H // KVH, dim=1)
    scores = torch.einsum("qhd,lhd->hql", q, k) * (D**-0.5 if scale is None else scale)
    if softcap is not None:  # Gemma 2's, as transformers computes it
        scores = torch.tanh(scores / softcap) * softcap
    key_pos = torch.arange(k.shape[0])
    mask = key_pos[None, :] <= positions[:, None]
    if window is not None:
        mask &= key_pos[None, :] > positions[:, None] - window
    scores = scores.masked_fill(~mask[None], float("-inf"))
    if sinks is None:
        return torch.einsum("hql,lhd->qhd", scores.softmax(-1), v)
    sink = sinks.view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("hql,lhd->qhd", probs, v)


@pytest.mark.parametrize(
    "backend_cls",
    [
        TorchReferenceBackend,
        CpuKernelBackend,
        pytest.param(TritonBackend, marks=INTERPRETED, id="TritonBackend"),
    ],
)
@pytest.mark.parametrize(
    ("window", "scale", "softcap", "sinks"), [(None, None, None, False), (5, None, None, False),
                                              (5, 0.2, None, False), (5, 0.5, 1.5, False),
                                              (None, None, None, True), (5, 0.5, 1.5, True)]
)  # fmt: skip
def test_mixed_batch_matches_dense_attention(backend_cls, window, scale, softcap, sinks):
    """Each layer's own window, score scale, soft cap and sinks (Gemma 3's windowed layers, its
    query_pre_attn_scalar; Gemma 2's cap of scores at 1.5 here, far below these scores, so
    that capping changes every row; gpt-oss's sink logits) go in with its forward."""
    if backend_cls is TritonBackend and sinks and window is None:
        pytest.skip("Triton's interpreter: the case with a window, a cap and sinks covers them")
    torch.manual_seed(0)
    sink_logits = torch.randn(H) * 2 if sinks else None
    # (cached tokens, new tokens): decodes of many lengths (several decode groups), and prefill
    # chunks (continuations too; longer than one 16-token tile of queries and of keys)
    shapes = [(7, 1), (0, 9), (12, 1), (5, 6), (0, 40), (21, 35)]
    shapes += [((i * 7) % 40, 1) for i in range(20)]
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

    backend = backend_cls(BS)
    if backend_cls is CpuKernelBackend:
        k_cache, v_cache = to_kernel_layout(k_cache, v_cache)
    meta = backend.build_metadata(
        query_start_loc, start_pos, block_tables, torch.tensor(slots), torch.device("cpu")
    )
    if backend_cls is TorchReferenceBackend:
        assert len(meta.decode) == 2  # 22 decodes: two length groups
    else:  # one kernel call for all decodes, one for all 4 prompt chunks
        assert len(meta.decode_batch.rows) == 22
        assert meta.prefill_batch.chunks.shape == (4, 3)
    q, k, v = torch.cat(qs), torch.cat(ks), torch.cat(vs)
    out = backend.forward(q, k, v, k_cache, v_cache, meta, window, scale, softcap, sink_logits)

    for i, (cached, new) in enumerate(shapes):
        positions = torch.arange(cached, cached + new)
        want = dense_attention(qs[i], full_k[i], full_v[i], positions, window, scale, softcap,
                               sink_logits)  # fmt: skip
        got = out[query_start_loc[i] : query_start_loc[i + 1]]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def random_paged_decodes(dtype, num_reqs=40, num_blocks=300, block_size=16, kvh=3, h=9, d=64):
    """Decodes over scattered blocks, contexts 1..~300 tokens: (q, caches, tables, lens)."""
    gen = torch.Generator().manual_seed(1)
    seq_lens = torch.randint(1, 300, (num_reqs,), generator=gen)  # first: the same for any shape
    k_cache = torch.randn(num_blocks, block_size, kvh, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kvh, d, generator=gen).to(dtype)
    max_blocks = -(-int(seq_lens.max()) // block_size)
    tables = torch.randint(0, num_blocks, (num_reqs, max_blocks), generator=gen)
    q = torch.randn(num_reqs, h, d, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, seq_lens


# (dtype, tolerance, block size, head_dim): SmolLM2's shapes in fp32 and bf16 (the AVX-512 BF16
# path where the CPU has it), bf16 blocks of 32 positions and heads of 128 (the same path, more
# rows per block and registers per head), Gemma's heads of 256 (the AVX2 items, in both
# dtypes), bf16 blocks of 8 and fp16 (the generic loop), and heads whose width the AVX2 items
# take at run time: Phi-3's 96 and DeepSeek's latent rows of 576 (in blocks of 8: the generic
# loop's runs of dims held in registers).
KERNEL_CASES = [
    (torch.float32, 1e-5, 16, 64),
    (torch.bfloat16, 2e-2, 16, 64),
    (torch.bfloat16, 2e-2, 32, 128),
    (torch.float32, 1e-5, 16, 256),
    (torch.bfloat16, 2e-2, 16, 256),
    (torch.bfloat16, 2e-2, 8, 64),
    (torch.float16, 5e-3, 16, 64),
    (torch.float32, 1e-5, 16, 96),
    (torch.float32, 1e-5, 16, 576),
    (torch.bfloat16, 2e-2, 16, 576),
    (torch.float32, 1e-5, 8, 576),
]
# Under Triton's interpreter (seconds a case) only what changes the Triton kernels' tiling: the
# float32 shape with and without a window, heads of 128 in blocks of 32, blocks of 8 with a
# window; the dtype itself is a parameter of theirs (every case runs where there is a GPU).
INTERPRETED_CASES = {(torch.float32, 16, 64, None), (torch.float32, 16, 64, 37),
                     (torch.bfloat16, 32, 128, None), (torch.bfloat16, 8, 64, 37)}  # fmt: skip


def skip_beyond_interpreted_cases(kernel: str, dtype, bs: int, d: int, window) -> None:
    if kernel == "triton" and (dtype, bs, d, window) not in INTERPRETED_CASES:
        pytest.skip("Triton's interpreter: INTERPRETED_CASES cover its kernels' tiling")


@pytest.mark.parametrize(
    "kernel",
    ["cpu", pytest.param("triton", marks=INTERPRETED), pytest.param("triton-cuda", marks=GPU)],
)
@pytest.mark.parametrize(("dtype", "tol", "bs", "d"), KERNEL_CASES)
@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("extra", ["", "sinks", "softcap"])
def test_kernel_matches_reference_on_model_shapes(kernel, dtype, tol, bs, d, window, extra):
    """SmolLM2's head grouping (9 query heads over 3 KV heads): each decode kernel (fp32
    accumulation; Triton's under its interpreter here) against the reference (bf16 matmuls in
    bf16 runs; "triton-cuda": compiled for the GPU, which CI does not have); the C++ kernels
    and Triton's with gpt-oss's sinks, and with Gemma 2's soft cap, too."""
    skip_beyond_interpreted_cases(kernel, dtype, bs, d, window)
    sink_logits, softcap = extras_for(kernel, extra, 9, window)
    # Triton's interpreter runs each program in Python: 16 requests there (contexts 7..299,
    # inside and beyond the window, one to three partitions), 40 elsewhere
    num_reqs = 16 if kernel == "triton" else 40
    q, k_cache, v_cache, tables, seq_lens = random_paged_decodes(
        dtype, num_reqs, block_size=bs, d=d
    )
    assert seq_lens.max() > 2 * MIN_PARTITION and seq_lens.min() < 37
    device = torch.device("cuda" if kernel == "triton-cuda" else "cpu")
    q, k_cache, v_cache = q.to(device), k_cache.to(device), v_cache.to(device)
    n = len(seq_lens)
    query_start_loc = list(range(n + 1))
    start_pos = (seq_lens - 1).tolist()
    slots = [int(tables[r, p // bs]) * bs + p % bs for r, p in enumerate(start_pos)]
    # the new tokens' K/V are the ones already in the cache at their slots (written back as is)
    flat_k, flat_v = k_cache.view(-1, 3, d), v_cache.view(-1, 3, d)
    slots = torch.tensor(slots, device=device)
    key, value = flat_k[slots].clone(), flat_v[slots].clone()
    outs = []
    if kernel == "cpu":
        fast = (CpuKernelBackend(bs), to_kernel_layout(k_cache, v_cache))
    else:
        fast = (TritonBackend(bs), (k_cache.clone(), v_cache.clone()))
    for backend, caches in ((TorchReferenceBackend(bs), (k_cache, v_cache)), fast):
        meta = backend.build_metadata(query_start_loc, start_pos, tables, slots, device)
        outs.append(backend.forward(q, key, value, *caches, meta, window, softcap=softcap,
                                    sinks=sink_logits))  # fmt: skip
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=tol, rtol=tol)


def extras_for(
    kernel: str, extra: str, heads: int, window: int | None
) -> tuple[torch.Tensor | None, float | None]:
    """(sink logits of the scores' size, or None; a soft cap, or None): every kernel takes
    both; the Triton kernels' run where a GPU is (the interpreter would add minutes; the
    mixed-batch test gives them both on small shapes). The cap applies to every score before
    any mask, so the windowless shapes cover it."""
    if extra == "softcap":
        if kernel == "triton":
            pytest.skip("Triton's interpreter: the mixed-batch test covers its soft cap")
        if window is not None:
            pytest.skip("the cap comes before the window's mask: the windowless case covers it")
        return None, 1.0  # below these scores' spread, so that the cap changes every row
    if extra != "sinks":
        return None, None
    if kernel == "triton":
        pytest.skip("Triton's interpreter: the mixed-batch test covers its sinks")
    device = "cuda" if kernel == "triton-cuda" else "cpu"
    return torch.randn(heads, generator=torch.Generator().manual_seed(7)).to(device) * 2, None


@pytest.mark.parametrize(
    "kernel",
    ["cpu", pytest.param("triton", marks=INTERPRETED), pytest.param("triton-cuda", marks=GPU)],
)
@pytest.mark.parametrize(("dtype", "tol", "bs", "d"), KERNEL_CASES)
@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("extra", ["", "sinks", "softcap"])
def test_prefill_kernel_matches_reference_on_model_shapes(kernel, dtype, tol, bs, d, window,
                                                          extra):  # fmt: skip
    """Prompt chunks (fresh and continuations, 2..90 tokens: more than one tile of the Triton
    kernel's 64 queries) on SmolLM2's head grouping, the queries a strided view into a fused QKV
    tensor as in the model; with gpt-oss's sinks, and Gemma 2's cap, too."""
    skip_beyond_interpreted_cases(kernel, dtype, bs, d, window)
    sink_logits, softcap = extras_for(kernel, extra, 9, window)
    gen = torch.Generator().manual_seed(2)
    num_blocks, kvh, h = 200 * 16 // bs, 3, 9
    k_cache = torch.randn(num_blocks, bs, kvh, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, bs, kvh, d, generator=gen).to(dtype)
    cached = [0, 0, 17, 64, 100, 3]
    new = [2, 90, 33, 16, 47, 70]
    query_start_loc = [0]
    for n in new:
        query_start_loc.append(query_start_loc[-1] + n)
    max_blocks = -(-max(c + n for c, n in zip(cached, new, strict=True)) // bs)
    tables = torch.randperm(num_blocks, generator=gen)[: len(new) * max_blocks].view(-1, max_blocks)
    slots = [
        int(tables[r, p // bs]) * bs + p % bs
        for r, (c, n) in enumerate(zip(cached, new, strict=True))
        for p in range(c, c + n)
    ]
    flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    key, value = flat_k[torch.tensor(slots)].clone(), flat_v[torch.tensor(slots)].clone()
    qkv = torch.randn(len(slots), (h + 2 * kvh) * d, generator=gen).to(dtype)
    q = qkv[:, : h * d].view(-1, h, d)  # rows strided, as the model passes them
    device = torch.device("cuda" if kernel == "triton-cuda" else "cpu")
    q, key, value, k_cache, v_cache = (t.to(device) for t in (q, key, value, k_cache, v_cache))
    if kernel == "cpu":
        fast = (CpuKernelBackend(bs), to_kernel_layout(k_cache, v_cache))
    else:
        fast = (TritonBackend(bs), (k_cache.clone(), v_cache.clone()))
    outs = []
    for backend, caches in ((TorchReferenceBackend(bs), (k_cache, v_cache)), fast):
        meta = backend.build_metadata(
            query_start_loc, cached, tables, torch.tensor(slots, device=device), device
        )
        outs.append(backend.forward(q, key, value, *caches, meta, window, softcap=softcap,
                                    sinks=sink_logits))  # fmt: skip
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("h", "kvh", "d"), [(9, 3, 64), (4, 1, 256), (16, 1, 576)])
def test_cpu_decode_in_parts_matches_the_reference_and_is_the_same_alone(dtype, h, kvh, d):
    """The C++ decode kernel attends a context past 512 positions in parts cut at multiples of
    512 and merges their softmaxes (so that one long request keeps every thread busy; a sink
    joins the merge): against the reference on contexts of 1 to 4 parts (a window of 300 cuts
    the 600-token one at 512 too), and each request's row the same bits alone as in its batch,
    since the cuts depend on the request alone."""
    gen = torch.Generator().manual_seed(6)
    bs, lens = 16, [2000, 512, 513, 600, 1100, 40, 1]
    blocks = -(-max(lens) // bs)
    num_blocks = len(lens) * blocks
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    k_cache = torch.randn(num_blocks, bs, kvh, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, bs, kvh, d, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen).view(len(lens), blocks)
    q = torch.randn(len(lens), h, d, generator=gen).to(dtype)
    flat_k, flat_v = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    slots = [int(tables[r, (n - 1) // bs]) * bs + (n - 1) % bs for r, n in enumerate(lens)]
    cpu, reference = CpuKernelBackend(bs), TorchReferenceBackend(bs)
    kernel_caches = to_kernel_layout(k_cache, v_cache)
    sink_logits = torch.randn(h, generator=gen) * 2

    def decode(backend, caches, rows, window, sinks):
        meta = backend.build_metadata(list(range(len(rows) + 1)), [lens[r] - 1 for r in rows],
                                      tables[rows], torch.tensor([slots[r] for r in rows]),
                                      torch.device("cpu"))  # fmt: skip
        at = torch.tensor([slots[r] for r in rows])
        return backend.forward(q[rows], flat_k[at].clone(), flat_v[at].clone(), *caches, meta,
                               window, sinks=sinks)  # fmt: skip

    everyone = list(range(len(lens)))
    for window, sinks in ((None, None), (300, None), (None, sink_logits)):
        together = decode(cpu, kernel_caches, everyone, window, sinks)
        want = decode(reference, (k_cache, v_cache), everyone, window, sinks)
        torch.testing.assert_close(together.float(), want.float(), atol=tol, rtol=tol)
        for r in everyone:
            alone = decode(cpu, kernel_caches, [r], window, sinks)
            assert torch.equal(alone[0], together[r]), f"request {r} (window {window})"


@pytest.mark.parametrize(
    "kernel",
    ["cpu", pytest.param("triton", marks=INTERPRETED), pytest.param("triton-cuda", marks=GPU)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verified_drafts_attend_bit_for_bit_as_lone_decodes(kernel, dtype):
    """A request's newest token and its 4 drafts, beside a prompt chunk: each of its 5 rows
    equals that token decoded alone, bit for bit (what keeps greedy speculation's tokens those
    of plain decoding), while the prompt chunk still goes to the prefill kernel."""
    if kernel == "triton" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter: one dtype covers the routing")
    gen = torch.Generator().manual_seed(4)
    bs, kvh, h, d, num_blocks = 16, 3, 9, 64, 40
    device = torch.device("cuda" if kernel == "triton-cuda" else "cpu")
    backend = CpuKernelBackend(bs) if kernel == "cpu" else TritonBackend(bs)
    k_cache, v_cache = (torch.randn(s, generator=gen).to(dtype).to(device)
                        for s in backend.cache_shapes(num_blocks, kvh, d))  # fmt: skip
    tables = torch.randperm(num_blocks, generator=gen).view(2, 20)
    cached = [100, 30]  # the decoding request, then a prompt chunk of 20 tokens
    new = [5, 20]
    q = torch.randn(sum(new), h, d, generator=gen).to(dtype).to(device)
    key, value = (torch.randn(sum(new), kvh, d, generator=gen).to(dtype).to(device)
                  for _ in range(2))  # fmt: skip
    slots = [int(tables[r, p // bs]) * bs + p % bs
             for r in range(2) for p in range(cached[r], cached[r] + new[r])]  # fmt: skip

    def step(query_start_loc, start_pos, table_rows, rows, decodes):
        meta = backend.build_metadata(query_start_loc, start_pos, tables[table_rows],
                                      torch.tensor([slots[i] for i in rows], device=device),
                                      device, decodes)  # fmt: skip
        return meta, backend.forward(q[rows], key[rows], value[rows], k_cache, v_cache, meta)

    meta, together = step([0, 5, 25], cached, [0, 1], list(range(25)), [5, 0])
    assert len(meta.decode_batch.rows) == 5 and meta.prefill_batch.chunks.tolist() == [[5, 20, 30]]
    for i in range(5):  # the same token as a plain decode, its drafts not yet in the cache
        _, alone = step([0, 1], [cached[0] + i], [0], [i], None)
        assert torch.equal(together[i], alone[0]), f"row {i}"


@pytest.mark.parametrize(("cache_dtype", "q_dtype"), [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.int8, torch.bfloat16), (torch.float8_e4m3fn, torch.bfloat16),
])  # fmt: skip
@pytest.mark.parametrize(("h", "kvh", "d"), [(9, 3, 64), (4, 1, 256)])
def test_cpu_draft_rows_read_their_cache_together_and_round_alone(cache_dtype, q_dtype, h, kvh,
                                                                 d):  # fmt: skip
    """Rows of one request (drafts, recomputed outputs: one block table, consecutive positions)
    each the bits it has decoded alone, for every cache dtype and its kernel: across a cut at 512
    positions (rows at 510 to 514), in parts (2,000), with a window, beside other requests."""
    gen = torch.Generator().manual_seed(9)
    bs, firsts, drafts = 16, [2000, 510, 40, 7], [5, 5, 5, 1]
    lens = [n + i for n, k in zip(firsts, drafts, strict=True) for i in range(k)]
    owner = [r for r, k in enumerate(drafts) for _ in range(k)]
    blocks = -(-max(lens) // bs)
    cpu = CpuKernelBackend(bs)
    shapes = cpu.cache_shapes(len(firsts) * blocks, kvh, d, is_scaled(cache_dtype))
    k_cache, v_cache = (torch.zeros(s, dtype=cache_dtype) for s in shapes)
    tables = torch.randperm(len(firsts) * blocks, generator=gen).view(len(firsts), blocks)
    slots = torch.tensor([int(tables[r, p // bs]) * bs + p % bs
                          for r in range(len(firsts)) for p in range(blocks * bs)])  # fmt: skip
    cpu.write_cache(k_cache, v_cache, *(torch.randn(len(slots), kvh, d, generator=gen)
                                        for _ in range(2)), slots)  # fmt: skip
    q = torch.randn(len(lens), h, d, generator=gen).to(q_dtype)
    row_tables, row_lens = tables[owner], torch.tensor(lens)

    def decode(rows, window):
        return cpu._ext.paged_decode_attention(q[rows].contiguous(), k_cache, v_cache,
                                               row_tables[rows], row_lens[rows], d**-0.5,
                                               window, 0.0, None)  # fmt: skip

    for window in (0, 300):
        together = decode(list(range(len(lens))), window)
        for row in range(len(lens)):
            assert torch.equal(decode([row], window)[0], together[row]), f"row {row}, {window}"


@pytest.mark.parametrize("kernel", ["cpu", pytest.param("triton", marks=INTERPRETED)])
def test_a_recomputed_chunk_attends_its_outputs_as_lone_decodes(kernel):
    """After a preemption a request recomputes its prompt and its outputs in one chunk: the
    prompt part goes to the prefill kernel, as when it was first computed, and each output row
    equals that token decoded alone, bit for bit, as it was first computed."""
    gen = torch.Generator().manual_seed(5)
    bs, kvh, h, d, num_blocks, prompt, outputs = 16, 3, 9, 64, 8, 37, 6
    backend = CpuKernelBackend(bs) if kernel == "cpu" else TritonBackend(bs)
    shapes = backend.cache_shapes(num_blocks, kvh, d)
    k_cache, v_cache = (torch.randn(s, generator=gen) for s in shapes)
    table = torch.randperm(num_blocks, generator=gen)[None]
    n = prompt + outputs
    q = torch.randn(n, h, d, generator=gen)
    key, value = (torch.randn(n, kvh, d, generator=gen) for _ in range(2))
    slots = torch.tensor([int(table[0, p // bs]) * bs + p % bs for p in range(n)])

    def step(first, count, decodes):
        rows = slice(first, first + count)
        meta = backend.build_metadata([0, count], [first], table, slots[rows], torch.device("cpu"),
                                      decodes)  # fmt: skip
        return meta, backend.forward(q[rows], key[rows], value[rows], k_cache, v_cache, meta)

    meta, recomputed = step(0, n, [outputs])
    assert len(meta.decode_batch.rows) == outputs
    assert meta.prefill_batch.chunks.tolist() == [[0, prompt, 0]]
    _, prompt_alone = step(0, prompt, [0])
    assert torch.equal(recomputed[:prompt], prompt_alone)
    for i in range(outputs):
        _, alone = step(prompt + i, 1, None)
        assert torch.equal(recomputed[prompt + i], alone[0]), f"output {i}"
    with pytest.raises(ValueError, match="do not fit the queries"):
        backend.build_metadata([0, 3], [0], table, slots[:3], torch.device("cpu"), [4])


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize(("dtype", "d"), [(torch.float32, 64), (torch.bfloat16, 64),
                                          (torch.float32, 48), (torch.float32, 256)])  # fmt: skip
def test_a_windowed_prompt_attends_alike_in_any_chunking(dtype, d, sinks):
    """A banded layer's prompt rows (Mistral's, Gemma's, gpt-oss's windows), bit for bit the
    same whether the prompt is one chunk or cut anywhere: every item reads the same aligned key
    tiles, so a row's online softmax groups its keys alike whichever chunk and item its query
    falls in (what keeps such a model's tokens independent of its batch's chunking)."""
    gen = torch.Generator().manual_seed(6)
    bs, kvh, h, num_blocks, n, window = 16, 2, 4, 8, 75, 21
    backend = CpuKernelBackend(bs)
    k_cache, v_cache = (torch.randn(s, generator=gen).to(dtype)
                        for s in backend.cache_shapes(num_blocks, kvh, d))  # fmt: skip
    table = torch.randperm(num_blocks, generator=gen)[None]
    q = torch.randn(n, h, d, generator=gen).to(dtype)
    key, value = (torch.randn(n, kvh, d, generator=gen).to(dtype) for _ in range(2))
    slots = torch.tensor([int(table[0, p // bs]) * bs + p % bs for p in range(n)])
    sink_logits = torch.randn(h, generator=gen) if sinks else None

    def chunked(cuts):
        out = []
        for a, b in zip([0, *cuts], [*cuts, n], strict=True):
            meta = backend.build_metadata(
                [0, b - a], [a], table, slots[a:b], torch.device("cpu"), [0]
            )  # (prompt rows, one-token chunks too)
            out.append(backend.forward(q[a:b], key[a:b], value[a:b], k_cache, v_cache, meta,
                                       window, sinks=sink_logits))  # fmt: skip
        return torch.cat(out)

    whole = chunked([])
    for cuts in ([1], [7], [16, 33], [23, 40, 41], [5, 29, 50, 70]):
        assert torch.equal(chunked(cuts), whole), f"cut at {cuts}"


def test_prefill_kernel_rejects_chunks_outside_its_inputs():
    backend = CpuKernelBackend(16)
    q = torch.randn(10, 4, 8)
    k_cache, v_cache = (torch.zeros(s) for s in backend.cache_shapes(4, 2, 8))
    tables = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="outside"):
        backend.prefill_kernel(q, k_cache, v_cache, torch.tensor([[5, 8, 0]]), tables,
                               torch.empty_like(q), 1.0, 0, 0.0, 8)  # fmt: skip
    with pytest.raises(RuntimeError, match="outside"):  # 30 cached + 8 new > 2 blocks of 16
        backend.prefill_kernel(q, k_cache, v_cache, torch.tensor([[0, 8, 30]]), tables,
                               torch.empty_like(q), 1.0, 0, 0.0, 8)  # fmt: skip


def test_kernels_refuse_caches_and_slots_they_cannot_index():
    backend = CpuKernelBackend(16)
    k_cache, v_cache = (torch.zeros(s) for s in backend.cache_shapes(4, 2, 8))
    rows = torch.zeros(2, 2, 8)
    with pytest.raises(RuntimeError, match="out of range"):
        backend.write_cache(k_cache, v_cache, rows, rows, torch.tensor([0, 64]))
    assert not k_cache.any() and not v_cache.any()  # checked before the first write
    with pytest.raises(RuntimeError, match=r"keys .* and values"):
        backend.write_cache(v_cache, v_cache, rows, rows, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="disagree"):
        backend.write_cache(k_cache, v_cache[:, :1].contiguous(), rows, rows, torch.tensor([0, 1]))
    q, tables = torch.randn(1, 4, 8), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="outside its block table"):  # 33 tokens > 2 blocks
        backend.decode_kernel(q, k_cache, v_cache, tables, torch.tensor([33]), 1.0, 0, 0.0)
    with pytest.raises(ValueError, match="even head_dim"):
        backend.cache_shapes(4, 2, 7)


def test_a_cache_of_keys_alone_refuses_what_it_cannot_hold_or_read():
    """Values that are not the keys themselves would be lost (a cache of keys alone stores
    none): refused before anything is written. Shapes whose values the kernels cannot read out
    of the keys (heads of other than multiples of 32 dims, blocks of other than multiples of 16
    positions) are refused by the attention calls, and never asked for (`values_from_keys`)."""
    backend = CpuKernelBackend(16)
    k_shape, v_shape = backend.cache_shapes(4, 1, 64)
    keys = torch.zeros(k_shape)
    rows, others = torch.randn(2, 1, 64), torch.randn(2, 1, 64)
    with pytest.raises(RuntimeError, match="values that are its keys"):
        backend.write_cache(keys, keys.view(v_shape), rows, others, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="values that are its keys"):  # equal, not the same
        backend.write_cache(keys, keys.view(v_shape), rows, rows.clone(), torch.tensor([0, 1]))
    assert not keys.any()
    narrow = CpuKernelBackend(8)
    assert not narrow.values_from_keys(64, torch.float32)
    assert not backend.values_from_keys(40, torch.float32)
    assert not backend.values_from_keys(64, torch.float16)
    k_shape, v_shape = narrow.cache_shapes(4, 1, 64)
    keys = torch.zeros(k_shape)
    q, tables = torch.randn(1, 4, 64), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="values read from keys need blocks"):
        narrow.decode_kernel(q, keys, keys.view(v_shape), tables, torch.tensor([3]), 1.0, 0, 0.0)


def test_make_backend_choices():
    cpu = torch.device("cpu")
    assert type(make_backend("torch", 16, cpu)) is TorchReferenceBackend
    assert type(make_backend("auto", 16, cpu)) is CpuKernelBackend
    gpu = torch.device("meta")  # stands for a CUDA device: only the choice is tested
    assert type(make_backend("auto", 16, gpu)) is TritonBackend
    # a block size the Triton kernel cannot tile: auto falls back, asking for it outright fails
    assert type(make_backend("auto", 12, gpu)) is TorchReferenceBackend
    with pytest.raises(ValueError, match="power-of-two block_size"):
        make_backend("triton", 12, gpu)
    # the C++ kernels read host memory: named for a GPU model, a clear error (not a crash)
    with pytest.raises(ConfigError, match=r"cpu attention backend .* reads host memory"):
        make_backend("cpu", 16, gpu)


def test_triton_backend_refuses_a_cpu_process_without_its_interpreter():
    """Triton imported before `TRITON_INTERPRET` was set cannot interpret: a clear error, not a
    failure deep inside the first decode."""
    code = (
        "import triton\n"
        "from inflight.attention.triton_backend import TritonBackend\n"
        "try:\n"
        "    TritonBackend(16)\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "TRITON_INTERPRET=1" in out.stdout


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.int8,
                                         torch.float8_e4m3fn])  # fmt: skip
@pytest.mark.parametrize("d", [64, 576])
@pytest.mark.parametrize(("bs", "window"), [(16, None), (32, 37)])
def test_cpu_kernels_read_values_out_of_keys(cache_dtype, d, bs, window):
    """A layer whose values are its keys (DeepSeek's latent rows) keeps one cache: its value
    cache a view of the keys' memory, written as keys alone. Prompt chunks and decodes of two
    steps give the same bits as two caches holding the same rows where the vector items read
    both (576 wide), and the reference's values at every width (64: where the AVX-512 items
    would read separate values); nothing is written past the keys. Blocks of 32 hold two tiles
    of 16 positions; a window starts a decode's values inside a tile."""
    if not CpuKernelBackend(bs)._ext.values_from_keys(bs, d, cache_dtype):
        pytest.skip("this CPU's kernels read values where they lie")
    gen = torch.Generator().manual_seed(3)
    backend, reference, h = CpuKernelBackend(bs), TorchReferenceBackend(bs), 16
    # (cached, new) tokens of 4 requests: prompts, then a decode or a chunk each
    steps = [[(0, 40), (0, 17), (0, 1), (0, 70)], [(40, 1), (17, 9), (1, 1), (70, 33)]]
    blocks = [-(-(a[1] + b[1]) // bs) for a, b in zip(*steps, strict=True)]
    num_blocks, scaled = 1 + sum(blocks), is_scaled(cache_dtype)
    k_shape, v_shape = backend.cache_shapes(num_blocks, 1, d, scaled)
    shared = torch.zeros(k_shape, dtype=cache_dtype)
    caches = {"shared": (shared, shared.view(v_shape)),
              "separate": (torch.zeros(k_shape, dtype=cache_dtype),
                           torch.zeros(v_shape, dtype=cache_dtype)),
              "reference": tuple(torch.zeros(shape, dtype=cache_dtype) for shape in
                                 reference.cache_shapes(num_blocks, 1, d, scaled))}  # fmt: skip
    tables = torch.nn.utils.rnn.pad_sequence(
        list(torch.arange(1, num_blocks).split(blocks)), batch_first=True
    )
    for step in steps:
        loc = [0]
        for _, new in step:
            loc.append(loc[-1] + new)
        slots = torch.tensor([int(tables[r, p // bs]) * bs + p % bs
                              for r, (cached, new) in enumerate(step)
                              for p in range(cached, cached + new)])  # fmt: skip
        q = torch.randn(loc[-1], h, d, generator=gen)
        key = torch.randn(loc[-1], 1, d, generator=gen)
        outs = {}
        for name, (k_cache, v_cache) in caches.items():
            kernel = reference if name == "reference" else backend
            meta = kernel.build_metadata(loc, [c for c, _ in step], tables, slots,
                                         torch.device("cpu"))  # fmt: skip
            outs[name] = kernel.forward(q, key, key, k_cache, v_cache, meta, window, d**-0.5)
        if d == 576:
            assert torch.equal(outs["shared"], outs["separate"])
        tol = 1e-5 if cache_dtype == torch.float32 else 2e-2
        torch.testing.assert_close(outs["shared"], outs["reference"], atol=tol, rtol=tol)
    keys = [caches[name][0].view(torch.uint8) for name in ("shared", "separate")]
    assert torch.equal(*keys)  # the same bytes (an 8-bit cache's scales among them)
