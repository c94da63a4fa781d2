"""a2a-sdk 0.3 as it is, on one process (see replica.py): trpc-agent's A2A service of the scripted
agent under ``/a2a/``, served by the SDK's own ``DefaultRequestHandler`` and in-memory task store,
nothing of cancel-bus in the way: the reference that the replicas' answers are compared with
(test_a2a_differential.py). Also the agent's gates and the store's read counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from a2a.server.apps import A2AStarletteApplication
from a2a.server.request_handlers import DefaultRequestHandler
from starlette.applications import Starlette
from starlette.routing import Mount
from trpc_agent_sdk.server.a2a import TrpcA2aAgentService

from cancel_bus import CancelBus

from .a2a_reads import read_routes
from .a2a_support import CountingTaskStore, card
from .replica_routes import gate_routes
from .trpc_support import APP, GatedSessionService, StreamingAgent


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[Starlette]:
    del bus  # stock: no bus
    agent = StreamingAgent(name="streamer")
    service = TrpcA2aAgentService(
        service_name=APP, agent=agent, session_service=GatedSessionService(agent)
    )
    store = CountingTaskStore()
    handler = DefaultRequestHandler(agent_executor=service, task_store=store)
    a2a = A2AStarletteApplication(agent_card=card(f"{url}/a2a/"), http_handler=handler).build()
    yield Starlette(
        routes=[*gate_routes(agent.gate), *read_routes(store.reads), Mount("/a2a", a2a)]
    )
