"""A trpc-agent replica process (see replica.py): trpc-agent installed on its bus, Runners of the
scripted agent and of the boss (app ``boss``: a sub-agent, and a remote A2A agent called through
``cancel_bus.integrations.a2a.send_message``), trpc-agent's A2A service (a2a-sdk 0.3) of each,
under ``/a2a/`` and ``/x/``, its AG-UI service at ``/agui`` (where ``ag-ui-protocol`` is
installed), and control routes the tests drive it with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from a2a.server.apps import A2AStarletteApplication
from a2a.types import Artifact, TaskArtifactUpdateEvent, TextPart
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from trpc_agent_sdk.configs import RunConfig
from trpc_agent_sdk.events import AgentCancelledEvent, Event
from trpc_agent_sdk.runners import Runner
from trpc_agent_sdk.server.a2a import TrpcA2aAgentService
from trpc_agent_sdk.tools import FunctionTool
from trpc_agent_sdk.types import Content, Part

from cancel_bus import CancelBus
from cancel_bus.integrations import a2a, trpc_agent
from cancel_bus.integrations.a2a import BusRequestHandler, BusTaskStore

from ..helpers import WAIT
from .a2a_reads import read_routes
from .a2a_support import CANCEL_TIMEOUT, CountingBusTaskStore, card, client, message
from .replica_routes import bus_routes, gate_routes, multitask_routes
from .trpc_support import APP, BOSS, GatedSessionService, StreamingAgent, boss


@dataclass
class TrpcRun:
    """A ``Runner.run_async`` consumed in the background, as an application's handler does."""

    events: list[Event] = field(default_factory=list)
    streaming: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    error: str | None = None

    async def consume(self, runner: Runner, user_id: str, session_id: str, command: str) -> None:
        message = Content(role="user", parts=[Part.from_text(text=command)])
        events = runner.run_async(
            user_id=user_id,
            session_id=session_id,
            new_message=message,
            run_config=RunConfig(streaming=True),
        )
        self.task = asyncio.current_task()
        try:
            async for event in events:
                self.events.append(event)
                self.streaming.set()
        except BaseException as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Exception):
                raise

    def summary(self, saved: str) -> dict[str, Any]:
        whole = [e for e in self.events if not e.partial and not isinstance(e, AgentCancelledEvent)]
        return {
            "partial": "".join(_text(e) for e in self.events if e.partial),
            "complete": [_text(e) for e in whole],
            "cancelled": bool(self.events) and isinstance(self.events[-1], AgentCancelledEvent),
            "error": self.error,
            "saved": saved,
        }


def _text(event: Event) -> str:
    parts = event.content.parts if event.content is not None else None
    return "".join(part.text or "" for part in parts or [])


class TrpcControl:
    """The routes that start trpc-agent runs and call trpc-agent's cancel API on this replica;
    a request's ``app`` (default ``chat``) chooses the Runner."""

    def __init__(self, *runners: Runner) -> None:
        self.runners = {runner.app_name: runner for runner in runners}
        self.runs: dict[tuple[str, str], TrpcRun] = {}

    def routes(self) -> list[Route]:
        return [
            Route("/trpc/runs", self.start, methods=["POST"]),
            Route("/trpc/runs/{user}/{session}/streaming", self.streaming, methods=["POST"]),
            Route("/trpc/runs/{user}/{session}/result", self.result, methods=["POST"]),
            Route("/trpc/cancel", self.cancel, methods=["POST"]),
            Route("/trpc/sessions/{user}/{session}", self.saved, methods=["GET"]),
        ]

    async def start(self, request: Request) -> JSONResponse:
        """Start a run; answers once ``run_async`` has been called (the run may not have
        registered yet)."""
        body = await request.json()
        run = TrpcRun()
        self.runs[body["user"], body["session"]] = run
        started = asyncio.get_running_loop().create_future()

        runner = self.runners[body.get("app", APP)]

        async def consume() -> None:
            started.set_result(None)
            await run.consume(runner, body["user"], body["session"], body["command"])

        asyncio.create_task(consume())  # noqa: RUF006 (kept in self.runs)
        await started
        return JSONResponse({})

    async def streaming(self, request: Request) -> JSONResponse:
        run = self.runs[request.path_params["user"], request.path_params["session"]]
        await asyncio.wait_for(run.streaming.wait(), WAIT)
        return JSONResponse({})

    async def result(self, request: Request) -> JSONResponse:
        user, session = request.path_params["user"], request.path_params["session"]
        run = self.runs[user, session]
        assert run.task is not None
        await asyncio.wait_for(asyncio.shield(run.task), WAIT)
        return JSONResponse(run.summary(await self._saved(user, session)))

    async def saved(self, request: Request) -> JSONResponse:
        """The last text the session holds (a run of any service: A2A, AG-UI)."""
        user, session = request.path_params["user"], request.path_params["session"]
        return JSONResponse({"saved": await self._saved(user, session)})

    async def _saved(self, user: str, session: str) -> str:
        stored = await self.runners[APP].session_service.get_session(
            app_name=APP, user_id=user, session_id=session
        )
        return _text(stored.events[-1]) if stored is not None and stored.events else ""

    async def cancel(self, request: Request) -> JSONResponse:
        """trpc-agent's own cancel API, on this replica."""
        body = await request.json()
        answer = await self.runners[body.get("app", APP)].cancel_run_async(
            body["user"], body["session"], timeout=body.get("timeout", WAIT)
        )
        return JSONResponse({"answer": answer})


