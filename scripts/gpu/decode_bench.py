"""On the GPU machine: decode throughput with CUDA graphs against eager, and the Triton decode
kernel alone against HBM bandwidth (`python decode_bench.py MODEL_FOLDER`).

Each engine generates once to warm up (compiles, first-use costs), then the timed run: 200-token
prompts, 100 greedy tokens each with `ignore_eos`, so nearly every step is a pure decode step.
"""

from __future__ import annotations

import sys
import time

import torch
import triton

from inflight import LLM, SamplingParams
from inflight.attention.triton_decode import paged_decode_attention


def engine_rates(model: str, batch: int) -> None:
    """Graphs, then eager; for a model with experts, eager with them routed on the host too."""
    prompts = [[(7 * i + j) % 40000 + 100 for j in range(200)] for i in range(batch)]
    params = SamplingParams(max_tokens=100, ignore_eos=True, temperature=0)
    tokens = {}
    for mode in ("graphs", "eager", "eager, experts routed on the host"):
        llm = LLM(model, max_num_seqs=256, enforce_eager=mode != "graphs")
        layers = [layer for layer in llm.core.loaded.model.layers if getattr(layer, "sparse", 0)]
        if mode.endswith("host"):
            if not layers:
                break
            for layer in layers:
                layer.stack = None
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens[mode] = [o.outputs[0].token_ids for o in outputs]
        print(f"{batch} x 100 tokens, {mode}: {wall:.3f} s, {batch * 100 / wall:.0f} tok/s")
        del llm
    for mode in list(tokens)[1:]:
        same = sum(a == b for a, b in zip(tokens["graphs"], tokens[mode], strict=True))
        print(f"  greedy outputs identical, graphs vs {mode}: {same}/{batch}")


def kernel_rates() -> None:
    """SmolLM2's heads (9 over 3 KV heads, dim 64), bf16, blocks of 16 in random order."""
    gen = torch.Generator().manual_seed(0)
    for reqs, context in ((32, 260), (128, 260), (32, 2000), (256, 1000)):
        blocks = reqs * (context // 16 + 1)
        k = torch.randn(blocks, 16, 3, 64, generator=gen).to(torch.bfloat16).cuda()
        v = torch.randn(blocks, 16, 3, 64, generator=gen).to(torch.bfloat16).cuda()
        tables = torch.randperm(blocks, generator=gen).view(reqs, -1).cuda()
        lens = torch.full((reqs,), context, device="cuda")
        q = torch.randn(reqs, 9, 64, device="cuda", dtype=torch.bfloat16)
        ms = triton.testing.do_bench(
            lambda q=q, k=k, v=v, t=tables, n=lens: paged_decode_attention(q, k, v, t, n, 0.125),
            return_mode="median",
        )
        gigabytes = 2 * reqs * context * 3 * 64 * 2 / 1e9
        print(
            f"decode kernel {reqs} x {context}: {ms * 1e3:.1f} us, {gigabytes / ms * 1e3:.0f} GB/s"
        )


if __name__ == "__main__":
    for batch in (1, 32, 128) if "--one-stream" in sys.argv else (32, 128):
        engine_rates(sys.argv[1], batch)
    if "--no-kernel" not in sys.argv:
        kernel_rates()
