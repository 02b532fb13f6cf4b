"""Ray Serve's request router for the engine replicas: `inflight.routing`'s policy applied to
each request's prefix key (a keyword argument of the call) and the replicas' loads.

Ray Serve pickles this module by value into the process that routes: it holds no state of its
own (counters live in `hub.py`, imported where they are counted).
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from inflight.routing import make_router


class InflightRouter(RequestRouter):
    """Ray Serve's request router, applying `inflight.routing` (prefix-aware by default)."""

    def initialize_state(self, policy: str = "prefix-aware", **kwargs: Any) -> None:
        self.policy = make_router(policy)

    def _load(self, replica: RunningReplica) -> int:
        cached = self.replica_queue_len_cache.get(replica.replica_id)
        if cached is not None:
            return cached
        return int((replica.routing_stats or {}).get("load", 0))

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id: r for r in candidate_replicas}
        if not by_id:
            return []
        prefix = pending_request.kwargs.get("prefix_key", []) if pending_request else []
        before = self.policy.prefix_routed
        chosen = self.policy.choose(prefix, {rid: self._load(r) for rid, r in by_id.items()})
        from inflight.server.fleet.hub import ROUTED

        ROUTED.labels(routed="prefix" if self.policy.prefix_routed > before else "load").inc()
        return [[by_id[chosen]], [r for rid, r in by_id.items() if rid != chosen]]
