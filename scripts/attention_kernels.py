"""Times the CPU attention kernels on one model's head shapes (SmolLM2's by default: 9 query
heads over 3 KV heads of 64 dims; `--shape gemma3`: 4 over 1 of 256; `--shape deepseek`:
DeepSeek-V2-Lite's latent attention, 16 over 1 of 576), blocks of 16 tokens, one
layer per call: prompt chunks in GFLOP/s (causal multiply-adds counted once) and decodes in
GB/s of K/V read. The best of 7 rounds of 20 calls each, since a shared machine's speed drifts
between rounds. The decodes of `--layers` layers (30 by default: SmolLM2's) call every layer of
a step in turn over caches of their own, so that they are read from memory as an engine's
are, not from the CPU's caches. The last four lines take 8-bit caches under bf16 queries.
`--shape deepseek` times long requests' calls instead, its values apart or (`--values-in-keys`)
read out of its keys.

    .venv/bin/python scripts/attention_kernels.py [--shape gemma3]
    .venv/bin/python scripts/attention_kernels.py --shape deepseek --layers 27 [--values-in-keys]
"""

from __future__ import annotations

import argparse
import time

import torch

from inflight.attention.cpu_kernel import CpuKernelBackend
from inflight.huge_pages import empty_on_huge_pages

# query heads, KV heads, head dim
SHAPES = {"smollm2": (9, 3, 64), "gemma3": (4, 1, 256), "deepseek": (16, 1, 576)}
H, KVH, D = SHAPES["smollm2"]
BS = 16
backend = CpuKernelBackend(BS)


def best_seconds(call, rounds: int = 7, calls: int = 20) -> float:
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return min(times)


SCALED = (torch.int8, torch.float8_e4m3fn)  # 8-bit caches: a scale per position and head


VALUES_IN_KEYS = False  # `--values-in-keys`: one cache, its values read out of its keys


