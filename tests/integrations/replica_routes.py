"""Control routes every replica process serves: the bus's own cancel (what ops and the node
service call on any replica) and the gates the scripted agents wait for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cancel_bus import CancelBus

from ..helpers import WAIT


def bus_routes(bus: CancelBus) -> list[Route]:
    async def cancel_session(request: Request) -> JSONResponse:
        body = await request.json()
        result = await bus.cancel_session(
            body["app"],
            body["user"],
            body["session"],
            mode=body.get("mode", "checkpoint"),
            wait=body.get("wait", True),
            timeout=body.get("timeout", WAIT),
        )
        return JSONResponse(result.model_dump(mode="json"))

    return [Route("/bus/cancel", cancel_session, methods=["POST"])]


def gate_routes(gate: Callable[[str], asyncio.Event]) -> list[Route]:
    async def open_gate(request: Request) -> JSONResponse:
        gate(request.path_params["name"]).set()
        return JSONResponse({})

    return [Route("/gates/{name:path}", open_gate, methods=["POST"])]
