"""A google-adk replica process (see replica.py): the frameworks replica (ADK's own FastAPI app,
the cancel routes ``add_cancel_routes`` adds, the gates), plus invocations the tests start in two
steps, to hold one between ``Runner.run_async`` and its first read (where it registers):

* ``POST /adk/invocations`` ``{"session"}``: ``run_async`` of the app ``story`` is called now;
  the stream is read once the gate ``read:<session>`` opens;
* ``POST /adk/invocations/{session}/streaming``: once it yielded its first event;
* ``POST /adk/invocations/{session}/result``: its events, once it ended, and what the model did.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.events import Event
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cancel_bus import CancelBus

from ..helpers import WAIT
from . import frameworks_replica
from .adk_support import story_agent
from .story_support import GATES, USER, story

APP = "story"


def _shown(event: Event) -> dict[str, Any]:
    parts = event.content.parts if event.content is not None else None
    return {
        "author": event.author,
        "text": "".join(part.text or "" for part in parts or []),
        "partial": bool(event.partial),
        "error": event.error_code,
    }


def _streamed(session: str) -> asyncio.Event:
    return GATES(f"streamed:{session}")  # set by the replica, not a gate the tests open


async def _read(session: str, stream: AsyncGenerator[Event, None]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    outcome: dict[str, Any] = {"events": events, "error": None}
    try:
        await asyncio.wait_for(GATES(f"read:{session}").wait(), WAIT)
        async for event in stream:
            events.append(_shown(event))
            _streamed(session).set()
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await stream.aclose()
    return outcome


def invocation_routes() -> list[Route]:
    runner = Runner(
        app_name=APP,
        agent=story_agent(),
        session_service=InMemorySessionService(),  # type: ignore[no-untyped-call]
        auto_create_session=True,
    )
    tasks: dict[str, asyncio.Task[dict[str, Any]]] = {}

    async def invoke(request: Request) -> JSONResponse:
        session = (await request.json())["session"]
        stream = runner.run_async(
            user_id=USER,
            session_id=session,
            new_message=types.Content(role="user", parts=[types.Part(text=session)]),
            run_config=RunConfig(streaming_mode=StreamingMode.SSE),
        )
        tasks[session] = asyncio.create_task(_read(session, stream))
        return JSONResponse({})

    async def result(request: Request) -> JSONResponse:
        session = request.path_params["session"]
        outcome = await asyncio.wait_for(asyncio.shield(tasks[session]), WAIT)
        played = story(session)
        return JSONResponse({**outcome, "model_calls": played.model_calls})

    async def streaming(request: Request) -> JSONResponse:
        await asyncio.wait_for(_streamed(request.path_params["session"]).wait(), WAIT)
        return JSONResponse({})

    return [
        Route("/adk/invocations", invoke, methods=["POST"]),
        Route("/adk/invocations/{session}/streaming", streaming, methods=["POST"]),
        Route("/adk/invocations/{session}/result", result, methods=["POST"]),
    ]


def skew_routes(bus: CancelBus) -> list[Route]:
    """``POST /adk/clock-skew`` ``{"seconds"}``: this node's ``bus.clock()`` (its estimate of
    the Redis clock, what the adapters read) is off by that much from now on, as a node's is
    when its loop stalled while a heartbeat's answer came in (0 restores it)."""
    estimate = bus.clock
    skew = [0.0]

    def skewed() -> float:
        return estimate() + skew[0]

    bus.clock = skewed  # type: ignore[method-assign]

    async def set_skew(request: Request) -> JSONResponse:
        skew[0] = float((await request.json())["seconds"])
        return JSONResponse({})

    return [Route("/adk/clock-skew", set_skew, methods=["POST"])]


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[FastAPI]:
    async with frameworks_replica.serve(bus, url) as app:
        app.router.routes.extend([*invocation_routes(), *skew_routes(bus)])
        yield app
