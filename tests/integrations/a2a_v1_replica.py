"""An a2a-sdk 1.x replica process (see replica.py): trpc-agent installed on its bus, its
``a2a_v1`` service of the scripted agent under ``/a2a`` (JSON-RPC) and ``/rest`` (HTTP+JSON), of
the boss (which calls a remote A2A agent through ``cancel_bus.integrations.a2a_v1.send_message``)
under ``/x/a2a``, a task store and an event stream shared by the replicas of the namespace (one
SQLite file), and the control routes."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.server.cluster import DatabaseTaskEventStream, StoredTask, VersionedDatabaseTaskStore
from a2a.server.context import ServerCallContext
from a2a.server.routes.rest_routes import create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.applications import Starlette
from trpc_agent_sdk.server.a2a_v1 import TrpcA2aAgentService, create_a2a_application
from trpc_agent_sdk.tools import FunctionTool

from cancel_bus import CancelBus
from cancel_bus.integrations import a2a_v1, trpc_agent
from cancel_bus.integrations.a2a_v1 import BusRequestHandler

from ..helpers import WAIT
from .a2a_reads import read_routes
from .replica_routes import bus_routes, gate_routes
from .trpc_support import APP, BOSS, GatedSessionService, StreamingAgent, boss

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


def client(http: httpx.AsyncClient, url: str, *, streaming: bool = True) -> Client:
    """A client of the replica at ``url`` (``/a2a``); not streaming: non-blocking."""
    config = ClientConfig(streaming=streaming, polling=not streaming, httpx_client=http)
    return ClientFactory(config).create(card(url))


def send_request(text: str, context_id: str = "", task_id: str = "") -> SendMessageRequest:
    message = Message(
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        message_id=uuid.uuid4().hex,
        context_id=context_id,
        task_id=task_id,
    )
    return SendMessageRequest(message=message)


class CountingTaskStore(InMemoryTaskStore):
    """The SDK's in-memory store (stock, one process), counting the reads of each task."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[str, int] = {}

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        task = await super().get(task_id, context)
        self.reads[task_id] = self.reads.get(task_id, 0) + 1
        return task


class CountingStore(VersionedDatabaseTaskStore):
    """The shared task store, counting the reads of each task: a request that names a task has
    reached the handler once its read is counted (the tests' sync point for a follow-up)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: dict[str, int] = {}

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        stored = await super().get(task_id, context)
        self.reads[task_id] = self.reads.get(task_id, 0) + 1
        return stored


def asking(bus: CancelBus) -> FunctionTool:
    """The boss's tool ``ask_remote``: asks the replica at the URL it is given to ``stream``, as
    a call under the run of the boss (the run whose code calls it); its text is the answer."""

    async def ask_remote(request: str) -> str:
        """Ask the remote A2A agent at the URL ``request``."""
        text: list[str] = []
        async with (
            httpx.AsyncClient(timeout=WAIT) as http,
            a2a_v1.send_message(bus, client(http, request), send_request("stream")) as events,
        ):
            async for response in events:
                if response.HasField("artifact_update"):
                    text.extend(part.text for part in response.artifact_update.artifact.parts)
        return "".join(text)

    return FunctionTool(ask_remote)


def a2a_service(
    bus: CancelBus, agent: Any, url: str, service_name: str, **stores: Any
) -> tuple[TrpcA2aAgentService, BusRequestHandler]:
    """trpc-agent's ``a2a_v1`` service of ``agent`` at ``url`` (its JSON-RPC at ``/a2a``), and
    its handler."""
    service = TrpcA2aAgentService(
        service_name=service_name,
        agent=agent,
        agent_card=card(url),
        session_service=GatedSessionService(agent),
    )
    handler = BusRequestHandler(
        bus, cancel_timeout=CANCEL_TIMEOUT, agent_executor=service, agent_card=card(url), **stores
    )
    return service, handler


@asynccontextmanager
async def serve(bus: CancelBus, url: str) -> AsyncIterator[Starlette]:
    trpc_agent.install(bus)
    agent = StreamingAgent(name="streamer")
    database = Path(tempfile.gettempdir()) / f"cancel-bus-{bus.namespace}.db"
    engine = create_async_engine(f"sqlite+aiosqlite:///{database}")
    store = CountingStore(engine)
    events = DatabaseTaskEventStream(engine, poll_interval_s=0.05)
    for attempt in range(5):  # the replicas create the tables at once
        try:
            await store.initialize()
            await events.initialize()
            break
        except OperationalError:
            if attempt == 4:
                raise
    stores = {"task_store": store, "event_stream": events}
    service, handler = a2a_service(bus, agent, url, APP, **stores)
    a2a = create_a2a_application(service, request_handler=handler)
    boss_service, boss_handler = a2a_service(bus, boss(asking(bus)), f"{url}/x", BOSS, **stores)
    boss_app = create_a2a_application(boss_service, request_handler=boss_handler)
    yield Starlette(
        routes=[
            *a2a.routes,
            *boss_app.routes,  # JSON-RPC at /x/a2a, the path of its card's url
            *bus_routes(bus),
            *gate_routes(agent.gate),
            *read_routes(store.reads),
            *create_rest_routes(handler, path_prefix="/rest"),  # ends with a catch-all (tenants)
        ]
    )
    await engine.dispose()
