"""An a2a-sdk 1.x replica process (see replica.py): trpc-agent installed on its bus, its
``a2a_v1`` service under ``/a2a`` (JSON-RPC) and ``/rest`` (HTTP+JSON), a task store and an event
stream shared by the replicas of the namespace (one SQLite file), and the control routes."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from a2a.server.cluster import DatabaseTaskEventStream, VersionedDatabaseTaskStore
from a2a.server.routes.rest_routes import create_rest_routes
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.applications import Starlette
from trpc_agent_sdk.server.a2a_v1 import TrpcA2aAgentService, create_a2a_application

from cancel_bus import CancelBus
from cancel_bus.integrations import trpc_agent
from cancel_bus.integrations.a2a_v1 import BusRequestHandler

from .replica_routes import bus_routes, gate_routes
from .trpc_support import APP, GatedSessionService, StreamingAgent

CANCEL_TIMEOUT = 2.0  # how long a replica waits for the owner before answering a cancel


def card(url: str) -> AgentCard:
    return AgentCard(
        name="streamer",
        description="streams numbered chunks",
        version="1",
        supported_interfaces=[
            AgentInterface(url=f"{url}/a2a", protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="stream", name="stream", description="streams", tags=["demo"])],
    )


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[Starlette]:
    trpc_agent.install(bus)
    agent = StreamingAgent(name="streamer")
    service = TrpcA2aAgentService(
        service_name=APP,
        agent=agent,
        agent_card=card(url),
        session_service=GatedSessionService(agent),
    )
    database = Path(tempfile.gettempdir()) / f"cancel-bus-{bus.keys.namespace}.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{database}")
    store = VersionedDatabaseTaskStore(engine)
    events = DatabaseTaskEventStream(engine, poll_interval_s=0.05)
    for attempt in range(5):  # the replicas create the tables at once
        try:
            await store.initialize()
            await events.initialize()
            break
        except OperationalError:
            if attempt == 4:
                raise
    handler = BusRequestHandler(
        bus,
        cancel_timeout=CANCEL_TIMEOUT,
        agent_executor=service,
        task_store=store,
        event_stream=events,
        agent_card=card(url),
    )
    a2a = create_a2a_application(service, request_handler=handler)
    yield Starlette(
        routes=[
            *a2a.routes,
            *bus_routes(bus),
            *gate_routes(agent.gate),
            *create_rest_routes(handler, path_prefix="/rest"),  # ends with a catch-all (tenants)
        ]
    )
    await engine.dispose()
