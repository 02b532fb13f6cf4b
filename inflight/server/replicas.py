"""`inflight serve --replicas N`: N engines as one Ray Serve application behind the same routes.

- The gateway (one Serve replica, the HTTP ingress) runs inflight's FastAPI app over a
  `RemoteEngine`: it validates and tokenizes every request itself (a tokenizer, no weights), so
  bad input is a 400 before any engine sees it, and keys each request by its leading KV blocks.
- The engines (`EngineReplica`, N Serve replicas) each run an `AsyncLLM` with its share of the
  cores and of the KV budget, and stream `RequestOutput`s back.
- Ray Serve sends each call to an engine through `InflightRouter`, its request-router extension
  point, which applies `inflight.routing`'s policy to the request's prefix key and the engines'
  loads.
- Every engine pushes its `/metrics` text to a `MetricsHub` actor once a second; the gateway's
  `/metrics` merges them with a `replica` label and adds the router's counters, and `/health`
  fails only when no engine has reported recently.

When an engine dies, Ray Serve starts a new one; requests it was serving end with an error (an
error chunk on a stream), and the router sends new ones elsewhere.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.serve.config import RequestRouterConfig

from inflight.engine.async_engine import AsyncLLM
from inflight.engine.frontend import render_chat
from inflight.engine.processor import InputProcessor, ParentRequest, PromptInput
from inflight.errors import EngineDeadError, InflightError
from inflight.metrics.live import LiveFeed
from inflight.outputs import RequestOutput
from inflight.request import Request
from inflight.routing import prefix_key
from inflight.sampling_params import SamplingParams
from inflight.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

HUB_NAME = "inflight-metrics-hub"
REPORT_PERIOD_S = 1.0
REPLICA_FRESH_S = 5.0  # an engine not heard from for this long counts as down
RETRIES_BEFORE_FIRST_OUTPUT = 2

# Ray Serve imports the router from its path and pickles its module by value: that module keeps
# no state of its own, and counts into these (in the gateway's process, where the router of the
# gateway's engine handle runs).
ROUTER_CLASS = "inflight.server.ray_router.InflightRouter"
ROUTER_REGISTRY = CollectorRegistry()
ROUTED = Counter("inflight_router_decisions", "Engines the router chose, by why (Ray Serve may "
                 "route a request again when an engine refuses it)", ["routed"],
                 registry=ROUTER_REGISTRY)  # fmt: skip


@ray.remote(num_cpus=0)
class MetricsHub:
    """The engines' latest /metrics texts and, while a dashboard watches, their live feeds."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[float, str]] = {}
        self.feeds: dict[str, tuple[float, LiveFeed, float]] = {}  # at, feed, engine's clock
        self.watched_until = 0.0

    def report(self, replica: str, text: str, feed: LiveFeed | None, clock: float) -> bool:
        """Stores an engine's report; answers whether a dashboard wants its live feed."""
        now = time.time()
        self.reports[replica] = (now, text)
        if feed is not None:
            self.feeds[replica] = (now, feed, clock)
        return now < self.watched_until

    def collect(self, watched: bool = False) -> dict[str, tuple[float, str]]:
        now = time.time()
        if watched:  # a page is open at the gateway: engines send their feeds for a while
            self.watched_until = now + 3 * REPORT_PERIOD_S
        return {r: (now - t, text) for r, (t, text) in self.reports.items()}

    def collect_feeds(self) -> dict[str, tuple[float, LiveFeed, float]]:
        now = time.time()
        return {r: (now - t, feed, clock) for r, (t, feed, clock) in self.feeds.items()}


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


