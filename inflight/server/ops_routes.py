"""The operator's routes: /health, /metrics, /doctor, /dashboard (and its events), /version.

`Monitoring` holds what they share with the app's lifespan: a minute of metrics snapshots for
the doctor (one a second) and the dashboard's broadcasters.
"""

# No `from __future__ import annotations`: FastAPI reads these signatures again in a Ray Serve
# gateway, from functions pickled by value whose globals hold only the names their code uses.

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from inflight import __version__
from inflight.engine.client import EngineClient, Replicas
from inflight.errors import EngineDeadError
from inflight.metrics.doctor import History
from inflight.server.auth import Guard
from inflight.server.dashboard import Dashboards, page_html
from inflight.server.errors import documented_errors
from inflight.server.middleware import error_response


class Monitoring:
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self.history = History(seconds=60)
        self.dashboards = Dashboards(engine, self.history)
        self._sampler: asyncio.Task | None = None

    def start(self) -> None:
        """Lifespan start: the doctor's sampling and the dashboard's broadcaster."""
        self._sampler = asyncio.create_task(self._sample_metrics())
        self.dashboards.start()

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
        self.dashboards.stop()

    async def _sample_metrics(self) -> None:
        while True:
            self.history.take(time.monotonic(), self.engine.metrics.render().decode())
            await asyncio.sleep(1)


def ops_router(
    engine: EngineClient, model_name: str, monitoring: Monitoring, guard: Guard,
    dashboard_guard: Guard,
) -> APIRouter:  # fmt: skip
    router = APIRouter()

    @router.get("/health", response_class=Response,
                responses={200: {"description": "The engine is stepping (empty body; behind a "
                                 "gateway, the number of engines up)"},
                           **documented_errors()})  # fmt: skip
    async def health() -> Response:
        if not engine.is_alive:
            error = engine.dead_error or EngineDeadError("the engine is not running")
            return error_response(503, f"engine is dead: {error}", "engine_unavailable")
        if isinstance(engine, Replicas):
            return JSONResponse({"replicas_up": engine.replicas_up()})
        return Response(status_code=200)

    @router.get("/metrics", response_class=Response, responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
              "description": "Prometheus text format"}, **documented_errors()})  # fmt: skip
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @router.get("/doctor", dependencies=[Depends(guard)], responses=documented_errors(401))
    async def doctor() -> dict[str, Any]:
        """Hints from the last 60 s of metrics: each names a flag and carries its evidence."""
        return monitoring.history.report()

    @router.get("/dashboard", dependencies=[Depends(dashboard_guard)], include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(page_html())

    # an endless stream: not for schema-driven clients
    @router.get("/dashboard/events", dependencies=[Depends(dashboard_guard)],
                include_in_schema=False)  # fmt: skip
    async def dashboard_events(replica: str | None = None) -> StreamingResponse:
        """`replica` picks one engine behind a gateway (`--replicas`); the first by default."""
        hello = {"model": model_name, "knobs": {k: str(v) for k, v in engine.knobs().items()},
                 "num_blocks": engine.num_kv_blocks}  # fmt: skip
        return StreamingResponse(monitoring.dashboards.stream(hello, replica),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip

    @router.get("/version", responses=documented_errors())
    async def version() -> dict[str, str]:
        return {"version": __version__}

    return router
