"""The ops dashboard: static files (plain HTML, CSS and JS, no build step, no CDN) and the SSE
feed they read: the runs a filter asks for, the tombstones and, for ops, the nodes, once a
second."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, HTMLResponse
from sse_starlette import ServerSentEvent

from cancel_bus import BusUnavailable

from .. import sse
from ..api import Node, check_window, errors, runs_for, tombstones_for
from ..auth import CurrentPrincipal, Principal
from ..queries import RunQuery
from ..service import NodeService

HERE = Path(__file__).parent
FEED_INTERVAL = 1.0
FAVICON_URL = "/favicon.svg"
# The page loads only its own files; its data comes from the API with the token it is given.
POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
ASSETS = {
    "/dashboard.js": ("app.js", "text/javascript"),
    "/dashboard.css": ("app.css", "text/css"),
    FAVICON_URL: ("favicon.svg", "image/svg+xml"),
}

router = APIRouter(tags=["dashboard"])


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def dashboard() -> HTMLResponse:
    """The page itself holds no data: it asks the feed, with the token the user gives it."""
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": POLICY}
    return HTMLResponse((HERE / "index.html").read_text(), headers=headers)


def _asset_route(path: str, name: str, media_type: str) -> None:
    async def asset() -> FileResponse:
        headers = {"Cache-Control": "no-cache"}
        return FileResponse(HERE / name, media_type=media_type, headers=headers)

    router.add_api_route(path, asset, include_in_schema=False, name=name)


for _path, (_name, _type) in ASSETS.items():
    _asset_route(_path, _name, _type)


@router.get(
    "/v1/dashboard/feed",
    response_class=sse.EventStream,
    status_code=200,
    responses={**errors(422), **sse.SSE_OK},
)
async def feed(
    query: Annotated[RunQuery, Query()], node: Node, principal: CurrentPrincipal
) -> sse.EventStream:
    """Once a second, a ``snapshot``: the page of runs ``query`` asks for (as ``GET /v1/runs``,
    without their output), the tombstones (as ``GET /v1/tombstones``) and, for an ops token,
    the nodes; ``unavailable`` while Redis is."""
    check_window(query)
    return sse.EventStream(_snapshots(node, principal, query), node.streams)


async def _snapshots(
    node: NodeService, principal: Principal, query: RunQuery
) -> AsyncIterator[ServerSentEvent]:
    while not node.draining:
        try:
            runs = await runs_for(node, principal, query)
            tombstones = await tombstones_for(node, principal)
            nodes = await node.list_nodes() if principal.is_ops else None
            yield sse.event(
                "snapshot",
                {
                    "node_id": node.bus.node_id,
                    "at": runs.at,
                    "viewer": {"role": principal.role, "user_id": principal.user_id},
                    "runs": [run.model_dump(mode="json", exclude={"output"}) for run in runs.runs],
                    "more": runs.more,
                    "tombstones": [t.model_dump(mode="json") for t in tombstones],
                    "nodes": None if nodes is None else [n.model_dump(mode="json") for n in nodes],
                },
            )
        except BusUnavailable as exc:
            yield sse.event("unavailable", {"detail": str(exc)})
        await asyncio.sleep(FEED_INTERVAL)
