"""Times one DeltaNet layer between its projections (`gated_delta_net`, csrc/gated_delta.cpp)
at Qwen3.5-0.8B's shape (16 value heads over 16 key heads of 128 dims, a kernel of 4) for
`--requests` requests: a decode step (a row each), and a step that verifies `--drafts` drafts
each (k + 1 rows a request), without and with the draft rows that speculation writes (the
state after each token but a request's last, `ConvState.keep_drafts`). Each request's state
matrices are rows of their own, as an engine's slots are; the best of 7 rounds of 20 calls.

    .venv/bin/python scripts/deltanet_kernels.py [--requests 16] [--drafts 3]
"""

from __future__ import annotations

import argparse

import torch
from attention_kernels import best_seconds  # (this folder's: run as a script)

from inflight.kernels import load_extension

HEADS, KEY_HEADS, KEY_DIM, VALUE_DIM, KERNEL = 16, 16, 128, 128, 4


def layer_call(requests: int, tokens: int, draft_rows: bool, dtype: torch.dtype):
    """A call of the layer over `requests` requests of `tokens` rows each, every request from
    its own state row; `draft_rows`: the state after each token but the last written too."""
    ext = load_extension()
    keys, values = KEY_HEADS * KEY_DIM, HEADS * VALUE_DIM
    width, back, rows = 2 * keys + values, KERNEL - 1, requests * tokens
    qkvz = torch.randn(rows, width + values, dtype=dtype)
    ba = torch.randn(rows, 2 * HEADS, dtype=dtype)
    weight = torch.randn(width, KERNEL, dtype=dtype)
    num_rows = requests * tokens  # a slot each, then k draft rows each
    conv = torch.zeros(num_rows, back, width, dtype=dtype)
    states = torch.zeros(num_rows, HEADS, KEY_DIM, VALUE_DIM)
    taps, keep, snapshots = [], [], [-1] * rows if draft_rows else []
    for r in range(requests):
        first = r * tokens
        inputs = [rows + r * back + j for j in range(back)] + list(range(first, first + tokens))
        taps += [inputs[j : j + KERNEL] for j in range(tokens)]
        keep += inputs[-back:]
        for i in range(tokens - 1 if draft_rows else 0):
            snapshots[first + i] = requests + r * (tokens - 1) + i
    args = (qkvz, ba, weight, conv, torch.tensor(taps).reshape(rows, KERNEL).t().contiguous(),
            torch.tensor(keep), torch.arange(requests), torch.arange(requests),
            torch.tensor(snapshots, dtype=torch.long), list(range(0, rows + 1, tokens)), states,
            -torch.rand(HEADS), torch.rand(HEADS), torch.ones(VALUE_DIM, dtype=dtype), 1e-6,
            KEY_HEADS, True)  # fmt: skip
    return lambda: ext.gated_delta_net(*args)


def best_ms(call) -> float:
    return best_seconds(call) * 1e3  # (the best of 7 rounds of 20 calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--drafts", type=int, default=3)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    n, k = args.requests, args.drafts
    decode = best_ms(layer_call(n, 1, False, dtype))
    verify = best_ms(layer_call(n, k + 1, False, dtype))
    drafting = best_ms(layer_call(n, k + 1, True, dtype))
    print(f"| step ({n} requests, {args.dtype}) | ms a layer | per token |")
    print("|---|---|---|")
    for name, ms, tokens in ((f"decode: {n} rows", decode, n),
                             (f"verify {k} drafts: {n * (k + 1)} rows", verify, n * (k + 1)),
                             ("the same, with draft rows", drafting, n * (k + 1))):  # fmt: skip
        print(f"| {name} | {ms:.2f} | {ms / tokens * 1e3:.1f} µs |")


if __name__ == "__main__":
    main()
