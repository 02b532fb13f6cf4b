"""One engine replica of the fleet: an `AsyncLLM` with its share of the machine, reporting to
the metrics hub once a second."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from inflight.engine.async_engine import AsyncLLM
from inflight.engine.processor import PromptInput
from inflight.outputs import RequestOutput
from inflight.request import DEFAULT_TENANT, NO_SLO, SLOTarget
from inflight.sampling_params import SamplingParams
from inflight.server.fleet.hub import HUB_NAME, REPORT_PERIOD_S, MetricsHub

logger = logging.getLogger(__name__)


@serve.deployment
class EngineReplica:
    """One engine. Its share of the machine is set by the caller through `knobs`/`threads`."""

    def __init__(self, knobs: dict[str, Any], threads: int | None, queue: int | None,
                 timeout: float | None) -> None:  # fmt: skip
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.engine = AsyncLLM(max_queued_requests=queue, request_timeout=timeout, **knobs)
        self.name = serve.get_replica_context().replica_id.unique_id
        self._started = False
        hub = MetricsHub.options  # type: ignore[attr-defined]  # added by @ray.remote
        self._hub = hub(name=HUB_NAME, get_if_exists=True, lifetime="detached").remote()
        threading.Thread(target=self._report, name="inflight-metrics-push", daemon=True).start()

    def _report(self) -> None:
        """Once a second: /metrics to the hub, and the live feed while a dashboard watches."""
        watched = False
        while True:
            try:
                feed = self.engine.feed if watched else None
                wanted = ray.get(self._hub.report.remote(
                    self.name, self.engine.metrics.render().decode(), feed, time.monotonic(),
                ), timeout=10)  # fmt: skip
                if wanted != watched:  # the engine keeps its request table fresh meanwhile
                    self.engine.watch(+1 if wanted else -1)
                    watched = wanted
            except Exception:  # the hub restarting: report again next time
                logger.debug("metrics report failed", exc_info=True)
            time.sleep(REPORT_PERIOD_S)

    async def _start(self) -> None:
        if not self._started:
            self._started = True
            await self.engine.start()

    def describe(self) -> dict[str, Any]:
        """What the gateway needs to validate requests as the engines would."""
        return {
            "model_path": str(self.engine.model_path),
            "max_model_len": self.engine.max_model_len,
            "vocab_size": self.engine.vocab_size,
            "eos_token_ids": sorted(self.engine.eos_token_ids),
            "sampling_defaults": self.engine.sampling_defaults.given(),
            "chat_template": self.engine.tokenizer.chat_template,  # the one in effect
            "num_kv_blocks": self.engine.num_kv_blocks,
            "block_size": self.engine.block_size,
            "knobs": self.engine.knobs(),
        }

    def record_routing_stats(self) -> dict[str, Any]:
        return {"load": self.engine.num_unfinished_sequences}

    async def check_health(self) -> None:
        if self._started and not self.engine.is_alive:
            raise RuntimeError(f"engine stopped: {self.engine.dead_error}")

    async def generate(
        self,
        prompt: PromptInput,
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str | None = None,
        prefix_key: list[int] | None = None,  # read by the router
        tenant: str = DEFAULT_TENANT,  # whose share it uses under `fair` (in this replica)
        slo: SLOTarget = NO_SLO,  # its latency targets (goodput counts them)
    ) -> AsyncIterator[RequestOutput]:
        await self._start()
        processed = await self.engine.run_tokenizer(functools.partial(
            self.engine.process, prompt, params, priority=priority, add_special_tokens=False,
            cache_salt=cache_salt, tenant=tenant, slo=slo,
        ))  # fmt: skip
        self.engine.check_capacity(len(processed[1]))
        async for out in self.engine.submit(processed):
            yield out
