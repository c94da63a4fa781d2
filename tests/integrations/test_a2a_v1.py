"""A2A 1.x over HTTP: two servers of trpc-agent's ``a2a_v1`` service (each on its own loop and
port, each with its own bus) sharing one task store and one real Redis server, driven by the
real a2a-sdk client. Collected only where a2a-sdk 1.x is installed (see conftest.py)."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.server.cluster import VersionedDatabaseTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError
from sqlalchemy.ext.asyncio import create_async_engine
from trpc_agent_sdk.server.a2a_v1 import TrpcA2aAgentService, create_a2a_application
from trpc_agent_sdk.sessions import InMemorySessionService

from cancel_bus import CancelBus, RunStatus
from cancel_bus.integrations import trpc_agent
from cancel_bus.integrations.a2a_v1 import BusRequestHandler

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .trpc_support import APP, LoopThread, StreamingAgent

pytestmark = pytest.mark.filterwarnings(
    "ignore:A VersionedTaskStore was configured without an event_stream"
)
CANCEL_TIMEOUT = 1.0  # how long a replica waits for the owner before answering a cancel


@dataclass
class A2aServer:
    """One replica: a bus installed for trpc-agent, trpc-agent's A2A service, uvicorn."""

    bus: CancelBus
    agent: StreamingAgent
    server: uvicorn.Server
    serving: asyncio.Task[None]
    url: str

    @classmethod
    async def start(cls, redis_url: str, namespace: str, database: str) -> A2aServer:
        bus = CancelBus(redis_url, namespace=namespace, lease_ttl=3.0)
        await bus.start()
        trpc_agent.install(bus)
        agent = StreamingAgent(name="streamer", release=asyncio.Event())
        listener = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        service = TrpcA2aAgentService(
            service_name=APP,
            agent=agent,
            agent_card=card(url),
            session_service=InMemorySessionService(),
        )
        store = VersionedDatabaseTaskStore(create_async_engine(database))
        await store.initialize()
        handler = BusRequestHandler(
            bus,
            cancel_timeout=CANCEL_TIMEOUT,
            agent_executor=service,
            task_store=store,
            agent_card=card(url),
        )
        app = create_a2a_application(service, request_handler=handler)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        await eventually(lambda: _started(server))
        return cls(bus, agent, server, serving, url)

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.serving, WAIT)
        trpc_agent.uninstall()
        await self.bus.close(cancel_timeout=2.0)


async def _started(server: uvicorn.Server) -> bool:
    return server.started


Replica = tuple[A2aServer, LoopThread]


def card(url: str) -> AgentCard:
    return AgentCard(
        name="streamer",
        description="streams numbered chunks",
        version="1",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="stream", name="stream", description="streams", tags=["demo"])],
    )


@pytest.fixture
async def servers(redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[list[Replica]]:
    """Replicas A and B, each on its own loop, sharing a task store (an SQLite file)."""
    database = f"sqlite+aiosqlite:///{tmp_path / 'tasks.db'}"
    started: list[Replica] = []
    for _ in range(2):
        thread = LoopThread()
        started.append((await thread.call(A2aServer.start(redis_url, namespace, database)), thread))
    yield started
    for server, thread in started:
        await thread.call(server.stop())
        await thread.close()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        yield client


def client(http: httpx.AsyncClient, server: A2aServer) -> Client:
    return ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card(server.url))


class Stream:
    """A streaming ``SendMessage`` in the background; ``working`` once the agent streams."""

    def __init__(self, client: Client, text: str) -> None:
        message = Message(role=Role.ROLE_USER, parts=[Part(text=text)], message_id=uuid.uuid4().hex)
        self.responses: list[StreamResponse] = []
        self.task_id = ""
        self.working = asyncio.Event()
        self.done = asyncio.create_task(self._consume(client, SendMessageRequest(message=message)))

    async def _consume(self, client: Client, request: SendMessageRequest) -> None:
        async for response in client.send_message(request):
            self.responses.append(response)
            if response.HasField("task"):
                self.task_id = response.task.id
            if response.HasField("artifact_update"):
                self.task_id = response.artifact_update.task_id
                self.working.set()

    async def started(self) -> str:
        await asyncio.wait_for(self.working.wait(), WAIT)
        return self.task_id

    async def final_state(self) -> TaskState:
        await asyncio.wait_for(self.done, WAIT)
        last = self.responses[-1]
        if last.HasField("task"):
            return last.task.status.state
        assert last.HasField("status_update")
        return last.status_update.status.state


@pytest.mark.parametrize("where", ["other replica", "owner"])
async def test_cancel_task_on_any_replica_stops_the_task_at_its_checkpoint(
    servers: list[Replica], http: httpx.AsyncClient, make_bus: BusFactory, where: str
) -> None:
    (a, _), (b, _) = servers
    stream = Stream(client(http, a), "stream")
    task_id = await stream.started()

    canceller = client(http, b if where == "other replica" else a)
    task = await asyncio.wait_for(canceller.cancel_task(CancelTaskRequest(id=task_id)), WAIT)

    assert task.status.state == TaskState.TASK_STATE_CANCELED
    assert await stream.final_state() == TaskState.TASK_STATE_CANCELED
    fetched = await client(http, b).get_task(GetTaskRequest(id=task_id))
    assert fetched.status.state == TaskState.TASK_STATE_CANCELED
    [run] = await (await make_bus()).list_runs(status="all", app_name=APP)
    assert (run.status, run.end_reason, run.owner) == (
        RunStatus.CANCELLED,
        "cancelled",  # stopped at a checkpoint, not killed
        a.bus.node_id,
    )


async def test_a_task_that_does_not_stop_is_not_reported_canceled(
    servers: list[Replica], http: httpx.AsyncClient, make_bus: BusFactory
) -> None:
    (a, thread_a), (b, _) = servers
    stream = Stream(client(http, a), "hold")
    task_id = await stream.started()

    with pytest.raises(TaskNotCancelableError):
        await asyncio.wait_for(client(http, b).cancel_task(CancelTaskRequest(id=task_id)), WAIT)
    [run] = await (await make_bus()).list_runs(app_name=APP)
    assert run.stopping

    thread_a.loop.call_soon_threadsafe(a.agent.release.set)
    assert await stream.final_state() == TaskState.TASK_STATE_COMPLETED
