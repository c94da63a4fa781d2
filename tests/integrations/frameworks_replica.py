"""An agno, google-adk and pydantic-ai replica process (see replica.py): ADK's own FastAPI app
(``get_fast_api_app``, its ``/run_sse``, the cancel routes ``add_cancel_routes`` adds), agno's
AgentOS under ``/os``, the user's code of each integration as its docs show it started over
control routes, and gates the tests open. Every model plays the story (story_support.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from agno.agent import Agent as AgnoAgent
from agno.db.in_memory import InMemoryDb
from agno.os import AgentOS
from agno.run.agent import RunContentEvent, RunOutput
from agno.run.team import TeamRunOutput
from agno.team import Team
from fastapi import FastAPI
from google.adk.cli.fast_api import get_fast_api_app
from pydantic_ai import Agent
from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cancel_bus import CancelBus, RunCancelled
from cancel_bus.integrations import agno, google_adk, pydantic_ai

from . import agno_support, pydantic_ai_support
from .adk_support import AGENTS_DIR
from .replica_routes import Runs, bus_routes, gate_routes, multitask_routes
from .story_support import APP, GATES, USER, story


def agno_routes(runs: Runs, db: InMemoryDb) -> list[Route]:
    """``/agno/runs``: an agent's run (``kind`` ``async``, or ``sync``: ``agent.run`` in a
    thread) or a team's (``team``), streamed with its events; ``/agno/cancel``: agno's own
    cancel call on this replica."""

    def start(session: str, kind: str, run_id: str | None) -> Callable[[asyncio.Future[str]], Any]:
        played = story(session)
        runner: AgnoAgent | Team = (
            agno_support.story_team(played, db)
            if kind == "team"
            else agno_support.story_agent(played, db)
        )
        options: dict[str, Any] = {
            "stream": True,
            "stream_events": True,
            "session_id": session,
            "user_id": USER,
            "yield_run_output": True,
            "run_id": run_id,
        }

        async def body(started: asyncio.Future[str]) -> dict[str, Any]:
            outcome: dict[str, Any] = {"text": "", "run": None, "after_loop": False}
            loop = asyncio.get_running_loop()

            def seen(event: Any) -> None:
                if isinstance(event, RunOutput | TeamRunOutput):
                    outcome["run"] = event
                    return
                if not started.done():  # the run has registered: its first event
                    started.set_result(event.run_id)
                if isinstance(event, RunContentEvent) and isinstance(event.content, str):
                    outcome["text"] += event.content  # a team's: its member's text
                    runs.got_text(session)

            try:
                if kind == "sync":
                    assert isinstance(runner, AgnoAgent)

                    def consume() -> None:
                        for event in runner.run("?", **options):
                            loop.call_soon_threadsafe(seen, event)

                    await asyncio.to_thread(consume)
                    await asyncio.sleep(0)  # the last events' callbacks
                else:
                    async for event in runner.arun("?", **options):
                        seen(event)
                outcome["after_loop"] = True
            except Exception as exc:  # an immediate cancel: the bus's RunCancelled
                outcome["error"] = f"{type(exc).__name__}: {exc}"
            return _agno_outcome(outcome, played.tool_ran, played.model_calls)

        return body

    async def run(request: Request) -> JSONResponse:
        body = await request.json()
        session = body["session"]
        body_of = start(session, body.get("kind", "async"), body.get("run_id"))
        return await runs.start(session, body_of)

    async def cancel(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("kind") == "team":
            answer = await Team.acancel_run(body["run_id"])
        elif body.get("kind") == "sync":
            answer = await asyncio.to_thread(AgnoAgent.cancel_run, body["run_id"])
        else:
            answer = await AgnoAgent.acancel_run(body["run_id"])
        return JSONResponse({"answer": answer})

    async def stored(request: Request) -> JSONResponse:
        """The run as agno stored it in its session."""
        found = db.get_session(session_id=request.path_params["session"])
        runs_stored = getattr(found, "runs", None) or []
        return JSONResponse(
            {"runs": [[r.run_id, r.status.value, r.content] for r in runs_stored if r.content]}
        )

    return [
        Route("/agno/runs", run, methods=["POST"]),
        Route("/agno/cancel", cancel, methods=["POST"]),
        Route("/agno/sessions/{session}", stored, methods=["GET"]),
    ]


def _agno_outcome(outcome: dict[str, Any], tool: bool, model_calls: int) -> dict[str, Any]:
    run = outcome.pop("run")
    members = getattr(run, "member_responses", None) or []
    return {
        **outcome,
        "status": run.status.value if run is not None else None,
        "content": run.content if run is not None else None,
        "members": [[m.status.value, m.content] for m in members],
        "tool": tool,
        "model_calls": model_calls,
    }


def pydantic_ai_routes(bus: CancelBus, runs: Runs) -> list[Route]:
    """``/pydantic-ai/runs``: the story under a bus run of the session, through the helper
    ``api`` names (``run_stream_events``, ``iter``, ``run_stream``)."""

    async def body(session: str, api: str, started: asyncio.Future[str]) -> dict[str, Any]:
        agent = pydantic_ai_support.story_agent(session)
        outcome: dict[str, Any] = {"text": "", "after_loop": False, "messages": None}
        keep: list[Any] = []  # the object whose all_messages() holds the run's messages

        def got(text: str) -> None:
            if text:
                outcome["text"] += text
                runs.got_text(session)

        try:
            async with bus.run(app_name=APP, user_id=USER, session_id=session) as handle:
                started.set_result(handle.run_id)
                await _drive(handle, agent, session, api, keep, got)
                outcome["after_loop"] = True
        finally:
            if keep:
                outcome["messages"] = pydantic_ai_support.summary(keep[0].all_messages())
        played = story(session)
        return {**outcome, "tool": played.tool_ran, "model_calls": played.model_calls}

    async def run(request: Request) -> JSONResponse:
        sent = await request.json()
        session, api = sent["session"], sent.get("api", "run_stream_events")
        return await runs.start(session, lambda started: body(session, api, started))

    return [Route("/pydantic-ai/runs", run, methods=["POST"])]


async def _drive(
    handle: Any,
    agent: Agent[None, str],
    prompt: str,
    api: str,
    keep: list[Any],
    got: Callable[[str], None],
) -> None:
    """The user's code of each helper, as docs/integrations.md shows it."""
    if api == "run_stream_events":
        async with pydantic_ai.run_stream_events(handle, agent, prompt) as events:
            keep.append(events)
            async for event in events:
                got(_delta(event))
    elif api == "iter":
        async with pydantic_ai.iter(handle, agent, prompt) as agent_run:
            keep.append(agent_run)
            async for node in agent_run:
                if Agent.is_model_request_node(node):
                    async with node.stream(agent_run.ctx) as stream:
                        async for event in stream:
                            got(_delta(event))
    else:
        try:
            async with pydantic_ai.run_stream(handle, agent, prompt) as result:
                keep.append(result)
                async for text in result.stream_text(delta=True):
                    got(text)
        except RunCancelled as cancelled:  # run_stream's messages so far are on the cause
            keep[:] = [cancelled.__cause__]
            raise


