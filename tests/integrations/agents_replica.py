"""An openai-agents and LangGraph replica process (see replica.py): the user's code of each
integration as its docs show it, started over control routes, with gates the tests open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents import Agent, RawResponsesStreamEvent, RunConfig, Runner
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from openai.types.responses import ResponseTextDeltaEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from cancel_bus import CancelBus
from cancel_bus.integrations.langgraph import astream, render_chunk
from cancel_bus.integrations.openai_agents import stream_events

from .langgraph_support import Story
from .openai_support import ScriptedModel, Tool, Turn
from .replica_routes import Gates, Runs, bus_routes, gate_routes

APP = "chat"
USER = "u1"
GATED = "gated-"  # a run whose first model token / graph node waits for the gate "start:<session>"


def openai_routes(bus: CancelBus, gates: Gates, runs: Runs) -> list[Route]:
    """Turn 1 streams "Let me ", stalls at the gate "model:<session>", streams "look. ", stalls
    at "tool:<session>" and calls the tool; turn 2 answers "It is 42."."""

    async def run(session: str, started: asyncio.Future[str]) -> dict[str, Any]:
        first = [gates(f"start:{session}")] if session.startswith(GATED) else []
        model = ScriptedModel(
            Turn(
                [*first, "Let me ", gates(f"model:{session}"), "look. ", gates(f"tool:{session}")],
                tool="lookup",
            ),
            Turn(["It is 42."]),
        )
        tool = Tool()
        tool.release.set()
        agent = Agent(name="assistant", model=model, tools=[tool.as_tool()])
        outcome: dict[str, Any] = {"text": "", "after_loop": False}
        async with (
            bus.run(app_name=APP, user_id=USER, session_id=session) as handle,
            stream_events(
                handle, Runner.run_streamed(agent, "?", run_config=RunConfig(tracing_disabled=True))
            ) as events,
        ):
            started.set_result(handle.run_id)
            async for event in events:
                if isinstance(event, RawResponsesStreamEvent) and isinstance(
                    event.data, ResponseTextDeltaEvent
                ):
                    outcome["text"] += event.data.delta
                    runs.got_text(session)
            outcome["after_loop"] = True
        outcome.update(model_calls=model.calls, tool=tool.started.is_set())
        return outcome

    async def start(request: Request) -> JSONResponse:
        session = (await request.json())["session"]
        return await runs.start(session, lambda started: run(session, started))

    return [Route("/openai/runs", start, methods=["POST"])]


def langgraph_routes(bus: CancelBus, gates: Gates, runs: Runs) -> list[Route]:
    """The story graph; the draft stalls at the gate "draft:<session>" after "Paris "."""

    async def run(session: str, started: asyncio.Future[str]) -> dict[str, Any]:
        story = Story(start=gates(f"start:{session}") if session.startswith(GATED) else None)
        story.draft_release = gates(f"draft:{session}")
        story.research_release.set()
        graph = story.graph(checkpointer=InMemorySaver())
        config: RunnableConfig = {"configurable": {"thread_id": session}}
        outcome: dict[str, Any] = {"chunks": [], "after_loop": False}
        async with (
            bus.run(app_name=APP, user_id=USER, session_id=session) as handle,
            astream(handle, graph, {"question": "?"}, config, stream_mode="custom") as chunks,
        ):
            started.set_result(handle.run_id)
            async for chunk in chunks:
                outcome["chunks"].append(render_chunk(chunk))
                runs.got_text(session)
            outcome["after_loop"] = True
        state = await graph.aget_state(config)
        outcome.update(
            next=list(state.next),
            research=story.research_started.is_set(),
            draft_interrupted=story.draft_interrupted,
        )
        return outcome

    async def start(request: Request) -> JSONResponse:
        session = (await request.json())["session"]
        return await runs.start(session, lambda started: run(session, started))

    return [Route("/langgraph/runs", start, methods=["POST"])]


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[Starlette]:
    gates, runs = Gates(), Runs()
    yield Starlette(
        routes=[
            *openai_routes(bus, gates, runs),
            *langgraph_routes(bus, gates, runs),
            *runs.routes(),
            *bus_routes(bus),
            *gate_routes(gates),
        ]
    )
