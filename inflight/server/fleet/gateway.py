"""The gateway: inflight's FastAPI app over `RemoteEngine`, an `EngineClient` whose requests run
on the engine replicas (validated and tokenized here first), and the Serve ingress around it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from ray import serve
from transformers import PreTrainedTokenizerBase

from inflight.engine.client import EngineClient, FeedSource
from inflight.engine.frontend import render_chat
from inflight.engine.processor import InputProcessor, ParentRequest, PromptInput
from inflight.errors import EngineDeadError, InflightError, InvalidRequestError
from inflight.metrics.live import LiveFeed
from inflight.model.generation_config import SamplingDefaults
from inflight.outputs import RequestOutput
from inflight.request import DEFAULT_TENANT, NO_SLO, Request, SLOTarget
from inflight.routing import prefix_key
from inflight.sampling_params import SamplingParams
from inflight.server.fleet.hub import (
    HUB_NAME,
    REPLICA_FRESH_S,
    REPORT_PERIOD_S,
    MergedMetrics,
    merge_metrics,
)
from inflight.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

RETRIES_BEFORE_FIRST_OUTPUT = 2


class ReplicaView:
    """One engine's live feed at the gateway, as the dashboard's broadcaster reads an engine."""

    def __init__(self, remote: RemoteEngine, replica: str) -> None:
        self.remote, self.replica = remote, replica

    @property
    def feed(self) -> LiveFeed:
        entry = self.remote.replica_feeds.get(self.replica)
        return entry[0] if entry else LiveFeed()  # until its first one arrives

    def clock(self) -> float:
        """The engine's clock (its feed's timestamps): as it was when sent, plus the time since."""
        entry = self.remote.replica_feeds.get(self.replica)
        if entry is None:
            return time.monotonic()
        _, clock, received = entry
        return clock + (time.monotonic() - received)

    @property
    def is_alive(self) -> bool:
        return self.replica in self.remote.replica_views()

    @property
    def draining(self) -> bool:
        return self.remote.draining

    def watch(self, delta: int) -> None:
        self.remote.watch(delta)


class RemoteEngine:
    """The gateway's engine: a `FleetClient` whose requests run on the engine replicas."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path
        self.handle: Any = None
        self.feed = LiveFeed()  # counts the gateway's open dashboards; engines' feeds below
        self.replica_feeds: dict[str, tuple[LiveFeed, float, float]] = {}  # feed, clock, at
        self.draining = False
        self.dead_error: BaseException | None = None
        self.metrics = MergedMetrics()
        self._info: dict[str, Any] = {}
        self._processor: InputProcessor | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._ids = 0
        self._up = 0
        self._fresh: list[str] = []
        self._refresher: asyncio.Task | None = None

    # ---- lifecycle
    async def start(self) -> None:
        self.handle = serve.get_deployment_handle("EngineReplica", app_name="inflight")
        self._info = await self.handle.describe.remote()
        tokenizer = load_tokenizer(Path(self._info["model_path"]))
        tokenizer.chat_template = self._info["chat_template"]  # the engines' (a knob's or own)
        self._processor = InputProcessor(tokenizer, self._info["max_model_len"],
                                         self._info["vocab_size"],
                                         frozenset(self._info["eos_token_ids"]))  # fmt: skip
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="inflight-tokenizer")
        await self.refresh()
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REPORT_PERIOD_S)
            try:
                await self.refresh()
            except Exception:  # the hub restarting: keep the last view
                logger.warning("could not read the engines' metrics", exc_info=True)

    async def shutdown(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def drain(self, timeout: float) -> int:
        self.draining = True
        return 0

    def knobs(self) -> dict[str, Any]:
        return dict(self._info.get("knobs", {}))

    def watch(self, delta: int) -> None:
        self.feed.watchers += delta

    def clock(self) -> float:
        """The gateway's own feed only counts its open pages; replicas' feeds have their clocks."""
        return time.monotonic()

    def replica_views(self) -> dict[str, FeedSource]:
        """The engines that reported recently (their feeds arrive once a page watches)."""
        return {r: ReplicaView(self, r) for r in self._fresh}

    # ---- what the server reads
    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._processor.tokenizer  # type: ignore[union-attr]  # set by start()

    @property
    def max_model_len(self) -> int:
        return self._info["max_model_len"]

    @property
    def vocab_size(self) -> int:
        return self._info["vocab_size"]

    @property
    def embedding_size(self) -> int | None:
        return None  # the replicas serve generation only (`process` refuses embeddings)

    @property
    def shorter_embeddings(self) -> bool:
        return False

    @property
    def num_kv_blocks(self) -> int:
        return self._info["num_kv_blocks"]

    @property
    def sampling_defaults(self) -> SamplingDefaults:
        return SamplingDefaults(**self._info["sampling_defaults"])

    @property
    def is_alive(self) -> bool:
        return self.replicas_up() > 0

    def replicas_up(self) -> int:
        return self._up

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return render_chat(self.tokenizer, messages, tools, template_kwargs)

    async def run_tokenizer(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._processor.tokenize(text, add_special_tokens)[1]  # type: ignore[union-attr]

    # ---- requests
    def process(self, prompt: PromptInput, params: SamplingParams, *, priority: int = 0,
                add_special_tokens: bool = True, cache_salt: str | None = None,
                embed: bool = False, tenant: str = DEFAULT_TENANT, slo: SLOTarget = NO_SLO,
                ) -> tuple[ParentRequest, list[Request]]:  # fmt: skip
        """Validates here, so a bad request never reaches an engine; `tenant` travels with the
        request to its replica, whose scheduler shares that replica between tenants."""
        if embed:  # the replicas' deployment streams generations only
            raise InvalidRequestError("embeddings are not served with --replicas", "model",
                                      "model_not_supported")  # fmt: skip
        self._ids += 1
        return self._processor.process(  # type: ignore[union-attr]
            f"gw-{self._ids}", prompt, params, priority=priority,
            add_special_tokens=add_special_tokens, cache_salt=cache_salt, tenant=tenant, slo=slo,
        )  # fmt: skip

    def check_capacity(self, num_sequences: int = 1) -> None:
        """Each engine bounds its own queue; the gateway refuses only when none is up."""
        if not self.is_alive:
            raise EngineDeadError("no engine replica is up")

    def check_slo(self, processed: list[tuple[ParentRequest, list[Request]]]) -> None:
        """SLO admission is each engine's, on its own queue; through replicas nothing is
        refused for a forecast (the router would need every replica's queue)."""

    def check_queue_slo(self, slo: SLOTarget) -> None:
        """As `check_slo`: nothing refused through replicas."""

    def submit(
        self, processed: tuple[ParentRequest, list[Request]]
    ) -> AsyncGenerator[RequestOutput, None]:
        parent, children = processed
        salt = children[0].cache_salt
        call = functools.partial(
            self.handle.options(stream=True).generate.remote, parent.prompt_token_ids,
            parent.params, priority=children[0].priority, cache_salt=salt,
            prefix_key=prefix_key(parent.prompt_token_ids, self._info["block_size"], salt),
            tenant=children[0].tenant, slo=children[0].slo,
        )  # fmt: skip
        return self._outputs(parent, call)

    async def _outputs(
        self, parent: ParentRequest, call: Callable[[], Any]
    ) -> AsyncGenerator[RequestOutput, None]:
        """The engine's outputs. An engine that dies before its first output (the request was
        queued there) is retried on another; one that dies mid-stream ends it with an error."""
        for attempt in range(1 + RETRIES_BEFORE_FIRST_OUTPUT):
            stream, started = call(), False
            try:
                async for out in stream:
                    started = True
                    out.request_id, out.prompt = parent.request_id, parent.prompt
                    yield out
                return
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if isinstance(e.cause, Exception) else e
                if isinstance(cause, InflightError):
                    raise cause from None
                raise EngineDeadError(f"the engine replica failed: {cause}") from None
            except ray.exceptions.RayActorError as e:
                if started or attempt == RETRIES_BEFORE_FIRST_OUTPUT:
                    raise EngineDeadError(
                        f"the engine replica serving this request died ({type(e).__name__})"
                    ) from None
                logger.warning("an engine replica died before answering; retrying elsewhere")
            finally:
                stream.cancel()

    async def refresh(self) -> str:
        """The engines' merged /metrics, and how many reported recently."""
        hub = ray.get_actor(HUB_NAME)
        watched = self.feed.watchers > 0
        reports = await hub.collect.remote(watched)
        fresh = {r: text for r, (age, text) in reports.items() if age < REPLICA_FRESH_S}
        if watched:
            feeds = await hub.collect_feeds.remote()
            now = time.monotonic()
            self.replica_feeds = {
                r: (feed, clock + age, now) for r, (age, feed, clock) in feeds.items() if r in fresh
            }
        self._up = len(fresh)
        self._fresh = sorted(fresh)
        self.metrics.text = merge_metrics(fresh)
        return self.metrics.text


def build_gateway_app(
    model_path: Path, config: Any, build_app: Callable[[EngineClient, Any], Any]
) -> Any:
    remote = RemoteEngine(model_path)
    fastapi_app = build_app(remote, config)

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
    @serve.ingress(fastapi_app)
    class Gateway:
        def __init__(self, engines: Any) -> None:
            self.engines = engines

    return Gateway