def _delta(event: Any) -> str:
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return ""


def story_routes() -> list[Route]:
    """``/stories/{session}``: what the session's model did (model calls, the tool)."""

    async def played(request: Request) -> JSONResponse:
        found = story(request.path_params["session"])
        return JSONResponse({"model_calls": found.model_calls, "tool": found.tool_ran})

    return [Route("/stories/{session}", played, methods=["GET"])]


async def _reinstall_adk(bus: CancelBus, setting: dict[str, str]) -> None:
    google_adk.uninstall()
    google_adk.install(bus, **setting)  # type: ignore[arg-type]


def _extend(app: FastAPI, routes: Iterable[Route]) -> None:
    app.router.routes.extend(routes)


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[FastAPI]:
    agno.install(bus)
    google_adk.install(bus)
    db = InMemoryDb()
    app = get_fast_api_app(
        agents_dir=str(AGENTS_DIR),
        web=False,
        auto_create_session=True,
        use_local_storage=False,  # sessions and artifacts in memory, nothing under agents_dir
    )
    google_adk.add_cancel_routes(app, bus)
    runs = Runs()
    _extend(
        app,
        [
            *agno_routes(runs, db),
            *pydantic_ai_routes(bus, runs),
            *story_routes(),
            *runs.routes(),
            *bus_routes(bus),
            *gate_routes(GATES),
            *multitask_routes(lambda **setting: _reinstall_adk(bus, setting)),
        ],
    )
    os_agent = agno_support.story_agent(story("agentos"), db)
    os_team = agno_support.story_team(story("agentos-team"), db)
    app.mount("/os", AgentOS(agents=[os_agent], teams=[os_team], telemetry=False).get_app())
    try:
        yield app
    finally:
        google_adk.uninstall()
        with contextlib.suppress(RuntimeError):  # runs still going: the process ends anyway
            agno.uninstall()
