"""Ranks 1..N-1 as Ray actors, so that a model split over ranks can span a cluster's nodes
(`distributed_executor_backend="ray"`).

The ranks sit in a placement group of N bundles of `cpus_per_rank` CPUs each (PACK): bundle r
holds rank r. Inside a Ray Serve replica deployed with such bundles (`inflight serve --replicas
--tensor-parallel-size`), the replica is rank 0 in bundle 0 of its own group, so each replica
is one tensor-parallel group; elsewhere the engine makes the group, bundle 0 pinned to this
node for itself. By default a bundle asks for every CPU of the cluster's smallest node: one
rank per node. A cluster that cannot hold the bundles, even idle, is refused before any weight
loads, naming its nodes; one that could but is busy is waited for, then refused the same way.

Each actor runs `workers.run_rank`: it dials rank 0 at this node's address, and the collectives
go through gloo over TCP (through /dev/shm where every bundle landed on rank 0's node).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from inflight.errors import ConfigError
from inflight.parallel.workers import STOP_GRACE_S, RankArgs, peak_rss_bytes, run_rank

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 60.0  # for a busy cluster to free the bundles


@ray.remote(max_concurrency=2)  # `run` holds one thread for the rank's life; `peak_rss` the other
class RankActor:
    def run(self, rank: int, args: RankArgs) -> None:
        log_format = f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"
        logging.basicConfig(level=logging.INFO, format=log_format)
        run_rank(rank, args)

    def peak_rss(self) -> int:
        return peak_rss_bytes(os.getpid())


def node_cpus() -> dict[str, int]:
    """Each alive node's CPUs, by node id."""
    return {node["NodeID"]: int(node["Resources"].get("CPU", 0))
            for node in ray.nodes() if node["Alive"]}  # fmt: skip


def default_cpus_per_rank(nodes: dict[str, int]) -> int:
    """Every CPU of the smallest node that has any (a head node may offer none): one rank a
    node."""
    with_cpus = [cpus for cpus in nodes.values() if cpus > 0]
    if not with_cpus:
        raise ConfigError(f"the Ray cluster offers no CPUs for tensor-parallel ranks "
                          f"({describe(nodes)})")  # fmt: skip
    return min(with_cpus)


def bundles_fit(size: int, cpus: int, nodes: dict[str, int], first_node: str | None) -> bool:
    """Whether `size` bundles of `cpus` CPUs fit the nodes' CPUs at all, the first one on
    `first_node` where it is named."""
    room = {node: total // cpus for node, total in nodes.items()}
    if first_node is not None:
        if room.get(first_node, 0) < 1:
            return False
        room[first_node] -= 1
        size -= 1
    return sum(room.values()) >= size


def describe(nodes: dict[str, int]) -> str:
    return ", ".join(f"{node[:8]}: {cpus} CPUs" for node, cpus in nodes.items())


class RayRanks:
    """Starts ranks 1..N-1 as `RankActor`s in their bundles; a rank whose actor ended is dead."""

    same_machine = False

    def __init__(self, size: int, cpus_per_rank: int | None) -> None:
        if not ray.is_initialized():
            raise ConfigError("distributed_executor_backend ray needs a Ray cluster: call "
                              "ray.init() first (inflight serve --ray-address does)")  # fmt: skip
        self.host = ray.util.get_node_ip_address()
        here = ray.get_runtime_context().get_node_id()
        self._pg, self._owned = self._placement(size, cpus_per_rank, here)
        self.cpus_per_rank = max(1, int(self._pg.bundle_specs[-1].get("CPU", 1)))
        bundle_nodes = placement_group_table(self._pg)["bundles_to_node_id"]
        # every rank on this node: all-reduces through /dev/shm, as processes would
        self.same_machine = all(bundle_nodes[r] == here for r in range(size))
        self._actors: list[Any] = []
        self._runs: list[Any] = []

    def _placement(
        self, size: int, cpus: int | None, here: str
    ) -> tuple[PlacementGroup, bool]:  # fmt: skip
        """The replica's placement group where it has a bundle per rank, else a new one (owned),
        bundle 0 on this node; refused where the cluster cannot hold it."""
        current = get_current_placement_group()
        if current is not None and len(current.bundle_specs) >= size:
            return current, False
        nodes = node_cpus()
        cpus = cpus or default_cpus_per_rank(nodes)
        need = (f"a tensor-parallel group of {size} ranks needs {size} bundles of {cpus} CPUs "
                f"(the first on this node, {here[:8]})")  # fmt: skip
        if not bundles_fit(size, cpus, nodes, here):
            raise ConfigError(f"{need}; the Ray cluster has {len(nodes)} nodes ({describe(nodes)})")
        selectors = [{"ray.io/node-id": here}] + [{}] * (size - 1)
        pg = placement_group([{"CPU": cpus}] * size, strategy="PACK",
                             bundle_label_selector=selectors)  # fmt: skip
        if not pg.wait(timeout_seconds=PLACEMENT_TIMEOUT_S):
            remove_placement_group(pg)
            free = ray.available_resources().get("CPU", 0)
            raise ConfigError(f"{need}; the Ray cluster ({describe(nodes)}) did not free them "
                              f"within {PLACEMENT_TIMEOUT_S:g} s ({free:g} CPUs free)")  # fmt: skip
        return pg, True

    def start(self, rank: int, args: RankArgs) -> None:
        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=rank)
        cpus = self._pg.bundle_specs[rank].get("CPU", 0)
        options = RankActor.options  # type: ignore[attr-defined]  # added by @ray.remote
        actor = options(num_cpus=cpus, scheduling_strategy=strategy).remote()
        self._actors.append(actor)
        self._runs.append(actor.run.remote(rank, args))

    def dead_rank(self) -> str | None:
        done, _ = ray.wait(self._runs, num_returns=1, timeout=0) if self._runs else ([], [])
        if not done:
            return None
        rank = self._runs.index(done[0]) + 1
        try:
            ray.get(done[0])
        except Exception as e:  # (RayActorError, RayTaskError)
            return f"rank {rank} (a Ray actor) ended: {type(e).__name__}: {e}"
        return f"rank {rank} (a Ray actor) ended"

    def peak_rss_bytes(self) -> list[int]:
        try:
            return ray.get([a.peak_rss.remote() for a in self._actors], timeout=10)
        except Exception:  # an actor gone
            return [0] * len(self._actors)

    def stop(self) -> None:
        """Gives the actors `STOP_GRACE_S` to return from `run`, then kills them and frees the
        bundles this engine reserved (in the background, as processes are reaped)."""

        def reap() -> None:
            try:
                if self._runs:
                    ray.wait(self._runs, num_returns=len(self._runs), timeout=STOP_GRACE_S)
                for actor in self._actors:
                    ray.kill(actor)
                if self._owned:
                    remove_placement_group(self._pg)
            except Exception:  # Ray shutting down with this process: it ends them itself
                logger.debug("stopping the Ray ranks failed", exc_info=True)

        threading.Thread(target=reap, name="inflight-tp-reaper", daemon=True).start()
