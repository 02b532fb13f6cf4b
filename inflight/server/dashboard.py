"""GET /dashboard and /dashboard/events: the live page and its server-sent events.

One broadcaster task builds each update once (at most `UPDATES_PER_S` a second, and only while
a page is open) from the engine's `LiveFeed`, the doctor's report and the knobs, serializes it
once, and every open page's stream sends the same text: a hundred pages cost one update's work
plus a hundred socket writes. A page that falls behind skips to the newest update. The page
(`static/dashboard.html`) is self-contained: canvas charts drawn by hand, no CDN.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from inflight.engine.client import EngineClient, FeedSource, Replicas
from inflight.metrics.doctor import History

UPDATES_PER_S = 4
# With many pages open the rate drops (to 1 a second at 100 pages): each update is a write per
# page on the event loop, which shares the GIL with the engine's step.
PAGES_AT_FULL_RATE = 25
BELT_STEPS = 200


def run_lengths(states: str) -> list[list]:
    """The block map as [[state, count], ...]: a pool is mostly long runs of one state."""
    return [[state, sum(1 for _ in run)] for state, run in itertools.groupby(states)]


def page_html() -> str:
    return resources.files("inflight.server").joinpath("static/dashboard.html").read_text()


class Broadcaster:
    """One engine's updates, built once for every page that watches it."""

    def __init__(self, engine: FeedSource, history: History) -> None:
        self.engine, self.history = engine, history
        self.version = 0
        self.payload = ""
        self._published = asyncio.Event()  # replaced by a fresh one at every update
        self._last_step_t = float("-inf")

    async def run(self) -> None:
        """Builds an update every 1/UPDATES_PER_S s while a page is open (a lifespan task)."""
        while True:
            pages = self.engine.feed.watchers
            await asyncio.sleep(max(1, pages / PAGES_AT_FULL_RATE) / UPDATES_PER_S)
            if pages:
                await self.publish(self.update())

    def update(self) -> dict[str, Any]:
        feed, now = self.engine.feed, self.engine.clock()  # a replica's: that replica's clock
        steps = feed.steps_after(self._last_step_t, BELT_STEPS)
        if steps:
            self._last_step_t = steps[-1].t
        state = feed.state(now)
        state["kv"]["blocks"] = run_lengths(state["kv"]["blocks"])
        return {"t": now, "steps": [s.belt_row() for s in steps], **state,
                "hints": self.history.report()["hints"], "alive": self.engine.is_alive}  # fmt: skip

    async def publish(self, update: dict[str, Any]) -> None:
        self.payload = f"data: {json.dumps(update, separators=(',', ':'))}\n\n"
        self.version += 1
        published, self._published = self._published, asyncio.Event()
        published.set()

    async def next(self, seen: int, timeout: float = 1.0) -> tuple[str | None, int]:
        """The newest update after version `seen` (None after `timeout`: send a keep-alive).
        (An event per update rather than a Condition: a page that leaves cancels this wait,
        and nothing is left to release.)"""
        if self.version <= seen:
            try:
                await asyncio.wait_for(self._published.wait(), timeout)
            except TimeoutError:
                return None, seen
        return self.payload, self.version

    async def stream(self, hello: dict[str, Any]) -> AsyncIterator[str]:
        """One page's events: a hello (knobs and the belt so far), then every update."""
        engine = self.engine
        engine.watch(+1)
        try:
            belt = [s.belt_row() for s in engine.feed.steps_after(float("-inf"), BELT_STEPS)]
            now = engine.clock()
            first = {**hello, "belt": belt, "t": now}
            yield f"event: hello\ndata: {json.dumps(first, separators=(',', ':'))}\n\n"
            seen = self.version
            while not engine.draining:
                payload, seen = await self.next(seen)
                yield payload if payload is not None else ": keep-alive\n\n"
        finally:
            engine.watch(-1)


class Dashboards:
    """The dashboard's broadcasters: the engine's, or behind a gateway one per replica, each
    started the first time a page asks for its replica."""

    def __init__(self, engine: EngineClient, history: History) -> None:
        self.engine, self.history = engine, history
        self.main = Broadcaster(engine, history)
        self._replicas: dict[str, Broadcaster] = {}
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self.main.run()))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def stream(self, hello: dict[str, Any], replica: str | None) -> AsyncIterator[str]:
        """A page's events; `replica` picks an engine behind a gateway (the first by default)."""
        engine = self.engine
        if not isinstance(engine, Replicas):
            return self.main.stream(hello)
        views = engine.replica_views()
        names = sorted(views)
        chosen = replica if replica in names else (names[0] if names else "")
        if chosen not in self._replicas:
            self._replicas[chosen] = Broadcaster(views.get(chosen) or engine, self.history)
            self._tasks.append(asyncio.create_task(self._replicas[chosen].run()))
        return self._replicas[chosen].stream({**hello, "replicas": names, "replica": chosen})