def merge_metrics(texts: dict[str, str]) -> str:
    """Prometheus texts of several engines -> one text, every sample labelled `replica`."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            entry = families.setdefault(family.name, (family.type, family.documentation, []))
            for s in family.samples:
                labels = {"replica": replica, **s.labels}
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                entry[2].append(f"{s.name}{{{body}}} {_number(s.value)}")
    lines = []
    for name, (kind, doc, samples) in families.items():
        lines += [f"# HELP {name} {_escape(doc)}", f"# TYPE {name} {kind}", *samples]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if value == value else "NaN"


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
        self._hub = MetricsHub.options(name=HUB_NAME, get_if_exists=True,
                                       lifetime="detached").remote()  # fmt: skip
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
    ) -> AsyncIterator[RequestOutput]:
        await self._start()
        processed = await self.engine.run_tokenizer(functools.partial(
            self.engine.process, prompt, params, priority=priority, add_special_tokens=False,
            cache_salt=cache_salt,
        ))  # fmt: skip
        self.engine.check_capacity(len(processed[1]))
        async for out in self.engine.submit(processed):
            yield out


class RemoteEngine:
    """The gateway's engine: `AsyncLLM`'s interface to the server, over the engine replicas."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path
        self.handle: Any = None
        self.feed = LiveFeed()  # counts the gateway's open dashboards; engines' feeds below
        self.replica_feeds: dict[str, tuple[LiveFeed, float, float]] = {}  # feed, clock, at
        self.draining = False
        self.dead_error: BaseException | None = None
        self.metrics = _MergedMetrics()
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

    def replica_views(self) -> dict[str, ReplicaView]:
        """The engines that reported recently (their feeds arrive once a page watches)."""
        return {r: ReplicaView(self, r) for r in self._fresh}

    # ---- what the server reads
    @property
    def tokenizer(self):
        return self._processor.tokenizer  # type: ignore[union-attr]

    @property
    def max_model_len(self) -> int:
        return self._info["max_model_len"]

    @property
    def vocab_size(self) -> int:
        return self._info["vocab_size"]

    @property
    def num_kv_blocks(self) -> int:
        return self._info["num_kv_blocks"]

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
                ) -> tuple[ParentRequest, list[Request]]:  # fmt: skip
        """Validates here, so a bad request never reaches an engine."""
        self._ids += 1
        return self._processor.process(  # type: ignore[union-attr]
            f"gw-{self._ids}", prompt, params, priority=priority,
            add_special_tokens=add_special_tokens, cache_salt=cache_salt,
        )  # fmt: skip

    def check_capacity(self, num_sequences: int = 1) -> None:
        """Each engine bounds its own queue; the gateway refuses only when none is up."""
        if not self.is_alive:
            raise EngineDeadError("no engine replica is up")

    def submit(
        self, processed: tuple[ParentRequest, list[Request]]
    ) -> AsyncIterator[RequestOutput]:
        parent, children = processed
        salt = children[0].cache_salt
        call = functools.partial(
            self.handle.options(stream=True).generate.remote, parent.prompt_token_ids,
            parent.params, priority=children[0].priority, cache_salt=salt,
            prefix_key=prefix_key(parent.prompt_token_ids, self._info["block_size"], salt),
        )  # fmt: skip
        return self._outputs(parent, call)

    async def _outputs(
        self, parent: ParentRequest, call: Callable[[], Any]
    ) -> AsyncIterator[RequestOutput]:
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


class _MergedMetrics:
    """`engine.metrics` for the gateway: the engines' series plus the router's counters."""

    def __init__(self) -> None:
        self.text = ""  # the engines' merged series, refreshed once a second

    def render(self) -> bytes:
        return (self.text + generate_latest(ROUTER_REGISTRY).decode()).encode()


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
    gateway = build_gateway_app(resolve_model_path(knobs.get("model")), config, build_app)
    engines = EngineReplica.options(
        num_replicas=replicas, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS, request_router_kwargs={"policy": router},
            request_routing_stats_period_s=1.0,
        ),
    ).bind(knobs, threads, max_queued_requests, request_timeout)  # fmt: skip
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(gateway.bind(engines), name="inflight", route_prefix="/")


def build_gateway_app(model_path: Path, config: Any, build_app: Callable) -> Any:
    remote = RemoteEngine(model_path)
    fastapi_app = build_app(remote, config)

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
    @serve.ingress(fastapi_app)
    class Gateway:
        def __init__(self, engines: Any) -> None:
            self.engines = engines

    return Gateway
