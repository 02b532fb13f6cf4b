"""The server under overload, disconnect storms, an oversubscribed KV pool, a poisoned request
and SIGTERM: nothing 5xx that should not be, /health answers, and the state gauges return to
idle within a second of the last request ending."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from inflight.bench.soak import free_port
from inflight.cli import main
from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer, slow_steps
from tests.server.test_stream_and_metrics import metric_samples

MODEL = "tiny"
IDLE_GAUGES = ("inflight_requests_running", "inflight_requests_waiting",
               "inflight_requests_swapped", "inflight_kv_cache_blocks_used",
               "inflight_kv_cache_usage")  # fmt: skip


def engine_for(folder, **knobs) -> AsyncLLM:
    knobs = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64, **knobs}
    return AsyncLLM(str(folder), **knobs)


def assert_gauges_idle_within(server: LiveServer, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        samples = metric_samples(httpx.get(server.url + "/metrics").text)
        values = {name: samples[(name, ())] for name in IDLE_GAUGES}
        if not any(values.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gauges not idle {seconds} s after the last request: {values}")
        time.sleep(0.05)


def body(**fields) -> dict:
    return {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 16,
            "ignore_eos": True, **fields}  # fmt: skip


def test_overload_gets_429s_while_health_answers(tiny_llama):
    engine = engine_for(tiny_llama, max_num_seqs=8, max_queued_requests=16)
    with LiveServer(engine, served_model_name=MODEL) as s:
        slow_steps(engine, 0.01)

        async def burst():
            limits = httpx.Limits(max_connections=300)
            async with httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) as client:
                polls: list[tuple[float, float]] = []  # (answered at, seconds taken)
                done = asyncio.Event()

                async def poll_health():
                    while not done.is_set():
                        for path in ("/health", "/metrics"):
                            start = time.perf_counter()
                            r = await client.get(path)
                            polls.append((time.perf_counter(), time.perf_counter() - start))
                            assert r.status_code == 200
                        await asyncio.sleep(0.05)

                poller = asyncio.create_task(poll_health())
                responses = await asyncio.gather(
                    *(client.post("/v1/completions", json=body(n=1 + i % 2)) for i in range(200))
                )
                burst_end = time.perf_counter()
                done.set()
                await poller
                return responses, polls, burst_end

        responses, polls, burst_end = asyncio.run(burst())
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}, set(statuses)
        # the queue bound counts sequences (n=2 is two) and waiting ones until the engine
        # admits them: a loaded machine whose engine has not stepped yet admits 16 sequences,
        # as few as 8 requests
        assert statuses.count(429) > 0 and statuses.count(200) >= 8
        assert all(r.headers["retry-after"] == "1" for r in responses if r.status_code == 429)
        # Every poll answered, and some while the burst's requests were still running: the
        # probes never wait for the burst to end. Client and server share one process (and its
        # GIL) here, and other test files run beside it, so the latency bound only catches a
        # hang; `inflight bench soak` measures /health from outside (docs/reliability.md).
        assert any(answered < burst_end for answered, _ in polls), (polls, burst_end)
        assert max(taken for _, taken in polls) < 10.0, polls
        assert_gauges_idle_within(s, 1.0)
        time.sleep(1.1)  # the doctor's history takes a snapshot a second
        doctor = httpx.get(s.url + "/doctor").json()
        hints = {h["rule"]: h for h in doctor["hints"]}
        assert hints["queue_full"]["evidence"]["rejected"] == statuses.count(429)


def test_disconnect_storm_returns_every_block(tiny_llama):
    engine = engine_for(tiny_llama, max_num_seqs=64)
    with LiveServer(engine, served_model_name=MODEL) as s:
        slow_steps(engine, 0.02)

        async def storm():
            async with httpx.AsyncClient(
                base_url=s.url, timeout=60, limits=httpx.Limits(max_connections=100)
            ) as client:

                async def read_two_chunks_and_leave():
                    chunks = 0
                    request = body(max_tokens=100, stream=True)
                    async with client.stream("POST", "/v1/completions", json=request) as r:
                        async for line in r.aiter_lines():
                            chunks += line.startswith("data: ")
                            if chunks == 2:
                                return

                await asyncio.gather(*(read_two_chunks_and_leave() for _ in range(50)))

        asyncio.run(storm())
        assert_gauges_idle_within(s, 1.0)
        finished = metric_samples(httpx.get(s.url + "/metrics").text)
        assert finished[("inflight_requests_finished_total", (("finish_reason", "abort"),))] == 50


def test_oversubscribed_kv_pool_preempts_and_recovers(tiny_llama):
    engine = engine_for(tiny_llama, num_kv_blocks=12, max_num_seqs=16)  # 8 blocks per request

    async def crowd(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            prompts = [f"Numbers like {i} and {i * 7} appear" for i in range(24)]
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body(prompt=p, max_tokens=80))
                  for p in prompts)
            )  # fmt: skip

    with LiveServer(engine, served_model_name=MODEL) as s:
        responses = asyncio.run(crowd(s.url))
        assert [r.status_code for r in responses] == [200] * 24
        assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in responses)
        assert_gauges_idle_within(s, 1.0)
        samples = metric_samples(httpx.get(s.url + "/metrics").text)
        assert samples[("inflight_preemptions_total", ())] > 0


def test_a_poisoned_request_fails_alone_over_http(tiny_llama):
    engine = engine_for(tiny_llama, max_num_seqs=32)
    prompts = [f"The quick brown fox {i}" for i in range(16)]
    with LiveServer(engine, served_model_name=MODEL) as s:
        alone = [httpx.post(s.url + "/v1/completions", json=body(prompt=p, temperature=0),
                            timeout=30).json()["choices"][0]["text"] for p in prompts]  # fmt: skip
        poison = engine.tokenizer("Numbers like 12345").input_ids

        def hook(scheduled):
            if scheduled.prompt_token_ids == poison and len(scheduled.output_token_ids) == 3:
                raise RuntimeError("poisoned input")

        engine.core.runner.fault_hook = hook

        async def together():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                requests = [body(prompt=p, temperature=0) for p in prompts]
                requests.insert(5, body(prompt="Numbers like 12345", temperature=0))
                return await asyncio.gather(
                    *(client.post("/v1/completions", json=r) for r in requests)
                )

        responses = asyncio.run(together())
        failed = responses.pop(5)
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "request_failed")
        assert "failed in the engine: RuntimeError: poisoned input" in error["message"]
        assert [r.status_code for r in responses] == [200] * 16
        assert [r.json()["choices"][0]["text"] for r in responses] == alone
        assert httpx.get(s.url + "/health").status_code == 200
        assert_gauges_idle_within(s, 1.0)


def test_doctor_command_reads_a_running_server(tiny_llama, capsys):
    engine = engine_for(tiny_llama)
    with LiveServer(engine, served_model_name=MODEL) as s:
        assert main(["doctor", s.url, "--window", "1", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["hints"] == [] and report["window_s"] >= 1
        assert report["window"]["running_mean"] == 0
        assert main(["doctor", "http://127.0.0.1:1", "--window", "0"]) == 2  # nothing there


# ------------------------------------------------------------------ graceful shutdown
def start_server(model, port: int, shutdown_timeout: float, log) -> subprocess.Popen:
    command = [sys.executable, "-m", "inflight", "serve", str(model), "--port", str(port),
               "--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "512",
               "--num-kv-blocks", "64", "--shutdown-timeout", str(shutdown_timeout)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
        assert process.poll() is None, "the server exited while starting"
    process.kill()
    raise AssertionError("the server did not start")


@pytest.mark.parametrize("shutdown_timeout", [30.0, 0.0])
def test_sigterm_drains_then_exits_zero(tiny_llama, shutdown_timeout, tmp_path):
    """Within the timeout a stream finishes; past it, it ends with an error chunk. New
    requests meanwhile get 503, and the process exits 0 either way."""
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    process = start_server(tiny_llama, port, shutdown_timeout, log)
    url = f"http://127.0.0.1:{port}"
    try:
        request = body(max_tokens=480, stream=True)
        chunks = []
        with httpx.stream("POST", url + "/v1/completions", json=request, timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                chunks.append(line[6:])
                if len(chunks) == 1:
                    process.send_signal(signal.SIGTERM)
                    if shutdown_timeout:  # (with none, the listener closes at once)
                        time.sleep(0.1)  # the drain starts on the server's next loop turn
                        refused = httpx.post(url + "/v1/completions", json=body(), timeout=10)
                        assert refused.status_code == 503
                        assert "shutting down" in refused.json()["error"]["message"]
        assert chunks[-1] == "[DONE]"
        last = json.loads(chunks[-2])
        if shutdown_timeout:
            assert last["choices"][0]["finish_reason"] == "length"
        else:
            assert (
                last["error"]["code"] == "shutting_down" and "shut down" in last["error"]["message"]
            )
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        log.close()
