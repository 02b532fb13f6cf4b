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
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from inflight.engine.async_engine import AsyncLLM
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
    def __init__(self, engine: AsyncLLM, history: History) -> None:
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
        # a replica's feed runs on that replica's clock
        feed, now = self.engine.feed, getattr(self.engine, "clock", time.monotonic)()
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
            now = getattr(engine, "clock", time.monotonic)()
            first = {**hello, "belt": belt, "t": now}
            yield f"event: hello\ndata: {json.dumps(first, separators=(',', ':'))}\n\n"
            seen = self.version
            while not engine.draining:
                payload, seen = await self.next(seen)
                yield payload if payload is not None else ": keep-alive\n\n"
        finally:
            engine.watch(-1)
