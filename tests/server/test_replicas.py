"""`inflight serve --replicas 2` on Ray Serve, with the tiny model: the official client through
the gateway, prefix-aware routing on the engines' own prefix-hit counters, and a replica killed
mid-stream. One Ray instance and one deployment for the module (~10 s and ~20 s to start).
On the same instance: tensor-parallel ranks as Ray actors, and a replica's engine as rank 0 of
its own placement group."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
import ray
from ray import serve
from ray.util.placement_group import placement_group, remove_placement_group

from inflight import LLM, SamplingParams
from inflight.errors import ConfigError
from inflight.metrics.doctor import Snapshot
from inflight.parallel.ray_ranks import RayRanks
from inflight.server.api_server import ServerConfig
from inflight.server.fleet.deploy import start_fleet, tensor_parallel_placement

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet(tiny_llama):
    ray.init(num_cpus=2, namespace="inflight-tests", include_dashboard=False,
             log_to_driver=False)  # fmt: skip
    port = free_port()
    config = ServerConfig(host="127.0.0.1", port=port, served_model_name="tiny",
                          tenant_header=True)  # fmt: skip
    knobs = {"model": str(tiny_llama), "dtype": "float32", "max_model_len": 512,
             "num_kv_blocks": 256}  # fmt: skip

    url, deployed = f"http://127.0.0.1:{port}", []

    def deploy(router: str) -> str:
        """The fleet with `router`; redeployed (~10 s) only when the router changes."""
        if deployed[-1:] != [router]:
            start_fleet(knobs, config, replicas=2, router=router)
            deployed.append(router)
        wait_for(lambda: health(url).get("replicas_up") == 2, 60)
        return url

    try:
        yield deploy
    finally:
        serve.shutdown()
        ray.shutdown()


def wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.25)


def health(url: str) -> dict:
    try:
        r = httpx.get(url + "/health", timeout=5)
    except httpx.HTTPError:
        return {}
    return r.json() if r.status_code == 200 else {}


def per_replica(url: str, name: str) -> dict[str, float]:
    snapshot = Snapshot.parse(time.time(), httpx.get(url + "/metrics", timeout=10).text)
    return {dict(labels)["replica"]: value for labels, value in snapshot.labelled(name).items()}


def test_the_openai_client_works_through_the_replicas(fleet):
    url = fleet("prefix-aware")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    (card,) = client.models.list().data
    assert card.id == "tiny"
    r = client.completions.create(model="tiny", prompt="The quick", max_tokens=5,
                                  temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        temperature=0, stream=True, extra_body={"ignore_eos": True},
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert text == whole.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:  # refused by the gateway
        client.completions.create(model="tiny", prompt="x", max_tokens=2,
                                  extra_body={"structured_outputs": {"regex": "(("}})  # fmt: skip
    assert e.value.body["param"] == "structured_outputs"
    running = per_replica(url, "inflight_requests_running")
    assert len(running) == 2  # every engine's series, labelled by replica
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert 'inflight_router_decisions_total{routed="load"}' in metrics
    # the tenant a request names travels with it to the engine that serves it
    client.completions.create(model="tiny", prompt="for a tenant", max_tokens=3,
                              extra_headers={"x-tenant": "team-x"})  # fmt: skip

    def team_tokens() -> float:
        snapshot = Snapshot.parse(time.time(), httpx.get(url + "/metrics", timeout=10).text)
        return sum(v for labels, v in snapshot.labelled("inflight_tenant_tokens_total").items()
                   if dict(labels).get("tenant") == "team-x")  # fmt: skip

    wait_for(lambda: team_tokens() > 0, 10)  # (the engines report once a second)


def _events(url: str, replica: str | None, until, timeout: float = 30.0) -> list[dict]:
    """The dashboard's events for one engine (hello first), read until `until(events)`."""
    query = f"?replica={replica}" if replica else ""
    events, deadline = [], time.monotonic() + timeout
    with httpx.stream("GET", f"{url}/dashboard/events{query}", timeout=timeout) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if until(events) or time.monotonic() > deadline:
                    break
    return events


def test_the_dashboard_switches_between_replicas(fleet):
    url = fleet("prefix-aware")
    (hello,) = _events(url, None, lambda e: len(e) == 1)
    replicas = hello["replicas"]
    assert len(replicas) == 2 and hello["replica"] == replicas[0]
    for replica in replicas:

        def busy(replica: str = replica) -> None:
            for i in range(4):  # routed by load: both engines decode while the page watches
                httpx.post(url + "/v1/completions", json={
                    "prompt": f"dash {replica} {i}", "max_tokens": 40, "ignore_eos": True},
                    timeout=60)  # fmt: skip

        load = threading.Thread(target=busy)
        load.start()
        events = _events(url, replica, lambda e: any(x.get("steps") for x in e[1:]))
        load.join()
        assert events[0]["replica"] == replica
        steps = [row for x in events[1:] for row in x.get("steps", [])]
        assert steps, "the chosen engine's steps reach the page"


