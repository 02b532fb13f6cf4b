"""What operators see: the Grafana board against a real Prometheus, the dashboard in a real
browser (headless Chromium), and the dashboard's key.

Prometheus and Chromium come from Debian (`scripts/setup.sh` installs them where apt is
available); without them these tests skip, except in CI (CI=true), where they must run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from inflight.bench.soak import free_port
from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer, slow_steps
from tests.server.test_stream_and_metrics import metric_samples

ROOT = Path(__file__).resolve().parents[2]
BOARD = ROOT / "deploy" / "grafana" / "inflight.json"
MODEL = "tiny"


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} must be installed in CI (scripts/setup.sh installs it)")
        pytest.skip(f"{binary} is not installed (scripts/setup.sh installs it as root)")
    return path


def board_targets() -> list[tuple[str, str]]:
    board = json.loads(BOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def test_grafana_board_is_well_formed():
    board = json.loads(BOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) >= 15
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    source = {"type": "prometheus", "uid": "${" + variable["name"] + "}"}
    for panel in board["panels"]:
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"] and all(t["datasource"] == source for t in panel["targets"])
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    titles = " ".join(p["title"] for p in board["panels"]).lower()
    for needed in ("kv cache", "running", "first token", "output token", "end-to-end", "queue",
                   "throughput", "preemptions", "prefix", "batch", "finish", "prompt length",
                   "output length"):  # fmt: skip
        assert needed in titles


def load(url: str, seconds: float) -> None:
    """Streams of requests for `seconds`, plus a burst the queue must refuse (429s)."""

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 12,
                    "ignore_eos": True}  # fmt: skip
            burst = await asyncio.gather(*(client.post("/v1/completions", json=body)
                                           for _ in range(24)))  # fmt: skip
            assert 429 in {r.status_code for r in burst}
            end = time.monotonic() + seconds

            async def worker(i: int):
                # the first worker's requests miss a TPOT target, the others meet the server's
                target = {"slo_tpot": 1e-9} if i == 0 else {}
                while time.monotonic() < end:
                    await client.post(
                        "/v1/completions", json={**body, "prompt": f"{i} quick", **target}
                    )

            await asyncio.gather(*(worker(i) for i in range(3)))

    asyncio.run(run())


def test_every_board_query_returns_data_from_a_real_prometheus(tiny_llama, tmp_path):
    binary = require("prometheus")
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64,
                      max_num_seqs=4, max_queued_requests=4, slo_ttft=60.0)  # fmt: skip
    with LiveServer(engine, served_model_name=MODEL) as server:
        config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        (job,) = config["scrape_configs"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prometheus = subprocess.Popen(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
        )  # fmt: skip
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    response = httpx.get(f"{api}/query", params={"query": "up"})
                    # while its storage opens, Prometheus answers 503 "Service Unavailable"
                    up = response.json() if response.status_code == 200 else None
                    if up and up["data"]["result"] and up["data"]["result"][0]["value"][1] == "1":
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "Prometheus did not scrape the server"
                time.sleep(0.5)
            load(server.url, seconds=6)
            at = time.time() - 0.5  # inside the load, after at least a few scrapes of it
            time.sleep(2)
            empty = []
            for title, expr in board_targets():
                query = expr.replace("$__rate_interval", "5s")
                result = httpx.get(f"{api}/query", params={"query": query, "time": at}).json()
                assert result["status"] == "success", (title, result)
                values = [float(r["value"][1]) for r in result["data"]["result"]]
                if not any(math.isfinite(v) for v in values):
                    empty.append((title, query))
            assert not empty, empty
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=30)


# --------------------------------------------------------------------------- the dashboard
def chromium():
    require("chromium")
    driver_path = require("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1100"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver_path))


def page_numbers(driver) -> dict[str, float]:
    ids = ["running", "waiting", "kv-blocks-used"]
    texts = driver.execute_script(  # in one script, as `tenant_names` says why
        "return arguments[0].map(id => document.getElementById(id).textContent.trim())", ids
    )
    return {i: float(text or "nan") for i, text in zip(ids, texts, strict=True)}


def metrics_numbers(url: str) -> dict[str, float]:
    samples = metric_samples(httpx.get(url + "/metrics").text)
    return {"running": samples[("inflight_requests_running", ())],
            "waiting": samples[("inflight_requests_waiting", ())],
            "kv-blocks-used": samples[("inflight_kv_cache_blocks_used", ())]}  # fmt: skip


def table_rows(driver) -> int:
    return len(driver.find_elements("css selector", "#requests tbody tr"))


def tenant_names(driver) -> list[str]:
    """The tenants' table's first column, read in one script: the page re-renders the table
    with every update, so elements found in one call may be gone by the next."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#tenants tbody tr td:first-child'),"
        " cell => cell.textContent.trim())"
    )


