"""`inflight serve --replicas N`: starts Ray (or joins a cluster) and deploys the gateway and N
engine replicas, routed by `router.py`."""

from __future__ import annotations

import os
import time
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from inflight.config import EngineConfig
from inflight.errors import ConfigError
from inflight.server.fleet.gateway import build_gateway_app
from inflight.server.fleet.replica import EngineReplica

ROUTER_CLASS = "inflight.server.fleet.router.InflightRouter"


def deploy(knobs: dict[str, Any], config: Any, replicas: int, router: str,
           ray_address: str | None, max_queued_requests: int | None,
           request_timeout: float | None) -> None:  # fmt: skip
    """Starts Ray (or joins `ray_address`), deploys the gateway and `replicas` engines, and
    serves until interrupted."""
    ray.init(address=ray_address, namespace="inflight", ignore_reinit_error=True,
             include_dashboard=False)  # fmt: skip
    one_machine = ray_address is None
    start_fleet(knobs, config, replicas, router, one_machine, max_queued_requests,
                request_timeout)  # fmt: skip
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


def start_fleet(knobs: dict[str, Any], config: Any, replicas: int, router: str = "prefix-aware",
                one_machine: bool = True, max_queued_requests: int | None = None,
                request_timeout: float | None = None) -> None:  # fmt: skip
    """Deploys (or redeploys) the application on the Ray instance this process is attached to.
    On `one_machine`, each engine gets its share of the cores (torch threads) and of the KV
    budget."""
    from inflight.model.loader import resolve_model_path
    from inflight.server.api_server import build_app

    threads = None
    if one_machine:
        threads = max(1, (os.cpu_count() or 1) // replicas)
        if knobs.get("kv_cache_memory_bytes") is not None:
            knobs = {**knobs, "kv_cache_memory_bytes": knobs["kv_cache_memory_bytes"] // replicas}
    placement: dict[str, Any] = {}
    if knobs.get("tensor_parallel_size", 1) > 1:  # each replica one group of Ray ranks
        knobs, threads, placement = tensor_parallel_placement(knobs, replicas)
    gateway = build_gateway_app(resolve_model_path(knobs.get("model")), config, build_app)
    engines = EngineReplica.options(  # type: ignore[attr-defined]  # added by @serve.deployment
        num_replicas=replicas, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000,
        **placement,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS, request_router_kwargs={"policy": router},
            request_routing_stats_period_s=1.0,
        ),
    ).bind(knobs, threads, max_queued_requests, request_timeout)  # fmt: skip
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(gateway.bind(engines), name="inflight", route_prefix="/")


def tensor_parallel_placement(
    knobs: dict[str, Any], replicas: int
) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """Each replica a tensor-parallel group of Ray ranks (`parallel/ray_ranks.py`): a placement
    group of a bundle per rank, the replica itself rank 0 in the first. Refused, naming the
    nodes, where the cluster cannot hold every replica's bundles."""
    from inflight.parallel.ray_ranks import (
        bundles_fit,
        default_cpus_per_rank,
        describe,
        node_cpus,
    )

    model = EngineConfig.from_knobs(**knobs).model  # the knobs checked, as an engine would
    size = model.tensor_parallel_size
    nodes = node_cpus()
    cpus = model.ray_cpus_per_rank or default_cpus_per_rank(nodes)
    if not bundles_fit(replicas * size, cpus, nodes, None):
        raise ConfigError(f"{replicas} replicas of {size} tensor-parallel ranks need "
                          f"{replicas * size} bundles of {cpus} CPUs; the Ray cluster has "
                          f"{len(nodes)} nodes ({describe(nodes)})")  # fmt: skip
    knobs = {**knobs, "distributed_executor_backend": "ray", "ray_cpus_per_rank": cpus}
    placement = {"placement_group_bundles": [{"CPU": cpus}] * size,
                 "placement_group_strategy": "PACK"}  # fmt: skip
    return knobs, cpus, placement