def test_a_client_that_vanishes_mid_stream_is_aborted_in_its_engine(fleet):
    url = fleet("prefix-aware")
    body = {"prompt": "vanish", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk, then the client leaves

    # aborted in its engine within a step (the engines report their counters once a second)
    def aborted() -> float:
        snapshot = Snapshot.parse(time.time(), httpx.get(url + "/metrics", timeout=10).text)
        counts = snapshot.labelled("inflight_requests_finished_total")
        return sum(v for k, v in counts.items() if dict(k)["finish_reason"] == "abort")

    wait_for(lambda: aborted() >= 1, 10)
    wait_for(lambda: sum(per_replica(url, "inflight_requests_running").values()) == 0, 10)


def _hit_rate(url: str, system_prompts: list[str]) -> float:
    """Sequential requests behind a few system prompts; the fleet's prefix-cache hit rate."""
    before_q = per_replica(url, "inflight_prefix_cache_queries_total")
    before_h = per_replica(url, "inflight_prefix_cache_hits_total")
    for i in range(3):
        for system in system_prompts:
            httpx.post(url + "/v1/completions", json={
                "prompt": f"{system} Question {i}:", "max_tokens": 2, "temperature": 0},
                timeout=60).raise_for_status()  # fmt: skip
    time.sleep(1.5)  # the engines report their counters once a second
    after_q = per_replica(url, "inflight_prefix_cache_queries_total")
    after_h = per_replica(url, "inflight_prefix_cache_hits_total")
    queries = sum(after_q[r] - before_q.get(r, 0) for r in after_q)
    return sum(after_h[r] - before_h.get(r, 0) for r in after_h) / queries


def test_prefix_aware_routing_sends_each_prefix_to_the_replica_that_holds_it(fleet):
    """3 system prompts x 3 questions in turn: sent where each prompt's blocks are, 6 of the 9
    requests hit them (~0.5 of the tokens asked); round-robin alternates 2 replicas under the
    same order, so only 2 of the 9 can (~0.17). The simulator compares the two routers on
    fleets of every size (tests/sim/test_fleet_routing.py)."""
    prompts = [f"alpha system prompt {k}: " + "Numbers like 12345 appear in tables. " * 6
               for k in range(3)]  # fmt: skip
    aware = _hit_rate(fleet("prefix-aware"), prompts)
    print(f"fleet prefix-cache hit rate, prefix-aware: {aware:.3f}")
    assert aware > 0.35


def test_a_killed_replica_ends_its_streams_with_an_error_and_the_fleet_serves_on(fleet):
    url = fleet("prefix-aware")
    results: list[str] = []
    streaming = [threading.Event() for _ in range(6)]

    def stream(i: int) -> None:
        # as long as the tiny model allows: still streaming when the replica is killed
        body = {"prompt": f"stream {i}", "max_tokens": 500, "ignore_eos": True,
                "temperature": 0, "stream": True}  # fmt: skip
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    streaming[i].set()
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        results.append("error" if "error" in last else last["choices"][0]["finish_reason"])

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    # every stream has its first token, so the router has placed it (over both engines; on a
    # busy machine that can take longer than any fixed wait)
    assert all(e.wait(timeout=60) for e in streaming)
    # a replica with streams on it (wherever the router put them): the one with the most
    wait_for(lambda: sum(per_replica(url, "inflight_requests_running").values()) == 6, 30)
    running = per_replica(url, "inflight_requests_running")
    busiest = max(running, key=running.get)
    (victim,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if "EngineReplica" in a["name"] and a["name"].endswith(busiest)]  # fmt: skip
    killed_at = time.monotonic()
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    # requests sent at once, some routed to the dead engine before the fleet knows: retried
    statuses: list[int] = []
    late = [threading.Thread(target=lambda i=i: statuses.append(httpx.post(
        url + "/v1/completions", json={"prompt": f"late {i}", "max_tokens": 3},
        timeout=60).status_code)) for i in range(4)]  # fmt: skip
    for t in late:
        t.start()
    for t in late:
        t.join(timeout=60)
    assert statuses == [200] * 4
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)  # nothing hangs
    assert len(results) == 6 and set(results) <= {"length", "error"}
    print(f"streams: {results}, all ended {time.monotonic() - killed_at:.1f} s after the kill")
    assert "error" in results  # the victim's streams: an OpenAI-shaped error chunk, then [DONE]
    # a new engine replaces the dead one, and requests are served (a new process importing
    # torch and building its engine: past 90 s on 2 cores shared by three test workers)
    wait_for(lambda: health(url).get("replicas_up") == 2, 240)
    r = httpx.post(url + "/v1/completions", json={"prompt": "after", "max_tokens": 3},
                   timeout=60)  # fmt: skip
    assert r.status_code == 200


