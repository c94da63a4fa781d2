"""create_app(): the FastAPI application of one node; its lifespan opens and drains the bus."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from cancel_bus import (
    BusClosed,
    BusUnavailable,
    CancelBusError,
    Fenced,
    InvalidArgument,
    RunCancelled,
    RunExists,
    RunNotFound,
    SessionBusy,
)
from cancel_bus import __version__ as VERSION

from . import api, dashboard, health
from .auth import TokenTable
from .service import NodeService
from .settings import Settings

log = logging.getLogger("cancel_bus.node")

_STATUS: list[tuple[type[CancelBusError], int]] = [
    (InvalidArgument, 422),
    (RunNotFound, 404),
    (SessionBusy, 409),
    (RunExists, 409),
    (RunCancelled, 409),
    (BusUnavailable, 503),
    (BusClosed, 503),
    (Fenced, 503),
]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    tokens = TokenTable(settings.tokens())
    node = NodeService(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not tokens.enabled:
            log.warning(
                "AUTH IS OFF: no CANCEL_BUS_API_TOKENS; anyone who reaches this node may see "
                "and cancel every run. It listens on 127.0.0.1 only."
            )
        await node.start()
        log.info("node %s ready; dashboard at /", node.bus.node_id)
        try:
            yield
        finally:
            await node.stop()

    app = FastAPI(
        title="cancel-bus node",
        version=VERSION,
        description="Start, stream, cancel and inspect runs from any replica.",
        lifespan=lifespan,
        max_body_size=settings.max_body_bytes,
    )
    app.state.node = node
    app.state.tokens = tokens
    app.state.settings = settings
    app.include_router(api.router)
    app.include_router(health.router)
    app.include_router(dashboard.router)

    @app.exception_handler(CancelBusError)
    async def bus_error(request: Request, exc: CancelBusError) -> JSONResponse:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        if status == 500:
            log.error("unexpected bus error on %s: %s", request.url.path, exc)
            return JSONResponse(status_code=500, content={"detail": "internal error"})
        return JSONResponse(status_code=status, content={"detail": str(exc)})

    return app
