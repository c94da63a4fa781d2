"""The ops dashboard: static files (plain HTML, CSS and JS modules, no build step, no CDN) and
the SSE feed they read: the runs a filter asks for, the tombstones and, for ops, the nodes, once
a second; when the node drains, a last snapshot (the node ``draining``) and ``node.draining``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, HTMLResponse
from sse_starlette import ServerSentEvent

from cancel_bus import BusUnavailable, CancelBusError

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
# The page's own modules (plain ES modules: the browser loads those /dashboard.js imports, and
# theme.js, a classic script the page runs first), served under /dashboard/.
MODULES = tuple(sorted(path.name for path in HERE.glob("*.js") if path.name != "app.js"))
ASSETS = {
    "/dashboard.js": ("app.js", "text/javascript"),
    "/dashboard.css": ("app.css", "text/css"),
    FAVICON_URL: ("favicon.svg", "image/svg+xml"),
    **{f"/dashboard/{name}": (name, "text/javascript") for name in MODULES},
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
    without their output), the tombstones (as ``GET /v1/tombstones``), for an ops token the
    nodes, and whether this node drains; ``unavailable`` while Redis is. When the node drains
    (or is draining), a last snapshot (``draining``: true; in its nodes, this one
    ``draining``), then ``node.draining`` (``node_id``, ``until``: when the runs it still holds
    are cancelled, on the Redis clock) and the feed ends: follow another node."""
    check_window(query)
    return sse.EventStream(_snapshots(node, principal, query), node.streams)


async def _snapshots(
    node: NodeService, principal: Principal, query: RunQuery
) -> AsyncIterator[ServerSentEvent]:
    while not node.draining:
        try:
            yield await _snapshot(node, principal, query)
        except BusUnavailable as exc:
            yield sse.event("unavailable", {"detail": str(exc)})
        with contextlib.suppress(TimeoutError):  # a drain ends the wait
            await asyncio.wait_for(node.drain_started.wait(), FEED_INTERVAL)
    with contextlib.suppress(CancelBusError):  # the node may have left its namespaces already
        yield await _snapshot(node, principal, query)
    yield sse.event(
        "node.draining",
        {
            "node_id": node.bus.node_id,
            "until": node.drain_deadline,
            "detail": "this node is draining: it takes no new runs and stops serving this "
            "feed; follow another node",
        },
    )


async def _snapshot(node: NodeService, principal: Principal, query: RunQuery) -> ServerSentEvent:
    """One ``snapshot`` of what ``principal`` may see, for ``query``."""
    runs = await runs_for(node, principal, query)
    tombstones = await tombstones_for(node, principal)
    nodes = await node.list_nodes() if principal.is_ops else None
    return sse.event(
        "snapshot",
        {
            "node_id": node.bus.node_id,
            "at": runs.at,
            "viewer": {"role": principal.role, "user_id": principal.user_id},
            "runs": [run.model_dump(mode="json", exclude={"output"}) for run in runs.runs],
            "more": runs.more,
            "tombstones": [t.model_dump(mode="json") for t in tombstones],
            "nodes": None if nodes is None else [n.model_dump(mode="json") for n in nodes],
            "draining": node.draining,
            "drain_until": node.drain_deadline,
        },
    )
