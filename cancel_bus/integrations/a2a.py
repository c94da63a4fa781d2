"""A2A (a2a-sdk 0.3, trpc-agent's A2A service): ``tasks/cancel`` on any replica of a task.

    trpc_agent.install(bus)  # every replica, on the loop of the A2A server
    handler = DefaultRequestHandler(
        agent_executor=BusAgentExecutor(TrpcA2aAgentService(...), bus),
        task_store=BusTaskStore(bus),
    )
    app = A2AStarletteApplication(agent_card=card, http_handler=handler).build()

:class:`BusTaskStore` keeps tasks in the bus's Redis, so every replica knows every task.
:class:`BusAgentExecutor` runs the wrapped executor and answers ``cancel`` through the bus: the
task's trpc-agent run (found by the session key that trpc-agent's executor writes in the task's
metadata) stops at its next checkpoint on whichever replica runs it; that replica's stream ends
with ``canceled`` as usual, and the replica that took the cancel answers with the task
``canceled`` once the owner confirmed. A run that does not reach a checkpoint within ``timeout``
is not reported canceled: the cancel fails with ``TaskNotCancelableError`` (it stays recorded and
is honoured at the run's next checkpoint).
"""

from __future__ import annotations

from typing import cast

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskStore
from a2a.types import (
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils import new_agent_text_message
from a2a.utils.errors import ServerError

from cancel_bus import CancelBus, Outcome

from .trpc_agent import bus_session

__all__ = ["BusAgentExecutor", "BusTaskStore"]

CANCEL_REASON = "A2A tasks/cancel"


class BusTaskStore(TaskStore):
    """A2A tasks as JSON in the bus's Redis (under its namespace), kept ``ttl`` seconds."""

    def __init__(self, bus: CancelBus, *, ttl: float = 86400.0) -> None:
        self._redis = bus.redis
        self._prefix = f"{bus.keys.prefix}a2a:task:"
        self._ttl_ms = int(ttl * 1000)

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        await self._redis.set(self._prefix + task.id, task.model_dump_json(), px=self._ttl_ms)

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        raw = cast(str | None, await self._redis.get(self._prefix + task_id))
        return Task.model_validate_json(raw) if raw is not None else None

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        await self._redis.delete(self._prefix + task_id)


class BusAgentExecutor(AgentExecutor):
    """Runs ``executor`` (trpc-agent's A2A service or executor); cancels through the bus."""

    def __init__(self, executor: AgentExecutor, bus: CancelBus, *, timeout: float = 5.0) -> None:
        self._executor = executor
        self._bus = bus
        self._timeout = timeout

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self._executor.execute(context, event_queue)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Stop the task's run wherever it runs and wait up to ``timeout`` for its owner."""
        task = context.current_task
        if task is None:
            raise ServerError(TaskNotFoundError())
        session = _trpc_session(task)
        if session is None:  # its run has not started (or it is not a trpc-agent task)
            await event_queue.enqueue_event(_canceled(task, "No active task found"))
            return
        result = await self._bus.cancel_session(
            *bus_session(*session), reason=CANCEL_REASON, timeout=self._timeout
        )
        run = result.run
        if result.outcome is Outcome.NOT_FOUND:
            await event_queue.enqueue_event(_canceled(task, "No active task found"))
        elif result.outcome is Outcome.STOPPING:
            raise ServerError(
                TaskNotCancelableError(
                    message=f"cancel recorded, but the task did not stop within {self._timeout}s;"
                    " it stops at its next checkpoint"
                )
            )
        elif run is None or run.end_reason not in ("cancelled", "owner_lost"):
            ended = run.end_reason if run is not None else "unknown"
            raise ServerError(TaskNotCancelableError(message=f"the task's run ended: {ended}"))
        elif run.owner != self._bus.node_id:
            # the owner's executor reports to its own queue; this replica has no producer
            await event_queue.enqueue_event(_canceled(task, "Task was cancelled"))


def _trpc_session(task: Task) -> tuple[str, str, str] | None:
    """The session key trpc-agent's executor wrote in the task's metadata (its working status)."""
    metadata = task.metadata or {}
    parts = (metadata.get("app_name"), metadata.get("user_id"), metadata.get("session_id"))
    if not all(isinstance(part, str) and part for part in parts):
        return None
    return cast(tuple[str, str, str], parts)


def _canceled(task: Task, text: str) -> TaskStatusUpdateEvent:
    message = new_agent_text_message(text, task.context_id, task.id)
    return TaskStatusUpdateEvent(
        task_id=task.id,
        context_id=task.context_id,
        status=TaskStatus(state=TaskState.canceled, message=message),
        final=True,
    )