def caches(num_blocks: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """On huge pages where offered, as an engine's pool is, every slot written by the kernels'
    own write (8-bit rows with their scales)."""
    k_shape, v_shape = backend.cache_shapes(num_blocks, KVH, D, scaled=dtype in SCALED)
    k = empty_on_huge_pages(tuple(k_shape), dtype)
    v = k.view(v_shape) if VALUES_IN_KEYS else empty_on_huge_pages(tuple(v_shape), dtype)
    slots = torch.arange(num_blocks * BS)
    key = torch.randn(len(slots), KVH, D)
    backend.write_cache(k, v, key, key if VALUES_IN_KEYS else torch.randn(len(slots), KVH, D),
                        slots)  # fmt: skip
    return k, v


def prefill(new: list[int], cached: list[int], dtype: torch.dtype = torch.float32) -> str:
    blocks = [-(-(c + n) // BS) for n, c in zip(new, cached, strict=True)]
    k, v = caches(sum(blocks) + 1, dtype)
    tables = torch.zeros(len(new), max(blocks), dtype=torch.long)
    chunks, row, block = [], 0, 1
    for i, (n, c) in enumerate(zip(new, cached, strict=True)):
        tables[i, : blocks[i]] = torch.arange(block, block + blocks[i])
        block += blocks[i]
        chunks.append([row, n, c])
        row += n
    q_dtype = torch.bfloat16 if dtype in SCALED else dtype  # an 8-bit cache's engine's
    q = torch.randn(row, (H + 2 * KVH) * D).to(q_dtype)[:, : H * D].view(row, H, D)
    out = torch.empty(row, H, D, dtype=q_dtype)
    args = (q, k, v, torch.tensor(chunks), tables, out, D**-0.5, 0, 0.0, None)
    seconds = best_seconds(lambda: backend._ext.paged_prefill_attention(*args))
    flops = sum(4 * H * D * (c * n + n * (n + 1) / 2) for n, c in zip(new, cached, strict=True))
    return f"{seconds * 1e3:8.3f} ms  {flops / seconds / 1e9:6.1f} GFLOP/s"


def decode(requests: int, context: int, dtype: torch.dtype = torch.float32, layers: int = 1) -> str:
    """One call per layer over `layers` caches of their own: past one, a step's caches no longer
    fit the CPU's caches and are read from memory, as in an engine (blocks in order, as its pool
    hands them out); time and GB/s per step of all of them."""
    blocks = -(-context // BS)
    layer_caches = [caches(requests * blocks + 1, dtype) for _ in range(layers)]
    if layers == 1:
        tables = (torch.randperm(requests * blocks) + 1).view(requests, blocks)
    else:
        tables = (torch.arange(requests * blocks) + 1).view(requests, blocks)
    lens = torch.full((requests,), context, dtype=torch.long)
    q = torch.randn(requests, H, D).to(torch.bfloat16 if dtype in SCALED else dtype)

    def step() -> None:
        for k, v in layer_caches:
            backend._ext.paged_decode_attention(q, k, v, tables, lens, D**-0.5, 0, 0.0, None)

    seconds = best_seconds(step, calls=20 if layers == 1 else 2)
    # a key and a value row per position and head (an 8-bit row carries its scale)
    row_bytes = backend.cache_shapes(1, 1, D, dtype in SCALED)[1][-1] * dtype.itemsize
    rows = 1 if VALUES_IN_KEYS else 2  # (values read out of the keys: the same bytes)
    gb = layers * requests * context * KVH * rows * row_bytes / 1e9
    return f"{seconds * 1e3:8.3f} ms  {gb / seconds:6.1f} GB/s"


def long_request_calls(n: int) -> None:
    """Latent attention's: one or a few long requests over `n` layers."""
    print(f"decode, one of 2,000, {n} layers       ", decode(1, 2000, layers=n))
    print(f"decode, one of 2,000, bf16, {n} layers ", decode(1, 2000, torch.bfloat16, n))
    print(f"decode, 4 x 2,000, {n} layers          ", decode(4, 2000, layers=n))
    print(f"decode, 8 x 1,000, bf16, {n} layers    ", decode(8, 1000, torch.bfloat16, n))
    print("prefill, one prompt of 512 tokens     ", prefill([512], [0]))


def batch_calls(n: int) -> None:
    """Many requests' calls, prompts and decodes, every cache dtype; `n` layers where read
    from memory."""
    print("decode, one request of 300 tokens   ", decode(1, 300))
    print("prefill, 8 prompts of 256 tokens    ", prefill([256] * 8, [0] * 8))
    print("prefill, 4 prompts of 512 tokens    ", prefill([512] * 4, [0] * 4))
    print("prefill, 2,048 tokens after 1,024   ", prefill([2048], [1024]))
    print("decode, 64 requests of 400 tokens   ", decode(64, 400))
    print("decode, 16 requests of 1,500 tokens ", decode(16, 1500))
    print("decode, 64 x 400, bfloat16 cache    ", decode(64, 400, torch.bfloat16))
    print(f"decode, 8 x 4,000, bf16, {n} layers  ", decode(8, 4000, torch.bfloat16, layers=n))
    print(f"decode, 64 x 400, {n} layers         ", decode(64, 400, layers=n))
    for cache in SCALED:  # under bf16 queries, as a bf16 engine with that cache runs them
        name = "int8" if cache == torch.int8 else "fp8 "
        print(f"prefill, 2,048 after 1,024, {name}   ", prefill([2048], [1024], cache))
        print(f"decode, 8 x 4,000, {name}, {n} layers  ", decode(8, 4000, cache, layers=n))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="smollm2")
    parser.add_argument("--layers", type=int, default=30,
                        help="caches of the from-memory decodes (one per layer)")  # fmt: skip
    parser.add_argument("--values-in-keys", action="store_true",
                        help="one cache a layer, its values read out of its keys (latent "
                        "attention's, where the kernels take the shape)")  # fmt: skip
    args = parser.parse_args()
    H, KVH, D = SHAPES[args.shape]
    VALUES_IN_KEYS = args.values_in_keys
    (long_request_calls if args.shape == "deepseek" else batch_calls)(args.layers)