def asking(bus: CancelBus) -> FunctionTool:
    """The boss's tool ``ask_remote``: asks the A2A agent at the URL it is given to ``stream``,
    as a call under the run of the boss (the run whose code calls it); its text is the answer."""

    async def ask_remote(request: str) -> str:
        """Ask the remote A2A agent at the URL ``request``."""
        text: list[str] = []
        async with (
            httpx.AsyncClient(timeout=WAIT) as http,
            a2a.send_message(bus, client(http, request), message("stream")) as events,
        ):
            async for _, update in events:
                if isinstance(update, TaskArtifactUpdateEvent):
                    text.append(_artifact_text(update.artifact))
        return "".join(text)

    return FunctionTool(ask_remote)


def _artifact_text(artifact: Artifact) -> str:
    return "".join(part.root.text for part in artifact.parts if isinstance(part.root, TextPart))


def a2a_app(
    bus: CancelBus,
    agent: Any,
    session_service: Any,
    url: str,
    service_name: str = APP,
    store: BusTaskStore | None = None,
) -> Starlette:
    service = TrpcA2aAgentService(
        service_name=service_name, agent=agent, session_service=session_service
    )
    store = store or BusTaskStore(bus)
    handler = BusRequestHandler(
        bus, agent_executor=service, task_store=store, cancel_timeout=CANCEL_TIMEOUT
    )
    return A2AStarletteApplication(agent_card=card(url), http_handler=handler).build()


def add_agui(app: FastAPI, agent: StreamingAgent, session_service: Any) -> None:
    """trpc-agent's AG-UI service at ``/agui``, if ``ag-ui-protocol`` is installed."""
    try:
        from trpc_agent_sdk.server.ag_ui import AgUiAgent, AgUiService
    except ImportError:
        return
    agui = AgUiAgent(agent, app_name=APP, session_service=session_service, cancel_wait_timeout=WAIT)
    AgUiService("agui", app=app).add_agent("/agui", agui)


async def _reinstall_trpc(bus: CancelBus, setting: dict[str, str]) -> None:
    """Once the runs of an earlier test have ended (uninstall refuses while one is going)."""
    async with asyncio.timeout(WAIT):
        while True:
            try:
                trpc_agent.uninstall()
                break
            except RuntimeError:
                await asyncio.sleep(0.05)
    trpc_agent.install(bus, **setting)  # type: ignore[arg-type]


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[FastAPI]:
    trpc_agent.install(bus)
    agent = StreamingAgent(name="streamer")
    sessions = GatedSessionService(agent)
    runner = Runner(app_name=APP, agent=agent, session_service=sessions)
    boss_agent = boss(asking(bus))
    boss_runner = Runner(app_name=BOSS, agent=boss_agent, session_service=sessions)
    app = FastAPI()
    store = CountingBusTaskStore(bus)  # the A2A service's: its reads counted (a2a_reads.py)
    app.router.routes.extend(
        [
            *TrpcControl(runner, boss_runner).routes(),
            *bus_routes(bus),
            *gate_routes(agent.gate),
            *read_routes(store.reads),
            *multitask_routes(lambda **setting: _reinstall_trpc(bus, setting)),
        ]
    )
    app.mount("/a2a", a2a_app(bus, agent, sessions, f"{url}/a2a/", store=store))
    app.mount("/x", a2a_app(bus, boss_agent, sessions, f"{url}/x/", service_name=BOSS))
    add_agui(app, agent, sessions)
    yield app
    await runner.close()
    await boss_runner.close()
