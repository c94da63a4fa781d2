"""The ops dashboard: one static page (no build step, no CDN) and the SSE feed it reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from cancel_bus import BusUnavailable

from .. import sse
from ..api import Node
from ..auth import CurrentPrincipal, Principal
from ..service import NodeService

PAGE = Path(__file__).with_name("index.html")
FEED_INTERVAL = 1.0

router = APIRouter(tags=["dashboard"])


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-cache"})


@router.get("/v1/dashboard/feed", response_class=StreamingResponse, responses=sse.SSE_OK)
async def feed(request: Request, node: Node, principal: CurrentPrincipal) -> StreamingResponse:
    """A snapshot of active runs (and, for ops, nodes) every second, as server-sent events."""
    return StreamingResponse(
        _snapshots(request, node, principal),
        media_type="text/event-stream",
        headers=sse.HEADERS,
    )


async def _snapshots(
    request: Request, node: NodeService, principal: Principal
) -> AsyncIterator[bytes]:
    user = None if principal.is_ops else principal.user_id
    while not node.draining and not await request.is_disconnected():
        try:
            runs = await node.list_runs("active", None, None, user, 500)
            nodes = await node.bus.list_nodes() if principal.is_ops else []
            yield sse.encode(
                "snapshot",
                {
                    "node_id": node.bus.node_id,
                    "at": node.bus.clock(),
                    "runs": [run.model_dump(mode="json", exclude={"output"}) for run in runs],
                    "nodes": [n.model_dump(mode="json") for n in nodes],
                },
            )
        except BusUnavailable as exc:
            yield sse.encode("unavailable", {"detail": str(exc)})
        await asyncio.sleep(FEED_INTERVAL)
