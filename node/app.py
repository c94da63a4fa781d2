"""create_app(): the FastAPI application of one node; its lifespan opens and drains the bus."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
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
from .body_limit import BodyLimit
from .docs import add_docs
from .metrics import HttpMetrics
from .schemas import FieldError, Problem, ValidationProblem
from .service import NodeService
from .settings import ENV_PREFIX, Settings, is_loopback
from .telemetry import start_tracing

log = logging.getLogger("cancel_bus.node")

_STATUS: list[tuple[type[CancelBusError], int]] = [
    (RunNotFound, 404),
    (SessionBusy, 409),
    (RunExists, 409),
    (RunCancelled, 409),
    (BusUnavailable, 503),
    (BusClosed, 503),
    (Fenced, 503),
]
# The one answer for a run id a caller cannot use, whoever's run it is and whatever its state:
# its status, record or cancel reason may be another user's.
RUN_ID_UNAVAILABLE = "this run id cannot be used; give a new one, or none"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Raises ValueError for a configuration that must not run (auth off on an exposed host)."""
    settings = settings or Settings()
    settings.check_exposure()
    for name in settings.check_environment():
        log.warning("%s is not a setting: ignored", name)
    settings.accepted_keys()  # a bad list fails here, in one line
    tokens = TokenTable(settings.tokens())
    node = NodeService(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not tokens.enabled:
            where = f"{settings.host}:{settings.port}"
            exposed = "" if is_loopback(settings.host) else f" ({ENV_PREFIX}INSECURE_NO_AUTH)"
            log.warning(
                "AUTH IS OFF: no %sAPI_TOKENS; anyone who reaches %s%s may see and cancel "
                "every run.",
                ENV_PREFIX,
                where,
                exposed,
            )
        await node.start()
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        log.info(
            "node %s ready: dashboard at http://%s:%d/ (API docs at /docs)",
            node.bus.node_id,
            host,
            settings.port,
        )
        try:
            yield
        finally:
            await node.stop()
            await asyncio.to_thread(stop_tracing)  # the last spans flushed

    app = FastAPI(
        title="cancel-bus node",
        version=VERSION,
        description="Start, stream, cancel and inspect runs from any replica.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    add_docs(app, favicon_url=dashboard.FAVICON_URL)
    app.add_middleware(BodyLimit, max_body_size=settings.max_body_bytes)
    app.add_middleware(HttpMetrics, metrics=node.metrics)
    app.state.node = node
    app.state.tokens = tokens
    app.state.settings = settings
    app.state.metrics_need_token = tokens.enabled and settings.metrics_require_token is not False
    app.include_router(api.router)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    stop_tracing = start_tracing(app)

    @app.exception_handler(CancelBusError)
    async def bus_error(request: Request, exc: CancelBusError) -> JSONResponse:
        if isinstance(exc, InvalidArgument):  # what only the bus can judge (a time, a limit)
            return _invalid([FieldError(loc=[], msg=str(exc), type="value_error")])
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        if status == 500:
            log.error("unexpected bus error on %s: %s", request.url.path, exc)
            return JSONResponse(status_code=500, content={"detail": "internal error"})
        if isinstance(exc, RunExists | RunCancelled):
            return JSONResponse(status_code=409, content={"detail": RUN_ID_UNAVAILABLE})
        return JSONResponse(status_code=status, content={"detail": str(exc)})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """Where and what, never the input: it may not even be JSON-serialisable (NaN). A body
        that is not JSON at all is a 400; JSON that is not what the route takes, a 422."""
        malformed = next((e for e in exc.errors() if e["type"] == "json_invalid"), None)
        if malformed is not None:
            return _malformed(malformed)
        return _invalid(
            [
                FieldError(loc=list(error["loc"]), msg=error["msg"], type=error["type"])
                for error in exc.errors()
            ]
        )

    return app


def _malformed(error: Mapping[str, Any]) -> JSONResponse:
    """A 400: the body does not parse as JSON; what the parser said and where it stopped."""
    why = str(error.get("ctx", {}).get("error") or "it does not parse")
    loc = tuple(error.get("loc", ()))
    where = f" (at character {loc[1]})" if len(loc) > 1 and isinstance(loc[1], int) else ""
    problem = Problem(detail=f"the body is not valid JSON: {why}{where}")
    return JSONResponse(status_code=400, content=problem.model_dump())


def _invalid(errors: list[FieldError]) -> JSONResponse:
    """A 422: where and what, in one line and field by field."""
    detail = "; ".join(f"{'.'.join(map(str, e.loc))}: {e.msg}" if e.loc else e.msg for e in errors)
    problem = ValidationProblem(detail=detail or "invalid request", errors=errors)
    return JSONResponse(status_code=422, content=problem.model_dump(mode="json"))