def canvas(driver, element_id: str) -> str:
    return driver.execute_script(f"return document.getElementById('{element_id}').toDataURL()")


def test_dashboard_renders_and_moves_with_the_load(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64,
                      max_num_seqs=4)  # fmt: skip
    with LiveServer(engine, served_model_name=MODEL) as server:
        driver = chromium()  # (closed before the server, which waits for its event stream)
        try:
            driver.get(server.url + "/dashboard")
            deadline = time.monotonic() + 10
            while driver.find_element("id", "status").text != "live":
                assert time.monotonic() < deadline, "the page never received an update"
                time.sleep(0.1)
            idle = canvas(driver, "belt"), canvas(driver, "blockmap")
            assert (
                page_numbers(driver)
                == metrics_numbers(server.url)
                == {"running": 0, "waiting": 0, "kv-blocks-used": 0}
            )

            slow_steps(engine, 0.05)  # the state holds still long enough to compare
            body = {"model": MODEL, "prompt": "The quick brown fox jumps", "max_tokens": 60,
                    "ignore_eos": True}  # fmt: skip
            threads = [threading.Thread(target=httpx.post, args=(server.url + "/v1/completions",),
                                        kwargs={"json": body, "timeout": 120})
                       for _ in range(6)]  # fmt: skip
            for t in threads:
                t.start()
            start = time.monotonic()
            while (canvas(driver, "belt"), canvas(driver, "blockmap"))[0] == idle[0] or \
                    canvas(driver, "blockmap") == idle[1]:  # fmt: skip
                assert time.monotonic() - start < 3, "the belt or the block map did not move"
                time.sleep(0.1)
            # the page's numbers are /metrics' within one refresh (4 a second); its table of
            # requests is refreshed apart from the counts, so it may lag them by one refresh
            deadline, rows = time.monotonic() + 3, None
            while (page := page_numbers(driver)) != (metrics := metrics_numbers(server.url)) or \
                    (rows := table_rows(driver)) != 6:  # fmt: skip
                assert time.monotonic() < deadline, (page, metrics, rows)
                time.sleep(0.05)
            assert page["running"] == 4 and page["waiting"] == 2 and page["kv-blocks-used"] > 0
            # the tenants' table: every request here is the default tenant's
            assert tenant_names(driver) == ["default"]
            for t in threads:
                t.join()
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, errors
        finally:
            driver.quit()


def test_dashboard_needs_the_key(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name=MODEL, api_key="sesame") as server:
        assert httpx.get(server.url + "/dashboard").status_code == 401
        assert httpx.get(server.url + "/dashboard?api_key=wrong").status_code == 401
        assert httpx.get(server.url + "/dashboard?api_key=sesame").status_code == 200
        headers = {"Authorization": "Bearer sesame"}
        assert httpx.get(server.url + "/dashboard", headers=headers).status_code == 200
        with httpx.stream("GET", server.url + "/dashboard/events?api_key=sesame") as events:
            assert events.status_code == 200
            assert next(events.iter_lines()) == "event: hello"
        assert httpx.get(server.url + "/dashboard/events").status_code == 401


def test_pages_that_leave_stop_counting_as_watchers(tiny_llama):
    """Pages that vanish mid-stream release their place, so the update rate of the others
    returns to full."""
    pages = 20
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name=MODEL) as server:

        async def open_and_vanish():
            streams = []
            for _ in range(pages):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /dashboard/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                streams.append((reader, writer))
            for reader, _ in streams:
                assert (await reader.readuntil(b"event: hello")).endswith(b"event: hello")
            await asyncio.sleep(1)  # a few updates each
            assert engine.feed.watchers == pages
            for _, writer in streams:
                writer.close()
                await writer.wait_closed()

        asyncio.run(open_and_vanish())
        deadline = time.monotonic() + 3
        while engine.feed.watchers:
            assert time.monotonic() < deadline, engine.feed.watchers
            time.sleep(0.05)
        with httpx.stream("GET", server.url + "/dashboard/events") as events:
            lines = events.iter_lines()
            start = time.monotonic()
            updates = sum(
                1
                for line in itertools.takewhile(lambda _: time.monotonic() - start < 1.2, lines)
                if line.startswith("data:")
            )
        assert updates >= 4  # the hello and ~4 updates a second, at full rate again
