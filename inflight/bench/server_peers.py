"""Servers as peers, measured by `inflight bench serve`'s client: llama.cpp's `llama-server`
(parallel slots, continuous batching) and `inflight serve` itself, so that both servers are
measured the same way, over HTTP, with the same arrivals and the same token ids.

`llama-server` gets the same GGUF file, `--parallel N` slots (inflight's `max_num_seqs`), a
context of N x the workload's longest request (its slots share the context), continuous
batching, and every core for prompts and decodes. `inflight serve` gets the compare run's knobs.
Start-up is not measured; the peak memory of each server's process tree is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from inflight.bench.external_peer import tree_rss_kib
from inflight.bench.serve import run_rate
from inflight.workload.requests import WorkloadRequest
from inflight.workload.results import RunResult

# No SLO applies in a comparison: goodput is reported against generous bounds.
_SLO_TTFT_S, _SLO_TPOT_S = 3600.0, 3600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    cmd: list[str],
    url: str,
    ready: Any = lambda response: True,
    timeout_s: float = 600,
    log: Path | None = None,
    started: Any = lambda proc: None,
) -> subprocess.Popen:
    """Starts `cmd` in a session of its own (its output to `log`, if given; `started(proc)` is
    called at once) and waits until `url/health` answers 200 and `ready(response)` holds."""
    output = subprocess.DEVNULL if log is None else log.open("wb")
    try:
        proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    finally:
        if log is not None:
            output.close()  # the child holds its own descriptor
    started(proc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {' '.join(cmd)}")
        try:
            response = httpx.get(url + "/health", timeout=5)
            if response.status_code == 200 and ready(response):
                return proc
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1)
    stop_server(proc)
    raise TimeoutError(f"the server did not come up in {timeout_s:g} s: {' '.join(cmd)}")


def stop_server(proc: subprocess.Popen) -> None:
    # SIGTERM: a process started from a background job inherits SIGINT ignored
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def measure_server(
    name: str, proc: subprocess.Popen, url: str, model: str, workload: list[WorkloadRequest]
) -> RunResult:
    """The workload through the streaming completions API, the server's tree RSS sampled
    meanwhile; a failed request makes the run an error, never a fast result."""
    peak_kib, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak_kib[0] = max(peak_kib[0], tree_rss_kib(proc.pid))
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = asyncio.run(run_rate(url, model, workload, name, None, _SLO_TTFT_S, _SLO_TPOT_S))
    finally:
        done.set()
        sampler.join()
    run.peak_rss_mb = peak_kib[0] / 1024
    if run.extra["errors"]:
        run.error = f"{run.extra['errors']} of {len(workload)} requests failed"
    short = [r for r in run.requests if r.output_tokens < 1]
    if short:
        run.error = f"{len(short)} requests reported no output tokens"
    return run


def run_server(name: str, cmd: list[str], port: int, model: str,
               workload: list[WorkloadRequest]) -> RunResult:  # fmt: skip
    """Starts `cmd` (listening on `port`), measures the workload through it, stops it."""
    url = f"http://127.0.0.1:{port}"
    proc = start_server(cmd, url)
    try:
        return measure_server(name, proc, url, model, workload)
    finally:
        stop_server(proc)


def llama_server_cmd(binary: Path, gguf: Path, workload: list[WorkloadRequest], parallel: int,
                     port: int) -> list[str]:  # fmt: skip
    """`llama-server` with `parallel` slots sharing a context of that many times the workload's
    longest request, continuous batching, every core."""
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in workload)
    threads = str(os.cpu_count() or 1)
    return [str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(parallel), "--ctx-size", str(parallel * longest),
            "--cont-batching", "--threads", threads, "--threads-batch", threads,
            "--no-webui"]  # fmt: skip


def run_llama_server(
    binary: Path, gguf: Path, workload: list[WorkloadRequest], parallel: int
) -> RunResult:
    port = free_port()
    cmd = llama_server_cmd(binary, gguf, workload, parallel, port)
    return run_server("llama-server", cmd, port, gguf.stem, workload)


def serve_flags(knobs: dict[str, Any]) -> list[str]:
    """Engine knobs as `inflight serve` flags."""
    flags = []
    for name, value in knobs.items():
        if name == "model" or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def run_inflight_server(
    model: Path, workload: list[WorkloadRequest], knobs: dict[str, Any]
) -> RunResult:
    port = free_port()
    cmd = [sys.executable, "-m", "inflight", "serve", str(model), "--port", str(port),
           *serve_flags(knobs)]  # fmt: skip
    return run_server("inflight-serve", cmd, port, model.stem, workload)
