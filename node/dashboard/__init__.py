"""The ops dashboard: one static page (no build step, no CDN) and the SSE feed it reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from sse_starlette import ServerSentEvent

from cancel_bus import BusUnavailable

from .. import sse
from ..api import Node, errors
from ..auth import CurrentPrincipal, Principal
from ..service import NodeService

PAGE = Path(__file__).with_name("index.html")
FEED_INTERVAL = 1.0

router = APIRouter(tags=["dashboard"])


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    """The page itself holds no data: it asks the feed, with the token the user gives it."""
    return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-cache"})


@router.get(
    "/v1/dashboard/feed",
    response_class=sse.EventStream,
    status_code=200,
    responses={**errors(), **sse.SSE_OK},
)
async def feed(node: Node, principal: CurrentPrincipal) -> sse.EventStream:
    """A snapshot of active runs (and, for ops, nodes) every second, as server-sent events."""
    return sse.EventStream(_snapshots(node, principal), node.metrics.open_streams)


async def _snapshots(node: NodeService, principal: Principal) -> AsyncIterator[ServerSentEvent]:
    user = None if principal.is_ops else principal.user_id
    while not node.draining:
        try:
            runs = await node.list_runs("active", None, None, user, 500)
            nodes = await node.bus.list_nodes() if principal.is_ops else []
            yield sse.event(
                "snapshot",
                {
                    "node_id": node.bus.node_id,
                    "at": node.bus.clock(),
                    "runs": [run.model_dump(mode="json", exclude={"output"}) for run in runs],
                    "nodes": [n.model_dump(mode="json") for n in nodes],
                },
            )
        except BusUnavailable as exc:
            yield sse.event("unavailable", {"detail": str(exc)})
        await asyncio.sleep(FEED_INTERVAL)
