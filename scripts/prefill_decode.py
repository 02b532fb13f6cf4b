"""Prefill and decode speed of one request at a time on a GGUF file: inflight (an offline engine
per `--quantized-activations` mode asked for, each in a process of its own) and `llama-server`
(one slot, every core). Every runner loads once and stays up, idle while another runs; each
round runs each of them once, in alternating order, so that a ratio taken within a round
compares runs seconds apart (on a shared VM, whose speed drifts by tens of percent within a
minute, separate sittings per runner compare moments, not programs). Prefill: tokens per second
of a 512-token prompt (`--prompt-tokens`; one output token); decode: ms per token over 48 tokens
after an 8-token prompt. Prompts are random token ids, different in every round (no cache can
serve them). `--apart`: for a file two runners cannot hold in memory at once, each round starts
each runner, runs it and stops it before the next starts (slower: every round loads the file
again).

A mode may carry environment variables for its engine's process (`auto+INFLIGHT_ONEDNN_BF16=1`),
and `--checkout LABEL=DIR` runs every mode again from another checkout of this repository (a
`git worktree` of an earlier commit, its kernels built in DIR/.kernels), so that two builds
compare within each round.

    .venv/bin/python scripts/prefill_decode.py /tmp/llama3b-q4_k_m.gguf --llama-server BIN \\
        --modes int16,int8 --rounds 8 --out results/prefill_decode.json
    .venv/bin/python scripts/prefill_decode.py F --dtype auto \\
        --modes auto,auto+INFLIGHT_ONEDNN_BF16=1 --checkout before=/tmp/before --rounds 6
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

PROMPT, DECODE = 512, 48
PEER = "llama-server"


def prompts(seed: int, length: int) -> tuple[list[int], list[int]]:
    """The round's long prompt (`length` tokens, for prefill) and short one (for decode)."""
    rng = random.Random(seed)
    long = [rng.randrange(100, 30000) for _ in range(length)]
    return long, [rng.randrange(100, 30000) for _ in range(8)]


