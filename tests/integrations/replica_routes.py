"""Control routes every replica process serves: the bus's own cancel (what ops and the node
service call on any replica), the gates the scripted agents wait for, and the runs the tests
start in the background."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

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

    async def cancel_run(request: Request) -> JSONResponse:
        body = await request.json()
        result = await bus.cancel(
            body["run_id"],
            mode=body.get("mode", "checkpoint"),
            wait=body.get("wait", True),
            timeout=body.get("timeout", WAIT),
        )
        return JSONResponse(result.model_dump(mode="json"))

    return [
        Route("/bus/cancel", cancel_session, methods=["POST"]),
        Route("/bus/cancel-run", cancel_run, methods=["POST"]),
    ]


def multitask_routes(reinstall: Callable[..., Awaitable[None]]) -> list[Route]:
    """``POST /multitask`` with an ``install``'s ``multitask_strategy`` and ``interrupt_mode``:
    the adapter installed again with them (between tests), so that one pair of replicas serves
    every strategy."""

    async def multitask(request: Request) -> JSONResponse:
        await reinstall(**await request.json())
        return JSONResponse({})

    return [Route("/multitask", multitask, methods=["POST"])]


def gate_routes(gate: Callable[[str], asyncio.Event]) -> list[Route]:
    async def open_gate(request: Request) -> JSONResponse:
        gate(request.path_params["name"]).set()
        return JSONResponse({})

    return [Route("/gates/{name:path}", open_gate, methods=["POST"])]


class Gates:
    """Named events, opened by the tests (one set of names per session)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def __call__(self, name: str) -> asyncio.Event:
        return self._events.setdefault(name, asyncio.Event())


class Runs:
    """Background runs by session: started once the framework was called (inside the bus run),
    streaming once the user's code has its first text, their result once they end."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self.texts: dict[str, asyncio.Event] = {}

    def got_text(self, session: str) -> None:
        self.texts.setdefault(session, asyncio.Event()).set()

    async def streaming(self, session: str) -> None:
        await asyncio.wait_for(self.texts.setdefault(session, asyncio.Event()).wait(), WAIT)

    async def start(
        self, session: str, body: Callable[[asyncio.Future[str]], Awaitable[dict[str, Any]]]
    ) -> JSONResponse:
        """Start ``body``; answers its bus run's id once it has called the framework."""
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.tasks[session] = asyncio.create_task(_outcome(body(started)))
        return JSONResponse({"run_id": await asyncio.wait_for(started, WAIT)})

    async def result(self, session: str) -> dict[str, Any]:
        return await asyncio.wait_for(asyncio.shield(self.tasks[session]), WAIT)

    def routes(self) -> list[Route]:
        """``/runs/{session}/result`` and ``/runs/{session}/streaming``."""

        async def result(request: Request) -> JSONResponse:
            return JSONResponse(await self.result(request.path_params["session"]))

        async def streaming(request: Request) -> JSONResponse:
            await self.streaming(request.path_params["session"])
            return JSONResponse({})

        return [
            Route("/runs/{session}/result", result, methods=["POST"]),
            Route("/runs/{session}/streaming", streaming, methods=["POST"]),
        ]


async def _outcome(body: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        return await body
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
