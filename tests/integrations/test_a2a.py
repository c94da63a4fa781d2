"""A2A over HTTP: two servers of trpc-agent's A2A service (each on its own loop and port, each
with its own bus) on one real Redis server, driven by the real a2a-sdk client."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientJSONRPCError
from a2a.server.apps import A2AStarletteApplication
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    Message,
    Part,
    Role,
    TaskArtifactUpdateEvent,
    TaskIdParams,
    TaskNotCancelableError,
    TaskQueryParams,
    TaskState,
    TaskStatusUpdateEvent,
    TextPart,
)
from trpc_agent_sdk.server.a2a import TrpcA2aAgentService
from trpc_agent_sdk.sessions import InMemorySessionService

from cancel_bus import CancelBus, RunStatus
from cancel_bus.integrations import trpc_agent
from cancel_bus.integrations.a2a import BusAgentExecutor, BusTaskStore

from ..conftest import BusFactory
from ..helpers import WAIT, eventually
from .trpc_support import APP, LoopThread, StreamingAgent

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
    async def start(cls, redis_url: str, namespace: str) -> A2aServer:
        bus = CancelBus(redis_url, namespace=namespace, lease_ttl=3.0)
        await bus.start()
        trpc_agent.install(bus)
        agent = StreamingAgent(name="streamer", release=asyncio.Event())
        listener = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        service = TrpcA2aAgentService(
            service_name=APP, agent=agent, session_service=InMemorySessionService()
        )
        handler = DefaultRequestHandler(
            agent_executor=BusAgentExecutor(service, bus, timeout=CANCEL_TIMEOUT),
            task_store=BusTaskStore(bus),
        )
        app = A2AStarletteApplication(agent_card=card(url), http_handler=handler).build()
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
        url=url,
        version="1",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[],
    )


@pytest.fixture
async def servers(redis_url: str, namespace: str) -> AsyncIterator[list[Replica]]:
    """Replicas A and B, each on its own loop."""
    started: list[Replica] = []
    for _ in range(2):
        thread = LoopThread()
        started.append((await thread.call(A2aServer.start(redis_url, namespace)), thread))
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
    """A streaming ``message/send`` in the background; ``working`` once the agent streams."""

    def __init__(self, client: Client, text: str) -> None:
        message = Message(
            role=Role.user, parts=[Part(root=TextPart(text=text))], message_id=uuid.uuid4().hex
        )
        self.updates: list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent] = []
        self.task_id = ""
        self.working = asyncio.Event()
        self.done = asyncio.create_task(self._consume(client, message))

    async def _consume(self, client: Client, message: Message) -> None:
        async for event in client.send_message(message):
            assert isinstance(event, tuple)
            task, update = event
            self.task_id = task.id
            if update is not None:
                self.updates.append(update)
            if isinstance(update, TaskArtifactUpdateEvent):
                self.working.set()

    async def started(self) -> str:
        await asyncio.wait_for(self.working.wait(), WAIT)
        return self.task_id

    async def final_state(self) -> TaskState:
        await asyncio.wait_for(self.done, WAIT)
        last = self.updates[-1]
        assert isinstance(last, TaskStatusUpdateEvent) and last.final
        return last.status.state


@pytest.mark.parametrize("where", ["other replica", "owner"])
async def test_tasks_cancel_on_any_replica_stops_the_task_on_its_owner(
    servers: list[Replica],
    http: httpx.AsyncClient,
    make_bus: BusFactory,
    where: str,
) -> None:
    (a, _), (b, _) = servers
    stream = Stream(client(http, a), "stream")
    task_id = await stream.started()

    canceller = client(http, b if where == "other replica" else a)
    task = await asyncio.wait_for(canceller.cancel_task(TaskIdParams(id=task_id)), WAIT)

    assert task.status.state is TaskState.canceled
    assert await stream.final_state() is TaskState.canceled
    fetched = await client(http, b).get_task(TaskQueryParams(id=task_id))
    assert fetched.status.state is TaskState.canceled
    ops = await make_bus()
    [run] = await ops.list_runs(status="all", app_name=APP)
    assert (run.status, run.end_reason, run.owner) == (
        RunStatus.CANCELLED,
        "cancelled",
        a.bus.node_id,
    )


async def test_a_task_that_does_not_stop_is_not_reported_canceled(
    servers: list[Replica], http: httpx.AsyncClient, make_bus: BusFactory
) -> None:
    (a, thread_a), (b, _) = servers
    stream = Stream(client(http, a), "hold")
    task_id = await stream.started()

    with pytest.raises(A2AClientJSONRPCError) as refused:
        await asyncio.wait_for(client(http, b).cancel_task(TaskIdParams(id=task_id)), WAIT)
    assert refused.value.error.code == TaskNotCancelableError().code
    [run] = await (await make_bus()).list_runs(app_name=APP)
    assert run.stopping

    thread_a.loop.call_soon_threadsafe(a.agent.release.set)
    assert await stream.final_state() is TaskState.completed


async def test_cancel_of_a_task_no_replica_runs_answers_canceled(
    servers: list[Replica], http: httpx.AsyncClient, make_bus: BusFactory
) -> None:
    """A task left working by a replica that died: no run anywhere, so it is canceled."""
    (a, _), (b, _) = servers
    stream = Stream(client(http, a), "short")
    assert await stream.final_state() is TaskState.completed
    store = BusTaskStore(await make_bus())
    task = await store.get(stream.task_id)
    assert task is not None
    task.status.state = TaskState.working  # as its owner left it when it died
    await store.save(task)

    canceled = await client(http, b).cancel_task(TaskIdParams(id=stream.task_id))
    assert canceled.status.state is TaskState.canceled
