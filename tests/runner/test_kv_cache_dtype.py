"""KV caches in another dtype than the model's (`kv_cache_dtype`): bf16, and the 8-bit ones
(int8, float8 e4m3) with a float32 scale per (position, head).

The reference backend's quantization is the oracle: the C++ write stores the same bytes, every
kernel (C++; Triton under its interpreter) attends over what the cache holds as the reference
does, and an engine's greedy tokens still depend on neither the batch nor preemption.
"""

from __future__ import annotations

import pytest
import torch

from inflight import LLM, SamplingParams
from inflight.attention import TorchReferenceBackend
from inflight.attention.backend import (
    dequantize_rows,
    is_scaled,
    quantize_rows,
    write_token_major,
)
from inflight.attention.cpu_kernel import CpuKernelBackend, to_kernel_layout
from inflight.attention.triton_backend import TritonBackend
from inflight.errors import ConfigError
from inflight.model.arch import LlamaArchConfig
from inflight.runner.kv_cache import kv_bytes_per_token, resolve_kv_cache_dtype
from tests.parity import random_prompts
from tests.runner.test_attention import GPU, INTERPRETED

CACHE_DTYPES = [torch.bfloat16, torch.int8, torch.float8_e4m3fn]
FP8 = torch.float8_e4m3fn
CPU = torch.device("cpu")


def test_8bit_rows_round_trip_within_their_type_s_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=gen) * torch.logspace(-3, 2, 50)[:, None, None]
    x[0, 0] = 0.0  # a row of zeros: scale 0, zeros back
    for dtype in (torch.int8, FP8):
        rows = quantize_rows(x, dtype)
        assert rows.shape == (50, 3, 68) and rows.dtype == torch.uint8
        back = dequantize_rows(rows.view(dtype))
        assert torch.equal(back[0, 0], torch.zeros(64))
        amax = x.abs().amax(-1, keepdim=True)
        if dtype == torch.int8:  # half a step of amax / 127
            assert ((back - x).abs() <= amax / 127 / 2 * 1.0001).all()
        else:  # 3 mantissa bits: within 2^-4 relative, or half the smallest subnormal step
            bound = torch.maximum(x.abs() * 2**-4, amax / 448 * 2**-10)
            assert ((back - x).abs() <= bound * 1.0001).all()
        assert torch.equal(rows[..., 64:].contiguous().view(torch.float32), amax / (
            127.0 if dtype == torch.int8 else 448.0))  # fmt: skip


def _kernel_to_token_major_bytes(k_cache, v_cache, d):
    """The C++ layout of an 8-bit cache as the reference's token-major bytes."""
    k, v = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    nb, kvh, _, bs, _ = k.shape
    keys = k[:, :, : d // 2].permute(0, 3, 1, 2, 4).reshape(nb, bs, kvh, d)
    key_scales = k[:, :, d // 2 :].reshape(nb, kvh, bs, 4).permute(0, 2, 1, 3)
    return torch.cat([keys, key_scales], -1), v.permute(0, 2, 1, 3)


def _written_by_both(key, value, slots, cache_dtype, num_blocks, bs=16):
    """Keys and values [T, KVH, D] written at `slots` by the reference and by the C++ kernel:
    the caches each holds, by backend name."""
    caches = {}
    kernel = CpuKernelBackend(bs)
    for backend, write in ((TorchReferenceBackend(bs), write_token_major),
                           (kernel, kernel.write_cache)):  # fmt: skip
        shapes = backend.cache_shapes(num_blocks, key.shape[1], key.shape[2],
                                      scaled=is_scaled(cache_dtype))  # fmt: skip
        k_cache, v_cache = (torch.zeros(s, dtype=cache_dtype) for s in shapes)
        write(k_cache, v_cache, key, value, slots)
        caches[backend.name] = (k_cache, v_cache)
    return caches


def _assert_same_contents(caches, d):
    ref_k, ref_v = caches["torch"]
    if is_scaled(ref_k.dtype):
        got_k, got_v = _kernel_to_token_major_bytes(*caches["cpu"], d)
        assert torch.equal(got_k, ref_k.view(torch.uint8))
        assert torch.equal(got_v, ref_v.view(torch.uint8))
    else:
        want_k, want_v = to_kernel_layout(ref_k, ref_v)
        got_k, got_v = caches["cpu"]
        assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
        assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))