def greedy(llm: LLM, prompts: list[str]) -> list[str]:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]


PROMPTS = ["Continuous batching", "The quick brown fox", "Numbers like 12345"]
UNSPLIT = {"dtype": "float32", "num_kv_blocks": 64}


@pytest.fixture(scope="module")
def unsplit_texts(tiny_llama) -> list[str]:
    """One unsplit engine's greedy texts of PROMPTS."""
    return greedy(LLM(str(tiny_llama), **UNSPLIT), PROMPTS)


def test_ranks_as_ray_actors_give_one_ranks_tokens(fleet, tiny_llama, unsplit_texts,
                                                   monkeypatch):  # fmt: skip
    """Rank 1 a Ray actor in a placement group, its all-reduces through gloo as across nodes
    (/dev/shm turned off: the test's one node would offer it); its bundle goes back to the
    cluster when the engine closes."""
    monkeypatch.setattr("inflight.parallel.workers.shared_memory_usable", lambda: False)
    llm = LLM(str(tiny_llama), tensor_parallel_size=2, distributed_executor_backend="ray",
              ray_cpus_per_rank=1, **UNSPLIT)  # fmt: skip
    workers = llm.core.workers
    assert isinstance(workers.launcher, RayRanks) and workers.group._shm is None
    assert greedy(llm, PROMPTS) == unsplit_texts
    assert workers.peak_rss_bytes()[0] > 0
    workers.close()
    wait_for(lambda: ray.available_resources().get("CPU", 0) == 2, 30)


def test_a_cluster_without_room_for_the_ranks_is_refused_before_loading(fleet, tiny_llama,
                                                                       monkeypatch):  # fmt: skip
    """By default a rank reserves a node's every CPU: two ranks need two nodes, and this
    cluster has one. Refused naming its nodes, before any weight loads."""
    monkeypatch.setattr("inflight.engine.engine_core.load_model", None)  # loading would fail
    with pytest.raises(ConfigError, match=r"needs 2 bundles of 2 CPUs.*has 1 nodes \(\w+: 2 CPUs"):
        LLM(str(tiny_llama), tensor_parallel_size=2, distributed_executor_backend="ray")
    with pytest.raises(ConfigError, match="ray_cpus_per_rank must be an integer from 1 to"):
        start_fleet({"model": str(tiny_llama), "tensor_parallel_size": 2, "ray_cpus_per_rank": -1},
                    ServerConfig(), replicas=1)  # fmt: skip
    with pytest.raises(ConfigError, match="2 replicas of 2 tensor-parallel ranks need 4 bundles"):
        start_fleet({"model": str(tiny_llama), "tensor_parallel_size": 2, "ray_cpus_per_rank": 1},
                    ServerConfig(), replicas=2)  # fmt: skip


def test_a_replica_in_its_placement_group_is_rank_0_of_its_ranks(
    fleet, tiny_llama, unsplit_texts, monkeypatch
):
    """What `serve --tensor-parallel-size 2` deploys: each replica with a placement group of a
    bundle per rank (the options `start_fleet` gives Serve), the replica in the first bundle,
    where its engine finds the group its ranks take. Here this process stands in for the
    replica (the group is handed to it as Ray hands a replica its own): Serve's own start of
    such a replica would cost this module ~20 s more."""
    knobs = {"model": str(tiny_llama), **UNSPLIT, "tensor_parallel_size": 2,
             "ray_cpus_per_rank": 1}  # fmt: skip
    knobs, threads, placement = tensor_parallel_placement(knobs, replicas=1)
    assert placement == {"placement_group_bundles": [{"CPU": 1}] * 2,
                         "placement_group_strategy": "PACK"}  # fmt: skip
    assert knobs["distributed_executor_backend"] == "ray" and threads == 1
    group = placement_group(placement["placement_group_bundles"], strategy="PACK")
    assert group.wait(timeout_seconds=30)
    monkeypatch.setattr("inflight.parallel.ray_ranks.get_current_placement_group", lambda: group)
    try:
        llm = LLM(**knobs)
        launcher = llm.core.workers.launcher
        assert launcher._pg is group and not launcher._owned, "the replica's group, not a new one"
        assert greedy(llm, PROMPTS) == unsplit_texts
        llm.core.workers.close()
    finally:
        remove_placement_group(group)
