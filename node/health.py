"""Liveness, readiness and metrics: what the kubelet and Prometheus ask."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from .api import Node
from .auth import authenticate

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (no Redis check: a Redis blip must not restart every pod)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(node: Node) -> JSONResponse:
    """Ready to take traffic: not draining, lease held, subscriber connected, Redis answers."""
    problems = []
    if node.draining:
        problems.append("draining")
    for bus in node.buses:
        if not bus.ready:
            problems.append(f"namespace {bus.keys.namespace}: lease or subscriber not ready")
    try:
        async with asyncio.timeout(1.0):
            await node.bus.redis.ping()
    except Exception:
        problems.append("redis unreachable")
    body = {"ready": not problems, "node_id": node.bus.node_id, "problems": problems}
    return JSONResponse(status_code=503 if problems else 200, content=body)


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, node: Node) -> Response:
    """Prometheus text format."""
    if request.app.state.settings.metrics_require_token:
        principal = await authenticate(request)
        if not principal.is_ops:
            return JSONResponse(status_code=403, content={"detail": "this needs an ops token"})
    return Response(node.metrics.render(), media_type="text/plain; version=0.0.4")