@pytest.mark.parametrize("cache_dtype", [None, *CACHE_DTYPES], ids=str)  # None: the model's
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernel_write_stores_what_the_reference_stores(cache_dtype, dtype):
    """Tokens written at scattered slots by each backend: the C++ layout holds exactly the
    reference's values (or 8-bit bytes and scales), moved as `kv_layout.h` says."""
    cache_dtype = cache_dtype or dtype
    gen = torch.Generator().manual_seed(3)
    num_blocks, bs, kvh, d = 6, 16, 3, 64
    slots = torch.randperm(num_blocks * bs, generator=gen)[:40]
    qkv = torch.randn(40, 4 * kvh * d, generator=gen).to(dtype)  # strided rows, as in the model
    key = qkv[:, : kvh * d].view(40, kvh, d)
    value = qkv[:, kvh * d : 2 * kvh * d].view(40, kvh, d)
    caches = _written_by_both(key, value, slots, cache_dtype, num_blocks, bs)
    _assert_same_contents(caches, d)
    if cache_dtype == dtype:  # the layout itself, for the first token: keys [NB, KVH, D/2, BS, 2]
        block, offset = divmod(int(slots[0]), bs)
        keys, values = caches["cpu"]
        assert torch.equal(keys[block, :, :, offset].reshape(kvh, d), key[0])
        assert torch.equal(values[block, :, offset], value[0])


def _boundary_values(cache_dtype: torch.dtype) -> torch.Tensor:
    """Float32 values at and beside every point where a conversion into `cache_dtype` changes its
    rounding, for rows whose scale is 1: int8's half-integers, float8's midpoints between its
    values (subnormals among them), and for bfloat16 ties and their neighbours at every
    exponent, subnormals and infinities."""
    if cache_dtype == torch.bfloat16:
        gen = torch.Generator().manual_seed(5)
        bits = torch.randint(0, 2**31 - 1, (600,), generator=gen, dtype=torch.int64)
        bits = (bits & ~0xFFFF) | 0x8000  # exactly halfway between two bfloat16 values
        ties = bits.to(torch.int32).view(torch.float32)
        ties = ties[ties.isfinite()]
        small = torch.tensor([1e-40, 3e-39, 1e-45, 0.0, -0.0, float("inf"), float("-inf")])
    elif cache_dtype == torch.int8:
        ties = torch.arange(-127, 127) + 0.5
        small = torch.tensor([1e-40, 0.0, -0.0, 127.0, -127.0])
    else:
        finite = torch.arange(0, 0x7F, dtype=torch.int16).to(torch.uint8).view(FP8).float()
        ties = (finite[:-1] + finite[1:]) / 2
        ties = torch.cat([ties, -ties, ties * (1 - 2**-20)])
        small = torch.tensor([1e-40, 2**-10, 0.0, -0.0, 448.0, -448.0])
    near = torch.cat([ties.nextafter(torch.tensor(float("inf"))),
                      ties.nextafter(torch.tensor(float("-inf")))])  # fmt: skip
    return torch.cat([ties, near, small])


