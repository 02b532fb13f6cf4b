"""`inflight bench slowloris`: what trickling clients cost a real `inflight serve` process.

It starts the server (or uses `--url`), measures a short completion's latency alone, then opens
`--clients` connections that each send a request one byte every `--interval` seconds (a
slowloris attack), and measures, while they are held: how long the server holds each one and
what it answers, the latency of the same completion for a well-behaved client, and the
server's RSS. Results go to a folder: edge.json, summary.md and a plot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from inflight.bench.soak import rss_mib, start_server

logger = logging.getLogger("inflight.bench")

TRICKLED_REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 60\r\n\r\n"
    + b'{"prompt": "hello", "max_tokens": 4, "temperature": 0}'.ljust(60)
)


@dataclass
class EdgeResult:
    held_s: list[float] = field(default_factory=list)  # per trickling connection
    answers: dict[str, int] = field(default_factory=dict)  # status line (or "reset") -> count
    open_connections: list[tuple[float, int]] = field(default_factory=list)  # (t, open)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (t, MiB)
    latency_alone_s: list[float] = field(default_factory=list)
    latency_under_attack_s: list[float] = field(default_factory=list)
    open_now: int = 0

    def summary(self) -> dict[str, Any]:
        def median(xs: list[float]) -> float | None:
            return round(statistics.median(xs), 4) if xs else None

        return {
            "clients": len(self.held_s),
            "answers": self.answers,
            "held_median_s": median(self.held_s),
            "held_max_s": round(max(self.held_s), 3) if self.held_s else None,
            "peak_open": max((n for _, n in self.open_connections), default=0),
            "rss_before_mib": self.rss[0][1] if self.rss else None,
            "rss_peak_mib": max((m for _, m in self.rss), default=None),
            "rss_added_mib": round(max(m for _, m in self.rss) - self.rss[0][1], 2)
            if self.rss
            else None,
            "latency_alone_median_s": median(self.latency_alone_s),
            "latency_under_attack_median_s": median(self.latency_under_attack_s),
        }


async def trickle(host: str, port: int, interval: float, result: EdgeResult) -> None:
    """One slow client: a byte every `interval` seconds until the server answers or closes."""
    opened = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    result.open_now += 1
    read = asyncio.ensure_future(reader.read(4096))
    answer = "open"
    try:
        for byte in TRICKLED_REQUEST:
            if read.done():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.wait({read}, timeout=interval)
        data = await read
        answer = data.split(b"\r\n", 1)[0].decode(errors="replace") if data else "closed"
    except (ConnectionError, OSError):
        answer = "reset"
    finally:
        read.cancel()
        writer.close()
        result.open_now -= 1
    result.held_s.append(time.perf_counter() - opened)
    result.answers[answer] = result.answers.get(answer, 0) + 1


async def completion_latency(client: httpx.AsyncClient, url: str, model: str) -> float:
    body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
    start = time.perf_counter()
    response = await client.post(url + "/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return time.perf_counter() - start


async def attack(url: str, model: str, pid: int | None, clients: int, interval: float,
                 probes: int) -> EdgeResult:  # fmt: skip
    result = EdgeResult()
    host, port = httpx.URL(url).host, httpx.URL(url).port or 80
    start = 0.0

    def sample() -> None:
        now = round(time.perf_counter() - start, 3)
        result.open_connections.append((now, result.open_now))
        if pid is not None and (mib := rss_mib(pid)) is not None:
            result.rss.append((now, mib))

    async with httpx.AsyncClient() as client:
        for _ in range(probes):
            result.latency_alone_s.append(await completion_latency(client, url, model))
        start = time.perf_counter()
        sample()
        tasks = [asyncio.ensure_future(trickle(host, port, interval, result))
                 for _ in range(clients)]  # fmt: skip
        await asyncio.sleep(0.5)  # every client is connected and trickling
        for _ in range(probes):
            result.latency_under_attack_s.append(await completion_latency(client, url, model))
            sample()
        while not all(t.done() for t in tasks):
            sample()
            await asyncio.sleep(0.1)
        sample()
    return result


def run_slowloris(args: Any, knobs: dict[str, Any], out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    process = None
    if args.url:
        url, name, pid = args.url.rstrip("/"), args.served_model_name, args.server_pid
    else:
        model = knobs.pop("model", None)
        process, url, name = start_server(model, knobs, 64, out / "server.log")
        pid = process.pid
    try:
        logger.info("%d clients trickling a byte every %g s into %s", args.clients,
                    args.interval, url)  # fmt: skip
        result = asyncio.run(attack(url, name, pid, args.clients, args.interval, args.probes))
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
    summary = result.summary()
    meta = {"url": url, "clients": args.clients, "interval_s": args.interval, "knobs": knobs}
    report = {"meta": meta, "summary": summary, "open": result.open_connections,
              "rss": result.rss, "held_s": result.held_s}  # fmt: skip
    (out / "edge.json").write_text(json.dumps(report, indent=1))
    plot_edge(result, out / "edge.png")
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items())
    (out / "summary.md").write_text(
        f"# inflight bench slowloris: {args.clients} clients, a byte every {args.interval:g} s"
        f"\n\n| measure | value |\n|---|---|\n{rows}\n\n![edge](edge.png)\n"
    )
    return report


def plot_edge(result: EdgeResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, left = plt.subplots(figsize=(7, 3.5))
    times, counts = (
        zip(*result.open_connections, strict=True) if result.open_connections else ((), ())
    )
    left.step(times, counts, where="post", color="tab:red")
    left.set_xlabel("seconds since the attack began")
    left.set_ylabel("trickling connections open", color="tab:red")
    if result.rss:
        right = left.twinx()
        base = result.rss[0][1]
        right.plot([t for t, _ in result.rss], [m - base for _, m in result.rss], color="tab:blue")
        right.set_ylabel(f"server RSS above its {base:.0f} MiB (MiB)", color="tab:blue")
    left.set_title("slow clients against inflight serve")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
