"""The task stores of the a2a-sdk 0.3 adapter (``a2a.py``): :class:`BusTaskStore`, tasks in the
bus's Redis; and the handler's view of its store, which tells an execution when the task's end
is stored and reopens a task for a follow-up message."""

from __future__ import annotations

import asyncio
from typing import cast

from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types import Task, TaskState

from cancel_bus import CancelBus

TERMINAL = frozenset(
    {TaskState.completed, TaskState.canceled, TaskState.failed, TaskState.rejected}
)
# where a task's execution ends (a task waiting for input goes on with the next message)
ENDS = TERMINAL | {TaskState.input_required, TaskState.auth_required}
_TERMINAL_VALUES = sorted(state.value for state in TERMINAL)

# KEYS[1] the task; ARGV[1] its state, ARGV[2] its JSON, ARGV[3] the ttl (ms), ARGV[4..] the
# terminal states. Stores the task unless the stored one is terminal in another state (a
# terminal state is final; a late save from a lagging writer must not undo it). Returns 1 if
# stored, 0 if not.
_SAVE = """
local task_key = KEYS[1]
local state, task, ttl_ms = ARGV[1], ARGV[2], ARGV[3]
local stored = redis.call('HGET', task_key, 'state')
if stored and stored ~= state then
  for i = 4, #ARGV do
    if ARGV[i] == stored then return 0 end
  end
end
redis.call('HSET', task_key, 'state', state, 'task', task)
redis.call('PEXPIRE', task_key, ttl_ms)
return 1
"""

# KEYS[1] the task; ARGV[1] its state, ARGV[2] its JSON, ARGV[3] the ttl (ms), ARGV[4] the
# canceled state. Stores the task unless the stored one is canceled (a follow-up message starts
# a new execution of a task that ended otherwise; a cancel is final). Returns 1 if stored.
_REOPEN = """
local task_key = KEYS[1]
if redis.call('HGET', task_key, 'state') == ARGV[4] then return 0 end
redis.call('HSET', task_key, 'state', ARGV[1], 'task', ARGV[2])
redis.call('PEXPIRE', task_key, ARGV[3])
return 1
"""


class BusTaskStore(TaskStore):
    """A2A tasks in the bus's Redis (under its namespace), kept ``ttl`` seconds. A task that
    reached a terminal state keeps it: a save that would move it elsewhere is ignored (only a
    follow-up message's execution reopens a task, one not ``canceled``)."""

    def __init__(self, bus: CancelBus, *, ttl: float = 86400.0) -> None:
        self._redis, prefix = bus._adapter_store()
        self._prefix = f"{prefix}a2a:task:"
        self._ttl_ms = int(ttl * 1000)
        self._save = self._redis.register_script(_SAVE)
        self._reopen = self._redis.register_script(_REOPEN)

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        """Store the task for ``ttl`` seconds (one script call), unless the stored one is terminal
        in another state: a late save never undoes a terminal state."""
        args = [task.status.state.value, task.model_dump_json(), self._ttl_ms]
        await self._save(keys=[self._prefix + task.id], args=[*args, *_TERMINAL_VALUES])

    async def reopen(self, task: Task) -> bool:
        """Store the task for a new execution of it (a follow-up message), unless the stored one
        is ``canceled``; whether it was stored."""
        args = [task.status.state.value, task.model_dump_json(), self._ttl_ms]
        stored = await self._reopen(keys=[self._prefix + task.id], args=[*args, "canceled"])
        return bool(stored)

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        """The stored task; None if it was never stored, or expired."""
        raw = cast(str | None, await self._redis.hget(self._prefix + task_id, "task"))
        return Task.model_validate_json(raw) if raw is not None else None

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        """Remove the stored task."""
        await self._redis.delete(self._prefix + task_id)


class EndsStore(TaskStore):
    """The handler's task store: tells the executions of this replica when their task's end is
    stored (the save of the execution's last event), and reopens a task for a follow-up."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self._waiting: dict[str, asyncio.Event] = {}

    def expect_end(self, task_id: str) -> asyncio.Event:
        """Set once the task is stored in a state its execution ends in."""
        return self._waiting.setdefault(task_id, asyncio.Event())

    def forget(self, task_id: str) -> None:
        """The execution ended: no more waiting for its end."""
        self._waiting.pop(task_id, None)

    async def reopen(self, task: Task) -> bool:
        """Store the task for a follow-up message's execution, unless it was canceled (a
        :class:`BusTaskStore` keeps a terminal state against plain saves)."""
        if isinstance(self.store, BusTaskStore):
            return await self.store.reopen(task)
        stored = await self.store.get(task.id)
        if stored is not None and stored.status.state is TaskState.canceled:
            return False
        await self.store.save(task)
        return True

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        """Save, then say so if the task's execution ends in that state."""
        await self.store.save(task, context)
        if task.status.state in ENDS and task.id in self._waiting:
            self._waiting[task.id].set()

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        """The stored task."""
        return await self.store.get(task_id, context)

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        """Remove the stored task."""
        await self.store.delete(task_id, context)