@pytest.mark.parametrize("d", [64, 70])  # 70: a tail past the vectors' lanes
@pytest.mark.parametrize(
    ("cache_dtype", "dtype"),
    [(c, m) for c in CACHE_DTYPES for m in (torch.float32, torch.bfloat16) if c != m],
    ids=str,
)  # a bfloat16 model's own cache is copied, not converted
def test_kernel_write_rounds_every_boundary_as_the_reference_does(cache_dtype, dtype, d):
    """The C++ write's vector conversions give the reference's bytes where rounding is hardest:
    every tie of each 8-bit type at scale 1 (each row also holds the type's largest value,
    which sets the scale), bfloat16 ties at random exponents, subnormals, signed zeros, rows of
    zeros, and rows of every magnitude."""
    values = _boundary_values(cache_dtype).to(dtype).float()
    per_row = d - 1
    rows = -(-len(values) // per_row)
    x = torch.zeros(rows * per_row)
    x[: len(values)] = values
    largest = {torch.int8: 127.0, FP8: 448.0, torch.bfloat16: 1.0}[cache_dtype]
    x = torch.cat([torch.full((rows, 1), largest), x.view(rows, per_row)], 1)
    gen = torch.Generator().manual_seed(7)
    spread = torch.randn(rows, d, generator=gen) * torch.logspace(-38, 37, rows)[:, None]
    x = torch.cat([x, spread, torch.zeros(1, d)]).to(dtype)
    tokens = len(x) - len(x) % 2
    key, value = x[:tokens].view(tokens // 2, 2, d), x[1 : tokens + 1].view(tokens // 2, 2, d)
    num_blocks = -(-tokens // 2 // 16)
    slots = torch.randperm(num_blocks * 16, generator=gen)[: tokens // 2]
    _assert_same_contents(_written_by_both(key, value, slots, cache_dtype, num_blocks), d)


@pytest.mark.parametrize(
    ("kernel", "cache_dtype"),
    [
        *(pytest.param("triton", c, marks=INTERPRETED) for c in (torch.int8, FP8)),
        *(pytest.param("triton-cuda", c, marks=GPU) for c in (torch.int8, FP8)),
    ],
)  # fmt: skip
def test_triton_write_stores_what_the_reference_stores(kernel, cache_dtype):
    """The Triton backend's one-launch write of an 8-bit cache: the reference's bytes exactly
    (rows of small and large magnitudes, a row of zeros, keys a strided view)."""
    device = torch.device("cuda" if kernel == "triton-cuda" else "cpu")
    gen = torch.Generator().manual_seed(5)
    num_blocks, bs, kvh, d = 6, 16, 3, 64
    slots = torch.randperm(num_blocks * bs, generator=gen)[:40].to(device)
    qkv = torch.randn(40, 4 * kvh * d, generator=gen) * torch.logspace(-4, 3, 40)[:, None]
    qkv[7] = 0.0
    qkv = qkv.to(device)
    key = qkv[:, : kvh * d].view(40, kvh, d)
    value = qkv[:, kvh * d : 2 * kvh * d].view(40, kvh, d)
    triton = TritonBackend(bs)
    caches = []
    for write in (write_token_major, triton.write_cache):
        shapes = triton.cache_shapes(num_blocks, kvh, d, scaled=True)
        k_cache, v_cache = (torch.zeros(s, dtype=cache_dtype, device=device) for s in shapes)
        write(k_cache, v_cache, key, value, slots)
        caches.append((k_cache.view(torch.uint8), v_cache.view(torch.uint8)))
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])


# (tokens cached, new tokens) per request: fresh and continued prompt chunks, decodes; windows
# of 37 leave some inside, some beyond. SMALL: what Triton's interpreter can run in seconds.
SHAPES = ([0, 17, 64, 100, 3, 50, 200, 7], [2, 33, 16, 47, 70, 1, 1, 1])
SMALL = ([0, 20, 3, 50], [2, 30, 1, 1])


def _mixed_step(backend, dtype, cache_dtype, d, window, device=CPU, shapes=SHAPES):
    """Tokens cached by one prompt step, then a step of prompt chunks (fresh and continued) and
    decodes over them, every K/V written by the backend itself: its output for the second."""
    gen = torch.Generator().manual_seed(0)
    bs, kvh, h, num_blocks = 16, 3, 9, 200
    cache_shapes = backend.cache_shapes(num_blocks, kvh, d, scaled=is_scaled(cache_dtype))
    k_cache, v_cache = (torch.zeros(s, dtype=cache_dtype, device=device) for s in cache_shapes)
    cached, new = shapes
    total = [c + n for c, n in zip(cached, new, strict=True)]
    tables = torch.randperm(num_blocks, generator=gen)[: len(new) * 20].view(-1, 20)
    keys = [torch.randn(t, kvh, d, generator=gen).to(dtype) for t in total]
    values = [torch.randn(t, kvh, d, generator=gen).to(dtype) for t in total]

    def step(rows, spans):
        starts = [0]
        for lo, hi in spans:
            starts.append(starts[-1] + hi - lo)
        positions = [(r, p) for r, (lo, hi) in zip(rows, spans, strict=True)
                     for p in range(lo, hi)]  # fmt: skip
        slots = [int(tables[r, p // bs]) * bs + p % bs for r, p in positions]
        meta = backend.build_metadata(starts, [lo for lo, _ in spans], tables[rows],
                                      torch.tensor(slots, device=device), device)  # fmt: skip
        q = torch.randn(starts[-1], h, d, generator=gen).to(dtype)
        k = torch.cat([keys[r][lo:hi] for r, (lo, hi) in zip(rows, spans, strict=True)])
        v = torch.cat([values[r][lo:hi] for r, (lo, hi) in zip(rows, spans, strict=True)])
        q, k, v = q.to(device), k.to(device), v.to(device)
        return backend.forward(q, k, v, k_cache, v_cache, meta, window).cpu()

    history = [r for r, c in enumerate(cached) if c]
    step(history, [(0, cached[r]) for r in history])
    return step(list(range(len(new))), list(zip(cached, total, strict=True)))


@pytest.mark.parametrize("window", [None, 37])
@pytest.mark.parametrize("d", [64, 128, 32], ids=["d64", "d128", "d32-generic"])
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_kernels_attend_over_the_cache_as_the_reference_does(dtype, cache_dtype, d, window):
    """Decodes and prompt chunks, each kernel path (the vector items at head_dims 64 and 128,
    a window's tiles that are no aligned slice of a block, the generic loop at 32): the
    kernels' result equals the reference's over the same cache contents, and an 8-bit cache
    stays near the exact float32 result."""
    ref = _mixed_step(TorchReferenceBackend(16), dtype, cache_dtype, d, window)
    got = _mixed_step(CpuKernelBackend(16), dtype, cache_dtype, d, window)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)
    exact = _mixed_step(TorchReferenceBackend(16), torch.float32, torch.float32, d, window)
    worst = {torch.bfloat16: 0.03, torch.int8: 0.05, FP8: 0.3}[cache_dtype]
    assert (got.float() - exact).abs().max() < worst


# (query heads, KV heads, head dim): every grouping of 1 to 8 query heads per KV head that the
# AVX-512 8-bit item specialises, at each head dim it takes (SmolLM2's, Llama's, Gemma's)
HEAD_SHAPES = [(9, 3, 64), (8, 8, 64), (4, 2, 64), (8, 2, 128), (10, 2, 128), (12, 2, 256),
               (4, 1, 256), (7, 1, 64), (8, 1, 128)]  # fmt: skip


@pytest.mark.parametrize(("h", "kvh", "d"), HEAD_SHAPES)
@pytest.mark.parametrize("cache_dtype", [torch.int8, FP8], ids=str)
def test_8bit_decodes_match_the_reference_at_every_head_grouping(h, kvh, d, cache_dtype):
    """Decodes over 8-bit caches, contexts of 1 to 3 parts of 512 positions, with and without
    a window, sinks or a soft cap, in float32 and bf16: the C++ kernel's rows equal the
    reference's over the same cached bytes, and each row is the same bits alone as in its
    batch."""
    gen = torch.Generator().manual_seed(h * d + kvh)
    bs, lens = 16, [1100, 513, 40, 1, 300]
    blocks = -(-max(lens) // bs)
    tables = torch.randperm(len(lens) * blocks, generator=gen).view(len(lens), blocks)
    slots = [torch.tensor([int(tables[r, p // bs]) * bs + p % bs for p in range(n)])
             for r, n in enumerate(lens)]  # fmt: skip
    keys = [torch.randn(n, kvh, d, generator=gen) for n in lens]
    values = [torch.randn(n, kvh, d, generator=gen) for n in lens]
    cpu, reference = CpuKernelBackend(bs), TorchReferenceBackend(bs)
    caches = {}
    for backend, write in ((reference, write_token_major), (cpu, cpu.write_cache)):
        shapes = backend.cache_shapes(len(lens) * blocks, kvh, d, scaled=True)
        k_cache, v_cache = (torch.zeros(s, dtype=cache_dtype) for s in shapes)
        for r in range(len(lens)):
            write(k_cache, v_cache, keys[r], values[r], slots[r])
        caches[backend] = (k_cache, v_cache)
    sinks = torch.randn(h, generator=gen) * 2

    def decode(backend, dtype, rows, window, softcap, sinks):
        last = torch.tensor([int(slots[r][-1]) for r in rows])
        meta = backend.build_metadata(list(range(len(rows) + 1)), [lens[r] - 1 for r in rows],
                                      tables[rows], last, CPU)  # fmt: skip
        key = torch.stack([keys[r][-1] for r in rows]).to(dtype)  # rewritten as they were
        value = torch.stack([values[r][-1] for r in rows]).to(dtype)
        return backend.forward(q[rows].to(dtype), key, value, *caches[backend], meta, window,
                               softcap=softcap, sinks=sinks)  # fmt: skip

    q = torch.randn(len(lens), h, d, generator=gen)
    everyone = list(range(len(lens)))
    for dtype in (torch.float32, torch.bfloat16):
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for window, softcap, sink in ((None, None, None), (300, None, None),
                                      (None, None, sinks), (None, 1.0, None)):  # fmt: skip
            together = decode(cpu, dtype, everyone, window, softcap, sink)
            want = decode(reference, dtype, everyone, window, softcap, sink)
            torch.testing.assert_close(together.float(), want.float(), atol=tol, rtol=tol)
            for r in (0, 3):
                alone = decode(cpu, dtype, [r], window, softcap, sink)
                assert torch.equal(alone[0], together[r]), f"request {r}"


@pytest.mark.parametrize("cache_dtype", [torch.int8, FP8], ids=str)
def test_every_8bit_value_reads_back_exactly(cache_dtype):
    """A one-token context's output is its value row times its scale, exactly, decoded or as a
    prompt: rows holding every byte (all 254 finite float8 ones, subnormals and both zeros
    among them) read back as the type's values, through each kernel's widening."""
    kvh, d, bs = 1, 64, 16
    patterns = torch.arange(256, dtype=torch.int16).to(torch.uint8)
    if cache_dtype == FP8:
        patterns = patterns[(patterns & 0x7F) != 0x7F]  # e4m3's two NaNs are never stored
    n = -(-len(patterns) // d)
    row_bytes = torch.zeros(n * d, dtype=torch.uint8)
    row_bytes[: len(patterns)] = patterns
    cpu = CpuKernelBackend(bs)
    k_shape, v_shape = cpu.cache_shapes(n, kvh, d, scaled=True)
    k_cache, v_cache = (
        torch.zeros(k_shape, dtype=cache_dtype),
        torch.zeros(v_shape, dtype=cache_dtype),
    )
    v_bytes = v_cache.view(torch.uint8)
    v_bytes[:, 0, 0, :d] = row_bytes.view(n, d)  # position 0 of block i: request i's token
    v_bytes[:, 0, 0, d:] = torch.tensor([0.5]).view(torch.uint8)  # its scale
    want = row_bytes.view(n, d).view(cache_dtype).float() * 0.5
    tables = torch.arange(n).view(n, 1)
    chunks = torch.tensor([[i, 1, 0] for i in range(n)])  # (first row, new tokens, cached)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(n, 1, d).to(dtype)
        decoded = cpu._ext.paged_decode_attention(q, k_cache, v_cache, tables,
                                                  torch.ones(n, dtype=torch.long), 0.125, 0,
                                                  0.0, None)  # fmt: skip
        prompted = torch.empty_like(q)
        cpu._ext.paged_prefill_attention(q, k_cache, v_cache, chunks, tables, prompted, 0.125, 0,
                                         0.0, None)  # fmt: skip
        for out in (decoded, prompted):
            assert torch.equal(out[:, 0].float(), want.to(dtype).float())


@pytest.mark.parametrize(
    ("kernel", "dtype", "cache_dtype"),
    [
        pytest.param("triton", torch.float32, torch.int8, marks=INTERPRETED),
        pytest.param("triton", torch.float32, FP8, marks=INTERPRETED),
        *(pytest.param("triton-cuda", dtype, cache_dtype, marks=GPU)
          for dtype in (torch.float32, torch.bfloat16) for cache_dtype in CACHE_DTYPES),
    ],
)  # fmt: skip
def test_triton_kernels_attend_over_the_cache_as_the_reference_does(kernel, dtype, cache_dtype):
    """Under the interpreter (float32 queries, the 8-bit caches: the other pairs change no
    tiling), and every pair compiled for a GPU where there is one."""
    device = torch.device("cuda" if kernel == "triton-cuda" else "cpu")
    shapes = SMALL if kernel == "triton" else SHAPES
    ref = _mixed_step(TorchReferenceBackend(16), dtype, cache_dtype, 64, 37, device, shapes)
    got = _mixed_step(TritonBackend(16), dtype, cache_dtype, 64, 37, device, shapes)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


def test_bytes_per_token_count_the_scales_and_dtypes_are_checked():
    arch = LlamaArchConfig("llama", vocab_size=10, hidden_size=576, intermediate_size=1536,
                           num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                           rms_norm_eps=1e-5, rope_theta=1e4, max_position_embeddings=64,
                           tie_word_embeddings=True)  # fmt: skip
    assert kv_bytes_per_token(arch, torch.float32) == 2 * 30 * 3 * 64 * 4
    assert kv_bytes_per_token(arch, torch.bfloat16) == 2 * 30 * 3 * 64 * 2
    assert kv_bytes_per_token(arch, torch.int8) == 2 * 30 * 3 * (64 + 4)
    assert resolve_kv_cache_dtype("auto", torch.float32) == torch.float32
    assert resolve_kv_cache_dtype("fp8", torch.bfloat16) == FP8
    with pytest.raises(ConfigError, match="float32 or bfloat16 model"):
        resolve_kv_cache_dtype("int8", torch.float16)
    with pytest.raises(ConfigError, match="kv_cache_dtype must be"):
        LLM(kv_cache_dtype="int4")


@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_greedy_tokens_depend_on_neither_batch_nor_preemption(tiny_llama, kv_cache_dtype):
    """16 prompts together in a pool small enough to force preemptions (recompute and swap)
    decode the same tokens as each prompt alone, over an 8-bit cache (one byte a value, and a
    4-byte scale per position and head). On the CPU, whose kernels promise it."""
    prompts = random_prompts(vocab_size=200)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    knobs = {"dtype": "float32", "device": "cpu", "kv_cache_dtype": kv_cache_dtype}
    alone = LLM(str(tiny_llama), **knobs, max_num_seqs=1)
    want = [o.outputs[0].token_ids for o in alone.generate(prompts, params, use_tqdm=False)]
    arch, cache = alone.core.arch, alone.core.kv_cache
    assert cache.layers[0][0].dtype == {"int8": torch.int8, "fp8": FP8}[kv_cache_dtype]
    per_token = 2 * arch.num_layers * arch.num_kv_heads * (arch.head_dim + 4)
    assert cache.num_bytes == per_token * cache.block_size * cache.num_blocks
    for mode in ("recompute", "swap"):
        llm = LLM(str(tiny_llama), **knobs, kv_block_size=4, num_kv_blocks=40,
                  max_num_batched_tokens=96, preemption_mode=mode)  # fmt: skip
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.core.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
        assert got == want, mode
