"""A2A (a2a-sdk 1.x, trpc-agent's ``a2a_v1`` service): a cooperative ``tasks/cancel`` on any
replica of a task.

    trpc_agent.install(bus)  # every replica, on the loop of the A2A server
    handler = BusRequestHandler(
        bus,
        agent_executor=service,  # trpc_agent_sdk.server.a2a_v1.TrpcA2aAgentService
        task_store=VersionedDatabaseTaskStore(engine),  # shared by the replicas
        agent_card=card,
    )
    app = create_a2a_application(service, request_handler=handler)

a2a-sdk 1.x cancels a task running on another replica by writing ``CANCELED`` to the shared task
store; the owner notices when it next saves and cancels its producer mid-await, so the agent's
partial output is lost. :class:`BusRequestHandler` first cancels the task's trpc-agent run
through the bus (the session key is in the task's metadata): it stops at its next checkpoint on
whichever replica runs it, trpc-agent saves its partial output, and the owner's executor ends the
task ``canceled`` (its streaming clients see it). The SDK's own path then finds the task
canceled. A run that does not reach a checkpoint within ``cancel_timeout`` is not killed: the
cancel fails with ``TaskNotCancelableError`` and is honoured at the run's next checkpoint.
"""

from __future__ import annotations

from typing import Any

from a2a.server.agent_execution.active_task import TERMINAL_TASK_STATES
from a2a.server.cluster import StoredTask
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.types.a2a_pb2 import CancelTaskRequest, Task, TaskState
from a2a.utils.errors import TaskNotCancelableError

from cancel_bus import CancelBus, Outcome

from .trpc_agent import bus_session

__all__ = ["BusRequestHandler"]

CANCEL_REASON = "A2A CancelTask"
_SESSION = ("app_name", "user_id", "session_id")  # written by trpc-agent's executor


class BusRequestHandler(DefaultRequestHandlerV2):
    """a2a-sdk's request handler whose ``CancelTask`` first stops the task's run via the bus."""

    def __init__(self, bus: CancelBus, *, cancel_timeout: float = 5.0, **options: Any) -> None:
        super().__init__(**options)
        self._bus = bus
        self._cancel_timeout = cancel_timeout

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        task = await self._stored_task(params.id, context)
        session = _trpc_session(task) if task is not None else None
        if session is None:  # unknown, ended, or no run started yet: the SDK answers
            return await self._sdk_cancel(params, context)
        result = await self._bus.cancel_session(
            *bus_session(*session), reason=CANCEL_REASON, timeout=self._cancel_timeout
        )
        if result.outcome is Outcome.STOPPING:
            raise TaskNotCancelableError(
                message=f"cancel recorded, but the task did not stop within "
                f"{self._cancel_timeout}s; it stops at its next checkpoint"
            )
        try:
            return await self._sdk_cancel(params, context)
        except TaskNotCancelableError:
            task = await self._stored_task(params.id, context)
            if task is not None and task.status.state == TaskState.TASK_STATE_CANCELED:
                return task  # the owner's executor recorded it first
            raise

    async def _sdk_cancel(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        task: Task | None = await super().on_cancel_task(params, context)
        return task

    async def _stored_task(self, task_id: str, context: ServerCallContext) -> Task | None:
        stored = await self.task_store.get(task_id, context)
        return stored.task if isinstance(stored, StoredTask) else stored


def _trpc_session(task: Task) -> tuple[str, str, str] | None:
    """The session key of a running task, from the metadata trpc-agent's executor wrote."""
    if task.status.state in TERMINAL_TASK_STATES:
        return None
    fields = task.metadata.fields
    parts = tuple(fields[name].string_value if name in fields else "" for name in _SESSION)
    return (parts[0], parts[1], parts[2]) if all(parts) else None
