"""`inflight bench memory`: what serving a model costs in memory, `inflight serve` against
`llama-server` on the same GGUF file.

Each server is started alone; its process tree's resident memory is sampled from the start,
through loading and a short workload over HTTP, to its stop. The peak is split into weights,
KV pool, the state some layers carry per sequence in place of KV (recurrent layers': sized by
the seats as the pool is) and the rest (the runtime: Python, torch, scratch, allocator slack):
inflight reports its own weights', pool's and state's bytes on /metrics; for `llama-server` the
weights are the file (it maps it), the pool and the state the figures it logs. Start-up is the
time until /health answers, also per GB of file. The target the report checks: inflight's peak
RSS within file size + KV pool + state + 1 GiB.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from inflight.bench.external_peer import tree_rss_kib
from inflight.bench.serve import run_rate
from inflight.bench.server_peers import (
    free_port,
    llama_server_cmd,
    serve_flags,
    start_server,
    stop_server,
)
from inflight.model.gguf_loader import read_gguf_index
from inflight.model.loader import model_file_bytes
from inflight.runner.conv_state import sequence_state_bytes
from inflight.runner.kv_cache import kv_bytes_per_token
from inflight.workload.requests import WorkloadRequest

GIB = 2**30
# what a server may take beyond its file and KV pool: the runtime's share of the target
RUNTIME_ALLOWANCE = GIB


@dataclass
class MemoryRun:
    server: str
    file_bytes: int
    ready_s: float = 0.0
    peak_rss_bytes: int = 0
    weight_bytes: int | None = None
    kv_bytes: int | None = None
    state_bytes: int = 0  # (recurrent layers' per-sequence state)
    error: str | None = None

    @property
    def runtime_bytes(self) -> int | None:
        if self.weight_bytes is None or self.kv_bytes is None:
            return None
        return self.peak_rss_bytes - self.weight_bytes - self.kv_bytes - self.state_bytes

    @property
    def target_bytes(self) -> int | None:
        """File + KV pool + state + the runtime allowance: the peak inflight is to stay
        within."""
        if self.kv_bytes is None:
            return None
        return self.file_bytes + self.kv_bytes + self.state_bytes + RUNTIME_ALLOWANCE


class PeakRss:
    """Samples a process tree's RSS every 0.1 s on a thread of its own until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib = pid, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak_kib = max(self.peak_kib, tree_rss_kib(self.pid))
            self._done.wait(0.1)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak_kib * 1024


def metric(text: str, name: str) -> float | None:
    """An unlabelled sample's value from Prometheus text."""
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def measure(name: str, cmd: list[str], port: int, model_name: str, file_bytes: int,
            workload: list[WorkloadRequest], log: Path, f16_bytes_per_token: int = 0,
            f32_state_bytes: int = 0) -> MemoryRun:  # fmt: skip
    """Starts `cmd`, measures its start-up and peak RSS through the workload, stops it."""
    run = MemoryRun(server=name, file_bytes=file_bytes)
    url = f"http://127.0.0.1:{port}"
    sampler: list[PeakRss] = []
    start = time.monotonic()
    try:
        proc = start_server(cmd, url, log=log, started=lambda p: sampler.append(PeakRss(p.pid)))
    except (RuntimeError, TimeoutError) as e:
        run.error = str(e)
        if sampler:
            run.peak_rss_bytes = sampler[0].stop()
        return run
    run.ready_s = time.monotonic() - start
    try:
        result = asyncio.run(run_rate(url, model_name, workload, name, None, 3600.0, 3600.0))
        if result.extra["errors"]:
            run.error = f"{result.extra['errors']} of {len(workload)} requests failed"
        if name == "inflight-serve":
            text = httpx.get(url + "/metrics", timeout=30).text
            weights = metric(text, "inflight_model_weights_bytes")
            kv = metric(text, "inflight_kv_cache_bytes")
            run.weight_bytes = None if weights is None else int(weights)
            run.kv_bytes = None if kv is None else int(kv)
            run.state_bytes = int(metric(text, "inflight_sequence_state_bytes") or 0)
    finally:
        stop_server(proc)
        run.peak_rss_bytes = sampler[0].stop()
    if name == "llama-server":
        run.weight_bytes = file_bytes  # mapped whole
        text = log.read_text(errors="replace")
        run.kv_bytes = llama_server_kv_bytes(text, f16_bytes_per_token)
        run.state_bytes = llama_server_state_bytes(text, f32_state_bytes)
    return run


def llama_server_state_bytes(log: str, f32_bytes_per_sequence: int) -> int:
    """The recurrent layers' state from llama.cpp's start-up log (`RS buffer size = X MiB` per
    buffer) where it logs it, else its slots (`n_slots = S`) times a sequence's state in its
    default float32 (0 without recurrent layers)."""
    sizes = re.findall(r"RS buffer size =\s*([\d.]+) MiB", log)
    if sizes:
        return int(sum(float(s) for s in sizes) * 2**20)
    slots = re.search(r"n_slots = (\d+)", log)
    return 0 if slots is None else int(slots.group(1)) * f32_bytes_per_sequence


