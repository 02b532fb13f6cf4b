"""SLO admission at the server: a request predicted to miss its TTFT target gets a 429 with
`Retry-After` at once, targets come from the body or the server's defaults, bad targets are a
400 naming the field, and goodput is counted per tenant on /metrics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inflight.engine.async_engine import AsyncLLM
from tests.server.live import LiveServer


@pytest.fixture(scope="module")
def server(tiny_llama):
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64,
                      slo_ttft=30.0, scheduling_policy="edf")  # fmt: skip
    with LiveServer(engine, served_model_name="tiny", tenant_from_user=True) as s:
        yield s


def complete(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": "tiny", "prompt": "hello there", "max_tokens": 4, "ignore_eos": True, **body,
    })  # fmt: skip


def samples(server, name: str) -> dict[tuple, float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_a_request_that_would_miss_its_ttft_target_is_refused_with_when_to_retry(server):
    assert complete(server).status_code == 200  # a step or more: the step cost is fitted
    server.wait_idle()
    refused_before = samples(server, "inflight_requests_rejected_total")
    r = complete(server, slo_ttft=1e-9)
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["code"] == "slo_unmet" and error["type"] == "requests"
    assert "TTFT target" in error["message"]
    assert int(r.headers["retry-after"]) >= 1
    refused = samples(server, "inflight_requests_rejected_total")
    key = (("reason", "slo_unmet"),)
    assert refused[key] == refused_before.get(key, 0) + 1
    # a target it can meet, and the server's default, are admitted
    assert complete(server, slo_ttft=60).status_code == 200
    assert complete(server).status_code == 200


def test_goodput_counts_met_and_missed_targets_per_tenant(server):
    server.wait_idle()
    met0 = samples(server, "inflight_requests_slo_met_total")
    missed0 = samples(server, "inflight_requests_slo_missed_total")
    assert complete(server, user="patient", slo_ttft=60, slo_tpot=60).status_code == 200
    assert complete(server, user="hasty", slo_tpot=1e-9, max_tokens=6).status_code == 200
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "user": "patient", "slo_ttft": 60,
    })  # fmt: skip
    assert chat.status_code == 200
    server.wait_idle()
    met = samples(server, "inflight_requests_slo_met_total")
    missed = samples(server, "inflight_requests_slo_missed_total")
    patient, hasty = (("tenant", "patient"),), (("tenant", "hasty"),)
    assert met[patient] - met0.get(patient, 0) == 2
    assert missed[hasty] - missed0.get(hasty, 0) == 1
    assert met.get(hasty, 0) == met0.get(hasty, 0)


@pytest.mark.parametrize("field", ["slo_ttft", "slo_tpot"])
@pytest.mark.parametrize("value", [0, -1, "1", True, 1e308, 2**64, None])
def test_bad_targets_are_a_400_naming_the_field(server, field, value):
    if value is None:  # JSON's NaN, which Python's json writes and strict parsers refuse
        body = f'{{"model": "tiny", "prompt": "hi", "max_tokens": 1, "{field}": NaN}}'.encode()
        r = httpx.post(server.url + "/v1/completions", timeout=30, content=body,
                       headers={"content-type": "application/json"})  # fmt: skip
    else:
        r = complete(server, **{field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_without_a_default_target_forecasts_start_with_the_first_request_that_sets_one(
    tiny_llama,
):
    """No queue is built for forecasts until a request brings a TTFT target (that one is
    admitted unforecast unless the queue is published while it is tokenized); from then on the
    queue is published and a hopeless target refused."""
    engine = AsyncLLM(str(tiny_llama), dtype="float32", max_model_len=128, num_kv_blocks=64)
    with LiveServer(engine, served_model_name="tiny") as s:
        assert complete(s).status_code == 200
        s.wait_idle()
        assert engine._queue_state is None  # nobody asked for a target yet
        assert complete(s, slo_ttft=1e-9).status_code in (200, 429)
        s.wait_idle()
        assert engine._queue_state is not None
        assert complete(s, slo_ttft=1e-9).status_code == 429


def test_a_queue_that_alone_misses_the_target_is_refused_before_tokenizing(server, monkeypatch):
    """Under overload a refusal must cost next to nothing: when even a one-token prompt would
    miss its target behind the queue, the prompt is never tokenized."""
    assert complete(server).status_code == 200  # the step cost is fitted
    server.wait_idle()

    async def never(*args):
        raise AssertionError("tokenized a request the queue already refused")

    monkeypatch.setattr(server.engine, "run_tokenizer", never)
    r = complete(server, slo_ttft=1e-9)
    assert r.status_code == 429 and r.json()["error"]["code"] == "slo_unmet"
