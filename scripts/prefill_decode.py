"""Prefill and decode speed of one request at a time on a GGUF file: inflight (offline engine,
each `--quantized-activations` mode asked for) and `llama-server` (one slot, every core), in
alternating rounds on the same machine. Prefill: tokens per second of a 512-token prompt (one
output token); decode: ms per token over 48 tokens after an 8-token prompt. Prompts are random
token ids, different in every run (no cache can serve them).

    .venv/bin/python scripts/prefill_decode.py /tmp/llama3b-q4_k_m.gguf --llama-server BIN \\
        --modes int16,int8 --rounds 2 --out results/prefill_decode.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

PROMPT, DECODE = 512, 48


def prompts(seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    long = [rng.randrange(100, 30000) for _ in range(PROMPT)]
    return long, [rng.randrange(100, 30000) for _ in range(8)]


def inflight_run(model: str, mode: str, seed: int) -> dict:
    """One engine per round, so each round pays the same start-up."""
    from inflight import LLM, SamplingParams

    llm = LLM(model, dtype="float32", kv_cache_memory_bytes=512 << 20,
              enable_prefix_caching=False, quantized_activations=mode)  # fmt: skip
    long, short = prompts(seed)

    def timed(tokens: list[int], n: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([tokens], params, use_tqdm=False)
        return time.perf_counter() - start

    prefill = timed(long, 1)
    first, whole = timed(short, 1), timed(short, DECODE + 1)
    return {"prefill_tok_s": PROMPT / prefill, "decode_ms": (whole - first) / DECODE * 1e3}


def llama_server_run(binary: str, model: str, seed: int, port: int = 8099) -> dict:
    server = subprocess.Popen([binary, "-m", model, "-c", "4096", "-np", "1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError("llama-server exited") from None
                time.sleep(0.5)

        def complete(tokens: list[int], n: int) -> dict:
            body = {"prompt": tokens, "n_predict": n, "ignore_eos": True, "temperature": 0,
                    "cache_prompt": False}  # fmt: skip
            request = urllib.request.Request(f"{base}/completion", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
            return json.loads(urllib.request.urlopen(request, timeout=900).read())["timings"]

        long, short = prompts(seed)
        prefill = complete(long, 1)["prompt_per_second"]
        return {
            "prefill_tok_s": prefill,
            "decode_ms": complete(short, DECODE)["predicted_per_token_ms"],
        }
    finally:
        server.terminate()
        server.wait()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--llama-server", help="llama-server binary (left out: inflight only)")
    parser.add_argument("--modes", default="int16,int8", help="inflight quantized_activations")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/prefill_decode.json"))
    args = parser.parse_args(argv)
    runs = [(f"inflight {m}", m) for m in args.modes.split(",")]
    if args.llama_server:
        runs.append(("llama-server", None))
    results: dict[str, list[dict]] = {name: [] for name, _ in runs}
    for r in range(args.rounds):
        for name, mode in runs if r % 2 == 0 else runs[::-1]:  # a drift favours no one
            if mode is None:
                got = llama_server_run(args.llama_server, args.model, seed=r)
            else:  # in a process of its own, whose memory is all returned before the next run
                spawn = multiprocessing.get_context("spawn")
                with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                    got = pool.submit(inflight_run, args.model, mode, r).result()
            results[name].append(got)
            print(f"round {r + 1} {name}: prefill {got['prefill_tok_s']:.1f} tok/s, "
                  f"decode {got['decode_ms']:.1f} ms/token", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": args.model, "runs": results}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