def llama_server_kv_bytes(log: str, f16_bytes_per_token: int) -> int | None:
    """The KV cache's size from llama.cpp's start-up log: `llama_kv_cache: size = X MiB` per
    cache (two where a model mixes sliding-window layers) where it logs them, else its slots
    times their context (`n_slots = S, n_ctx_slot = C`) in its default f16 cache."""
    sizes = re.findall(r"llama_kv_cache: size =\s*([\d.]+) MiB", log)
    if sizes:
        return int(sum(float(s) for s in sizes) * 2**20)
    slots = re.search(r"n_slots = (\d+), n_ctx_slot = (\d+)", log)
    if slots is None:
        return None
    return int(slots.group(1)) * int(slots.group(2)) * f16_bytes_per_token


def run_memory(model: Path, workload: list[WorkloadRequest], knobs: dict[str, Any],
               llama_server: Path | None, out: Path) -> list[MemoryRun]:  # fmt: skip
    """inflight serve, then llama-server when given, each alone on the same file."""
    out.mkdir(parents=True, exist_ok=True)
    file_bytes = model_file_bytes(model)
    runs = []
    port = free_port()
    cmd = [sys.executable, "-m", "inflight", "serve", str(model), "--port", str(port),
           *serve_flags(knobs)]  # fmt: skip
    runs.append(measure("inflight-serve", cmd, port, model.stem, file_bytes, workload,
                        out / "inflight-serve.log"))  # fmt: skip
    if llama_server is not None:
        port = free_port()
        parallel = knobs.get("max_num_seqs") or 64
        cmd = llama_server_cmd(llama_server, model, workload, parallel, port)
        arch = read_gguf_index(model).arch
        f16_bytes_per_token = kv_bytes_per_token(arch, torch.float16)
        runs.append(measure("llama-server", cmd, port, model.stem, file_bytes, workload,
                            out / "llama-server.log", f16_bytes_per_token,
                            sequence_state_bytes(arch, torch.float32)))  # fmt: skip
    write_report(runs, model, out)
    return runs


def _gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f}"


def write_report(runs: list[MemoryRun], model: Path, out: Path) -> None:
    (out / "memory.json").write_text(json.dumps(
        {"model": str(model), "runs": [asdict(r) | {"runtime_bytes": r.runtime_bytes,
                                                    "target_bytes": r.target_bytes}
                                       for r in runs]}, indent=2))  # fmt: skip
    lines = [f"# Memory: {model.name} ({_gib(runs[0].file_bytes)} GiB file)", "",
             "| server | ready after s | s per GB of file | peak RSS GiB | weights | KV pool | "
             "state | runtime | file + KV + state + 1 GiB | within |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        if r.error:
            lines.append(f"| {r.server} | error: {r.error} ||||||||")
            continue
        per_gb = r.ready_s / (r.file_bytes / 1e9)
        within = "n/a" if r.target_bytes is None else (
            "yes" if r.peak_rss_bytes <= r.target_bytes else "**no**")  # fmt: skip
        lines.append(f"| {r.server} | {r.ready_s:.1f} | {per_gb:.1f} | {_gib(r.peak_rss_bytes)} | "
                     f"{_gib(r.weight_bytes)} | {_gib(r.kv_bytes)} | {_gib(r.state_bytes)} | "
                     f"{_gib(r.runtime_bytes)} | "
                     f"{_gib(r.target_bytes)} | {within} |")  # fmt: skip
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(runs, model, out / "memory.png")


def plot(runs: list[MemoryRun], model: Path, path: Path) -> None:
    """Stacked bars of weights, KV pool, state and runtime per server; a tick at its peak
    RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in runs if not r.error]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, r in enumerate(shown):
        parts = [(r.weight_bytes, "weights", "#4c72b0"), (r.kv_bytes, "KV pool", "#dd8452"),
                 (r.state_bytes or None, "state", "#55a868"),
                 (r.runtime_bytes, "runtime", "#8c8c8c")]  # fmt: skip
        bottom = 0.0
        for value, label, color in parts:
            if value is None:
                continue
            ax.bar(i, value / GIB, bottom=bottom, color=color, label=label if i == 0 else None)
            bottom += value / GIB
        ax.plot([i - 0.4, i + 0.4], [r.peak_rss_bytes / GIB] * 2, color="black")
    ax.set_xticks(range(len(shown)), [r.server for r in shown])
    ax.set_ylabel("GiB (black: peak RSS)")
    ax.set_title(f"Serving {model.name}: peak memory")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
