"""The A2A (a2a-sdk 0.3) side of the tests: the agent card, clients, and a task being sent."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskQueryParams,
    TaskState,
    TaskStatusUpdateEvent,
    TextPart,
)

from cancel_bus.integrations.a2a import BusTaskStore

from ..helpers import WAIT, eventually

CANCEL_TIMEOUT = 2.0  # how long a replica waits for the owner before answering a cancel


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


def client(http: httpx.AsyncClient, url: str, *, streaming: bool = True) -> Client:
    """A client of the A2A server at ``url``; not streaming: ``message/send`` non-blocking."""
    config = ClientConfig(streaming=streaming, polling=not streaming, httpx_client=http)
    return ClientFactory(config).create(card(url))


def message(text: str, context_id: str | None = None, task_id: str | None = None) -> Message:
    return Message(
        role=Role.user,
        parts=[Part(root=TextPart(text=text))],
        message_id=uuid.uuid4().hex,
        context_id=context_id,
        task_id=task_id,
    )


class Counting:
    """A task store counting the reads of each task (see a2a_reads.py)."""

    reads: dict[str, int]

    async def get(self, task_id: str, context: Any = None) -> Task | None:
        task: Task | None = await super().get(task_id, context)  # type: ignore[misc]
        self.reads[task_id] = self.reads.get(task_id, 0) + 1
        return task


class CountingBusTaskStore(Counting, BusTaskStore):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = {}


class CountingTaskStore(Counting, InMemoryTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = {}


class Stream:
    """A streaming ``message/stream`` in the background; ``started`` once the agent streams."""

    def __init__(
        self, client: Client, text: str, context_id: str | None = None, task_id: str | None = None
    ) -> None:
        self.updates: list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent] = []
        self.task_id = task_id or ""
        self.task: Task | None = None  # as the client last saw it
        self.working = asyncio.Event()
        self.done = asyncio.create_task(self._consume(client, message(text, context_id, task_id)))

    async def _consume(self, client: Client, message: Message) -> None:
        async for event in client.send_message(message):
            assert isinstance(event, tuple)
            task, update = event
            self.task_id, self.task = task.id, task
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


async def submit(client: Client, text: str, context_id: str | None = None) -> Task:
    """A non-blocking ``message/send``: the task as soon as it exists."""
    [(task, _)] = [event async for event in client.send_message(message(text, context_id))]
    return task


async def streaming(client: Client, task_id: str) -> None:
    """Until the task's stored state shows the agent streaming (an artifact)."""

    async def check() -> bool:
        task = await client.get_task(TaskQueryParams(id=task_id))
        return bool(task.artifacts)

    await eventually(check)
