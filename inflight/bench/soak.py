"""`inflight bench soak`: a bounded overload run against a real `inflight serve` process.

It starts the server (or uses `--url`), measures the saturation rate (a burst of
2 x `max_num_seqs` requests at once: completed requests / wall time), then sends Poisson
arrivals at `--load` times that rate for `--duration` seconds, streaming, with a share of
clients that leave mid-stream. Meanwhile it polls /health (latency), /metrics (state gauges)
and the server's RSS. Every request ends as one of: completed ([DONE] after a finish reason),
rejected (429, or 503 while draining), errored (another status, or an error chunk),
disconnected (the client left on purpose) or lost (a connection error, a timeout, or a stream
cut without [DONE]): `lost` must be 0. At the end it checks that the gauges return to idle
and that SIGTERM drains the server and it exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from inflight.metrics.doctor import Snapshot
from inflight.workload.requests import WorkloadRequest, named

logger = logging.getLogger(__name__)

IDLE_GAUGES = ("inflight_requests_running", "inflight_requests_waiting",
               "inflight_kv_cache_blocks_used")  # fmt: skip
OUTCOMES = ("completed", "rejected", "errored", "disconnected", "lost")


@dataclass
class SoakResult:
    saturation_req_per_s: float
    rate_req_per_s: float
    duration_s: float
    outcomes: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (t, outcome) per request
    health: list[tuple[float, float]] = field(default_factory=list)  # (t, seconds; inf: failed)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (t, MiB)
    idle_after_s: float | None = None
    exit_code: int | None = None

    def summary(self) -> dict[str, Any]:
        answered = sorted(s for _, s in self.health if s != float("inf"))

        def q(p: float) -> float | None:
            return round(answered[min(len(answered) - 1, int(p * len(answered)))], 4) \
                if answered else None  # fmt: skip

        rss = [m for _, m in self.rss]
        return {
            "saturation_req_per_s": round(self.saturation_req_per_s, 3),
            "rate_req_per_s": round(self.rate_req_per_s, 3),
            "wall_s": round(self.duration_s, 1),  # until the last request ended
            "sent": sum(self.outcomes.values()),
            **{k: self.outcomes.get(k, 0) for k in OUTCOMES},
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "health_polls": len(self.health),
            "health_failed": len(self.health) - len(answered),
            "health_p50_s": q(0.5), "health_p99_s": q(0.99),
            "health_max_s": round(answered[-1], 4) if answered else None,
            "rss_start_mib": round(rss[0], 1) if rss else None,
            "rss_end_mib": round(rss[-1], 1) if rss else None,
            "rss_peak_mib": round(max(rss), 1) if rss else None,
            "rss_growth_mib": round(rss[-1] - rss[0], 1) if rss else None,
            "idle_after_s": self.idle_after_s,
            "exit_code": self.exit_code,
        }  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def knob_flags(knobs: dict[str, Any]) -> list[str]:
    """Engine knobs back to `inflight serve` flags."""
    flags: list[str] = []
    for name, value in knobs.items():
        if name == "model" or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


async def _request(
    client: httpx.AsyncClient, model: str, r: WorkloadRequest, leave_after: int | None
) -> tuple[str, int | None]:
    """(outcome, HTTP status) of one streamed completion."""
    body = {"model": model, "prompt": r.prompt_token_ids, "max_tokens": r.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    chunks, finished = 0, False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code in (429, 503):
                return "rejected", resp.status_code
            if resp.status_code != 200:
                return "errored", resp.status_code
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return ("completed" if finished else "lost"), 200
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return "errored", 200
                chunks += 1
                finished = finished or any(c.get("finish_reason") for c in chunk["choices"])
                if leave_after is not None and chunks >= leave_after:
                    return "disconnected", 200
            return "lost", 200
    except (httpx.HTTPError, json.JSONDecodeError):
        return "lost", None


class Soak:
    def __init__(self, url: str, model: str, pid: int | None, request_timeout: float) -> None:
        self.url, self.model, self.pid = url, model, pid
        self.timeout = request_timeout
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start

    def client(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return httpx.AsyncClient(base_url=self.url, timeout=self.timeout, limits=limits)

    async def saturation(self, workload: list[WorkloadRequest]) -> float:
        async with self.client() as client:
            start = time.perf_counter()
            outcomes = await asyncio.gather(
                *(_request(client, self.model, r, None) for r in workload)
            )
            wall = time.perf_counter() - start
        done = sum(o == "completed" for o, _ in outcomes)
        return done / wall

    async def run(
        self, workload: list[WorkloadRequest], result: SoakResult, disconnect: float, seed: int
    ) -> None:
        rng = random.Random(seed)
        stop = asyncio.Event()
        self.start = time.perf_counter()  # the timeline starts with the soak
        async with self.client() as client:
            watchers = [asyncio.create_task(self._watch_health(client, result, stop)),
                        asyncio.create_task(self._watch_rss(result, stop)),
                        asyncio.create_task(self._report_progress(result, stop))]  # fmt: skip
            start = time.perf_counter()

            async def one(r: WorkloadRequest) -> None:
                await asyncio.sleep(max(0.0, r.arrival_time - (time.perf_counter() - start)))
                leave = rng.randint(1, 8) if rng.random() < disconnect else None
                outcome, status = await _request(client, self.model, r, leave)
                result.outcomes[outcome] += 1
                result.statuses[status or 0] += 1
                result.timeline.append((self.now(), outcome))

            await asyncio.gather(*(one(r) for r in workload))
            result.duration_s = time.perf_counter() - start
            result.idle_after_s = await self._time_to_idle(client)
            stop.set()
            await asyncio.gather(*watchers)

    async def _watch_health(self, client: httpx.AsyncClient, result: SoakResult,
                            stop: asyncio.Event) -> None:  # fmt: skip
        while not stop.is_set():
            t = time.perf_counter()
            try:
                ok = (await client.get("/health", timeout=5)).status_code == 200
                await client.get("/metrics", timeout=5)
            except httpx.HTTPError:
                ok = False
            result.health.append((self.now(), time.perf_counter() - t if ok else float("inf")))
            await asyncio.sleep(0.25)

    async def _watch_rss(self, result: SoakResult, stop: asyncio.Event) -> None:
        while not stop.is_set() and self.pid is not None:
            if (mib := rss_mib(self.pid)) is not None:
                result.rss.append((self.now(), mib))
            await asyncio.sleep(2)

    async def _report_progress(self, result: SoakResult, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 30)
            rss = f", RSS {result.rss[-1][1]:.0f} MiB" if result.rss else ""
            counts = ", ".join(f"{k} {result.outcomes.get(k, 0)}" for k in OUTCOMES)
            logger.info("soak %.0f s: %s%s", self.now(), counts, rss)

    async def _time_to_idle(self, client: httpx.AsyncClient) -> float | None:
        """Seconds after the last request ended until the state gauges read idle (None: not
        within 10 s)."""
        start = time.perf_counter()
        while time.perf_counter() - start < 10:
            metrics = Snapshot.parse(0.0, (await client.get("/metrics")).text)
            if all(metrics.samples.get((name, ())) == 0 for name in IDLE_GAUGES):
                return round(time.perf_counter() - start, 3)
            await asyncio.sleep(0.05)
        return None


def start_server(model: str | None, knobs: dict[str, Any], max_queued: int, log: Path
                 ) -> tuple[subprocess.Popen, str, str]:  # fmt: skip
    port = free_port()
    name = "soak"
    command = [sys.executable, "-m", "inflight", "serve", *([model] if model else []),
               "--port", str(port), "--served-model-name", name,
               "--max-queued-requests", str(max_queued), *knob_flags(knobs)]  # fmt: skip
    logger.info("starting %s", " ".join(command[1:]))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900  # the first start on a CPU kind compiles the kernels
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited while starting; see {log}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url, name
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("the server did not start within 15 minutes")


def run_soak(args: Any, knobs: dict[str, Any], out: Path) -> dict[str, Any]:
    from inflight.model.loader import resolve_model_path
    from inflight.tokenizer import load_tokenizer
    from inflight.workload.report import plot_soak

    out.mkdir(parents=True, exist_ok=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    model = knobs.pop("model", None)
    tokenizer = load_tokenizer(resolve_model_path(model))
    max_num_seqs = knobs.get("max_num_seqs") or 64
    process = None
    if args.url:
        url, name, pid = args.url.rstrip("/"), args.served_model_name, args.server_pid
    else:
        process, url, name = start_server(model, knobs, args.max_queued_requests,
                                          out / "server.log")  # fmt: skip
        pid = process.pid
    try:
        soak = Soak(url, name, pid, args.request_timeout)
        burst = named(args.workload, tokenizer, args.workload_seed, 2 * max_num_seqs)
        logger.info("measuring saturation: %d %s requests at once", len(burst), args.workload)
        saturation = asyncio.run(soak.saturation(burst))
        rate = args.load * saturation
        logger.info("saturation %.2f req/s; soaking at %.2f req/s for %g s",
                    saturation, rate, args.duration)  # fmt: skip
        workload = named(args.workload, tokenizer, args.workload_seed + 1,
                         max(1, round(rate * args.duration)), "poisson", rate)  # fmt: skip
        result = SoakResult(saturation, rate, args.duration)
        asyncio.run(soak.run(workload, result, args.disconnect_fraction, args.workload_seed))
        if process is not None:
            process.send_signal(signal.SIGTERM)
            result.exit_code = process.wait(timeout=120)
    finally:
        if process is not None and process.poll() is None:
            process.kill()
    summary = result.summary()
    meta = {"url": url, "workload": args.workload, "load": args.load, "knobs": knobs,
            "duration_s": args.duration,
            "max_queued_requests": args.max_queued_requests,
            "disconnect_fraction": args.disconnect_fraction}  # fmt: skip
    report = {"meta": meta, "summary": summary, "timeline": result.timeline,
              "health": [(t, s if s != float("inf") else None) for t, s in result.health],
              "rss": result.rss}  # fmt: skip
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    plot_soak(result, out / "soak.png")
    (out / "summary.md").write_text(soak_markdown(summary, meta))
    return report


def soak_markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items())
    return (f"# inflight bench soak: {meta['workload']} at {meta['load']}x saturation\n\n"
            f"| measure | value |\n|---|---|\n{rows}\n\n![soak](soak.png)\n")  # fmt: skip


def ok(summary: dict[str, Any]) -> bool:
    """What a soak must show: nothing lost or 5xx, health answered, idle afterwards, exit 0."""
    statuses = summary["statuses"]
    server_errors = sum(v for k, v in statuses.items() if k.startswith("5") and k != "503")
    return (
        summary["lost"] == 0
        and server_errors == 0
        and summary["health_failed"] == 0
        and summary["idle_after_s"] is not None
        and summary["exit_code"] in (0, None)
    )
