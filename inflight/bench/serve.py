"""Serving benchmark: an async client for any OpenAI-compatible server, swept over request rates.

Each request is sent at its (Poisson or gamma) arrival time as a streaming completion with token
ids as the prompt, greedy, `ignore_eos`; TTFT is the first chunk carrying text, TPOT the mean gap
after it. Goodput counts only requests that meet both SLOs (TTFT and TPOT). Failed requests are
counted, never retried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from inflight.workload.requests import WorkloadRequest, named
from inflight.workload.results import RequestRecord, RunResult


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it."""

    status: int  # HTTP status (0: the connection failed)
    ttft: float | None = None  # send -> first text, s
    e2e: float | None = None  # send -> last byte, s
    output_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def record(self) -> RequestRecord:
        return RequestRecord(self.prompt_tokens, self.output_tokens, self.ttft, self.e2e)

    def met(self, ttft: float, tpot: float) -> bool:
        return self.status == 200 and self.record.within(ttft, tpot)


async def send_completion(client: httpx.AsyncClient, url: str, model: str, r: WorkloadRequest,
                          start: float, extra: dict[str, Any]) -> Outcome:  # fmt: skip
    """`r` at its arrival time as a streaming completion (its body with `extra`'s fields): TTFT
    is the first chunk carrying text; an error chunk mid-stream counts as a 500."""
    await asyncio.sleep(max(0.0, r.arrival_time - (time.perf_counter() - start)))
    sent = time.perf_counter()
    body = {"model": model, "prompt": r.prompt_token_ids, "max_tokens": r.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    ttft, tokens = None, 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return Outcome(resp.status_code, e2e=time.perf_counter() - sent)
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Outcome(500, e2e=time.perf_counter() - sent)
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                    ttft = time.perf_counter() - sent
    except httpx.HTTPError:
        return Outcome(0)
    return Outcome(200, ttft, time.perf_counter() - sent, tokens, len(r.prompt_token_ids))


async def _one(
    client: httpx.AsyncClient, url: str, model: str, r: WorkloadRequest, start: float
) -> RequestRecord | None:
    o = await send_completion(client, url, model, r, start, {})
    return o.record if o.status == 200 else None


async def _watch_dashboard(url: str, api_key: str | None, stop: asyncio.Event) -> int:
    """One open dashboard: reads its event stream and throws the bytes away (as cheaply as a
    client can, so the server's cost is what a run measures). Returns the bytes read."""
    host, port = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    query = f"?api_key={api_key}" if api_key else ""
    writer.write(f"GET /dashboard/events{query} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    received = 0
    while not stop.is_set():
        try:
            data = await asyncio.wait_for(reader.read(65536), 0.5)
        except TimeoutError:
            continue
        if not data:  # the server closed the stream
            break
        received += len(data)
    writer.close()
    await writer.wait_closed()  # before this run's event loop ends, or the socket outlives it
    return received


async def run_rate(
    url: str,
    model: str,
    workload: list[WorkloadRequest],
    name: str,
    api_key: str | None,
    slo_ttft: float,
    slo_tpot: float,
    dashboards: int = 0,
) -> RunResult:
    """One rate's run; `dashboards` pages watch the server's dashboard meanwhile."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    stop = asyncio.Event()
    watchers = [asyncio.create_task(_watch_dashboard(url, api_key, stop))
                for _ in range(dashboards)]  # fmt: skip
    if dashboards:
        await asyncio.sleep(1)  # every page connected and receiving
    async with httpx.AsyncClient(timeout=None, headers=headers, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(_one(client, url, model, r, start) for r in workload))
        wall = time.perf_counter() - start
    stop.set()
    dashboard_bytes = sum(await asyncio.gather(*watchers))
    records = [r for r in results if r is not None]
    good = [r for r in records if r.within(slo_ttft, slo_tpot)]
    extra = {"errors": len(results) - len(records), "goodput_req_per_s": round(len(good) / wall, 3),
             "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot}, "dashboards": dashboards,
             "dashboard_mb_per_s": round(dashboard_bytes / wall / 1e6, 3)}  # fmt: skip
    return RunResult(name, wall, records, extra=extra)


def run_serve_sweep(args: argparse.Namespace, out: Path) -> dict:
    from inflight.model.loader import resolve_model_path
    from inflight.tokenizer import load_tokenizer
    from inflight.workload.report import write_report

    tokenizer = load_tokenizer(resolve_model_path(args.tokenizer))
    arrival = "poisson" if args.arrival == "all" else args.arrival
    url = args.url.rstrip("/")
    runs = []
    for repeat in range(args.repeats):
        for rate in [float(x) for x in args.rates.split(",")]:
            workload = named(args.workload, tokenizer, args.workload_seed, args.num_requests,
                             arrival, rate)  # fmt: skip
            # with --dashboards, runs alternate without and with the pages open
            for pages in (0, args.dashboards) if args.dashboards else (0,):
                name = f"rate {rate:g}/s" + (f", {pages} dashboards" if args.dashboards else "")
                name += f" #{repeat + 1}" if args.repeats > 1 else ""
                runs.append(asyncio.run(run_rate(url, args.model, workload, name, args.api_key,
                                                 args.slo_ttft, args.slo_tpot, pages)))  # fmt: skip
    meta = {"url": url, "model": args.model, "workload": args.workload, "arrival": arrival,
            "dashboards": args.dashboards}  # fmt: skip
    return write_report(out, f"inflight bench serve: {args.workload}", runs, meta)
