"""GET /dashboard and /dashboard/events: the live page and its server-sent events.

One broadcaster task builds each update once (at most `UPDATES_PER_S` a second, and only while
a page is open) from the engine's `LiveFeed`, the doctor's report and the knobs, serializes it
once, and every open page's stream sends the same text: a hundred pages cost one update's work
plus a hundred socket writes. A page that falls behind skips to the newest update. The page
(`static/dashboard.html`) is self-contained: canvas charts drawn by hand, no CDN.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from inflight.engine.async_engine import AsyncLLM
from inflight.metrics.doctor import History

UPDATES_PER_S = 4
BELT_STEPS = 200


def page_html() -> str:
    return resources.files("inflight.server").joinpath("static/dashboard.html").read_text()


class Broadcaster:
    def __init__(self, engine: AsyncLLM, history: History) -> None:
        self.engine, self.history = engine, history
        self.version = 0
        self.payload = ""
        self._changed = asyncio.Condition()
        self._last_step_t = float("-inf")

    async def run(self) -> None:
        """Builds an update every 1/UPDATES_PER_S s while a page is open (a lifespan task)."""
        while True:
            await asyncio.sleep(1 / UPDATES_PER_S)
            if self.engine.feed.watchers:
                await self.publish(self.update())

    def update(self) -> dict[str, Any]:
        feed, now = self.engine.feed, time.monotonic()
        steps = feed.steps_after(self._last_step_t, BELT_STEPS)
        if steps:
            self._last_step_t = steps[-1].t
        return {"t": now, "steps": [s.belt_row() for s in steps], **feed.state(now),
                "hints": self.history.report()["hints"], "alive": self.engine.is_alive}  # fmt: skip

    async def publish(self, update: dict[str, Any]) -> None:
        async with self._changed:
            self.payload = f"data: {json.dumps(update, separators=(',', ':'))}\n\n"
            self.version += 1
            self._changed.notify_all()

    async def next(self, seen: int, timeout: float = 1.0) -> tuple[str | None, int]:
        """The newest update after version `seen` (None after `timeout`: send a keep-alive)."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.version > seen),
                                       timeout)  # fmt: skip
            except TimeoutError:
                return None, seen
            return self.payload, self.version

    async def stream(self, hello: dict[str, Any]) -> AsyncIterator[str]:
        """One page's events: a hello (knobs and the belt so far), then every update."""
        engine = self.engine
        engine.watch(+1)
        try:
            belt = [s.belt_row() for s in engine.feed.steps_after(float("-inf"), BELT_STEPS)]
            first = {**hello, "belt": belt, "t": time.monotonic()}
            yield f"event: hello\ndata: {json.dumps(first, separators=(',', ':'))}\n\n"
            seen = self.version
            while not engine.draining:
                payload, seen = await self.next(seen)
                yield payload if payload is not None else ": keep-alive\n\n"
        finally:
            engine.watch(-1)