def inflight_worker(
    model: str, mode: str, dtype: str, seats: int, length: int, checkout: str, conn: Connection
) -> None:
    """Loads one engine (`mode`: quantized_activations, then `+KEY=VALUE` environment variables;
    from `checkout` where given), then answers each seed sent with that round's timings."""
    mode, *env = mode.split("+")
    os.environ.update(item.split("=", 1) for item in env)
    if checkout:
        sys.path.insert(0, checkout)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(Path(checkout) / ".kernels")
    from inflight import LLM, SamplingParams

    kv_bytes = (512 << 20) * -(-length // 1024)  # (a 3B model's 4,096 tokens: 0.9 GiB)
    llm = LLM(model, dtype=dtype, kv_cache_memory_bytes=kv_bytes, max_num_seqs=seats,
              enable_prefix_caching=False, quantized_activations=mode)  # fmt: skip

    def timed(tokens: list[int], n: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([tokens], params, use_tqdm=False)
        return time.perf_counter() - start

    timed([1, 2, 3], 2)
    conn.send("ready")
    while (seed := conn.recv()) is not None:
        long, short = prompts(seed, length)
        prefill = timed(long, 1)
        first, whole = timed(short, 1), timed(short, DECODE + 1)
        conn.send({"prefill_tok_s": length / prefill, "decode_ms": (whole - first) / DECODE * 1e3})


class InflightRunner:
    def __init__(
        self, model: str, mode: str, dtype: str, seats: int, length: int, checkout: str = ""
    ) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.conn, child = spawn.Pipe()
        worker_args = (model, mode, dtype, seats, length, checkout, child)
        self.process = spawn.Process(target=inflight_worker, args=worker_args, daemon=True)
        self.process.start()
        if self.conn.recv() != "ready":
            raise RuntimeError(f"inflight {mode} did not start")

    def run(self, seed: int) -> dict:
        self.conn.send(seed)
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join()


class LlamaServerRunner:
    def __init__(self, binary: str, model: str, length: int, port: int = 8099) -> None:
        self.length = length
        self.server = subprocess.Popen(
            [binary, "-m", model, "-c", str(max(4096, length + 64)), "-np", "1", "--port",
             str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.base = f"http://127.0.0.1:{port}"
        while True:
            try:
                urllib.request.urlopen(f"{self.base}/health", timeout=1).read()
                break
            except OSError:
                if self.server.poll() is not None:
                    raise RuntimeError("llama-server exited") from None
                time.sleep(0.5)
        self.complete([1, 2, 3], 2)

    def complete(self, tokens: list[int], n: int) -> dict:
        body = {"prompt": tokens, "n_predict": n, "ignore_eos": True, "temperature": 0,
                "cache_prompt": False}  # fmt: skip
        request = urllib.request.Request(f"{self.base}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        return json.loads(urllib.request.urlopen(request, timeout=900).read())["timings"]

    def run(self, seed: int) -> dict:
        long, short = prompts(seed, self.length)
        prefill = self.complete(long, 1)["prompt_per_second"]
        return {"prefill_tok_s": prefill,
                "decode_ms": self.complete(short, DECODE)["predicted_per_token_ms"]}  # fmt: skip

    def close(self) -> None:
        self.server.terminate()
        self.server.wait()


def summary(results: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each inflight run against the peer, round by round: the median of the rounds' ratios
    (prefill rate over the peer's; decode token time over the peer's) and how many rounds went
    inflight's way."""
    out = {}
    for name, runs in results.items():
        if name == PEER or PEER not in results:
            continue
        peer = results[PEER]
        prefill = [a["prefill_tok_s"] / b["prefill_tok_s"] for a, b in zip(runs, peer, strict=True)]
        decode = [a["decode_ms"] / b["decode_ms"] for a, b in zip(runs, peer, strict=True)]
        out[name] = {
            "prefill_ratio_median": statistics.median(prefill),
            "prefill_rounds_ahead": sum(r > 1 for r in prefill),
            "decode_time_ratio_median": statistics.median(decode),
            "decode_rounds_ahead": sum(r < 1 for r in decode),
            "rounds": len(runs),
        }
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--llama-server", help="llama-server binary (left out: inflight only)")
    parser.add_argument("--modes", default="int16,int8",
                        help="inflight quantized_activations, each with any +KEY=VALUE "
                        "environment variables for its engine")  # fmt: skip
    parser.add_argument("--dtype", default="float32", help="inflight's dtype (auto: its choice)")
    parser.add_argument("--checkout", action="append", default=[], metavar="LABEL=DIR",
                        help="every mode again from another checkout (kernels built in "
                        "DIR/.kernels)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=PROMPT,
        help="the timed prompt's length (a long one weighs attention)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=64,
                        help="inflight's seats (a model whose layers carry state per seat: "
                        "fewer, so that its slots fit beside the peer)")  # fmt: skip
    parser.add_argument("--apart", action="store_true",
                        help="one runner in memory at a time (each round loads each)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/prefill_decode.json"))
    args = parser.parse_args(argv)
    checkouts = [("", "")] + [tuple(c.split("=", 1)) for c in args.checkout]
    starters: dict[str, Callable[[], InflightRunner | LlamaServerRunner]] = {
        f"inflight {mode}" + (f" @{label}" if label else ""): functools.partial(
            InflightRunner,
            args.model,
            mode,
            args.dtype,
            args.max_num_seqs,
            args.prompt_tokens,
            str(Path(checkout).resolve()) if checkout else "",
        )
        for label, checkout in checkouts
        for mode in args.modes.split(",")
    }
    if args.llama_server:
        starters[PEER] = functools.partial(
            LlamaServerRunner, args.llama_server, args.model, args.prompt_tokens
        )
    runners: dict[str, InflightRunner | LlamaServerRunner] = {}
    try:
        if not args.apart:
            runners = {name: start() for name, start in starters.items()}
        results: dict[str, list[dict]] = {name: [] for name in starters}
        order = list(starters)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:  # a drift favours no one
                if args.apart:
                    runners[name] = starters[name]()
                got = runners[name].run(seed=r)
                if args.apart:
                    runners.pop(name).close()
                results[name].append(got)
                print(f"round {r + 1} {name}: prefill {got['prefill_tok_s']:.1f} tok/s, "
                      f"decode {got['decode_ms']:.1f} ms/token", flush=True)  # fmt: skip
    finally:
        for runner in runners.values():
            runner.close()
    ratios = summary(results)
    for name, s in ratios.items():
        print(f"{name} against {PEER}, medians of {s['rounds']} rounds: prefill "
              f"{s['prefill_ratio_median']:.2f}x its rate ({s['prefill_rounds_ahead']} rounds "
              f"ahead), decode {s['decode_time_ratio_median']:.2f}x its token time "
              f"({s['decode_rounds_ahead']} rounds ahead)")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"model": args.model, "prompt_tokens": args.prompt_tokens, "runs": results,
              "against_peer": ratios}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
