"""Liveness, readiness and metrics: what the kubelet and Prometheus ask."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from cancel_bus import BusMisconfigured, CancelBusError

from .api import Node, errors
from .auth import Credentials, authenticate
from .schemas import Health, Readiness

router = APIRouter(tags=["ops"])

PROMETHEUS_TEXT = "text/plain; version=0.0.4"


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: {"model": Health, "description": "the node's embedded server is down"}},
)
async def healthz(node: Node) -> JSONResponse:
    """The process is alive (no Redis check: a Redis blip must not restart every pod), and its
    embedded server, if it runs one, too (it is started again when it exits)."""
    problem = node.embedded.problem
    body = Health(status="ok" if problem is None else "failing", problem=problem)
    status = 200 if problem is None else 503
    return JSONResponse(status_code=status, content=body.model_dump(exclude_none=True))


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "not ready"}},
)
async def readyz(node: Node) -> JSONResponse:
    """Ready to take traffic: not draining, and in each namespace the bus running, its lease
    renewed, its subscriber connected and its own channel answering its probes (the bus's
    ``problems``, each named in the body); Redis answers."""
    problems: list[str] = []
    warnings: list[str] = []
    if node.draining:
        problems.append("draining")
    for bus in node.buses:
        namespace = f"namespace {bus.namespace}"
        problems.extend(f"{namespace}: {problem}" for problem in bus.problems)
        warnings.extend(f"{namespace}: {warning}" for warning in bus.warnings)
    try:
        await node.bus.ping(timeout=1.0)
    except BusMisconfigured:  # no detail: /readyz answers anyone
        problems.append("redis refused access (its user or password)")
    except CancelBusError:
        problems.append("redis unreachable")
    body = Readiness(
        ready=not problems, node_id=node.bus.node_id, problems=problems, warnings=warnings
    )
    return JSONResponse(status_code=503 if problems else 200, content=body.model_dump())


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **errors(403),
    },
    openapi_extra={"security": [{}]},  # with the bearer scheme: optional (see below)
)
async def metrics(request: Request, node: Node, credentials: Credentials) -> Response:
    """Prometheus text format. Needs an ops token when tokens are configured, unless
    ``CANCEL_BUS_METRICS_REQUIRE_TOKEN=false``."""
    if request.app.state.metrics_need_token:
        principal = await authenticate(request, credentials)
        if not principal.is_ops:
            return JSONResponse(status_code=403, content={"detail": "this needs an ops token"})
    return Response(node.metrics.render(), media_type=PROMETHEUS_TEXT)
