"""The bus side of both A2A adapters (no a2a-sdk import): each execution of a task is a bus run.

The replica that executes a task registers a bus run of the session ``("a2a", <task id>,
"task")`` before the task's first event, so the task never exists in the store without its
execution being findable by every replica. A cancel of the task (any replica, any mode) is a
cancel of that run; its owner hands it to the task's trpc-agent runs (:class:`RunGroup`, so a
cancel that lands before the agent's run registered is applied when it does), and ends the run
only once the task's final state is stored: a canceller that saw the run end reads the final task.
The run relays the task's events, so any replica can stream them (``tasks/resubscribe``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from cancel_bus import (
    BusClosed,
    BusUnavailable,
    CancelBus,
    CancelMode,
    CancelResult,
    Outcome,
    RunHandle,
    RunInfo,
)

from .trpc_agent import RunGroup, bus_session

log = logging.getLogger("cancel_bus.integrations.a2a")

TASK_APP = "a2a"
TASK_SESSION = "task"
CANCEL_REASON = "A2A tasks/cancel"
RELAY_EVENT = "a2a"  # the relayed events' type
LEAKED_EVENT = "a2a_event"  # what a task's executor did after its run ended (a leak)
WATCH_SLICE_SECONDS = 60.0
CANCEL_PENDING = "Cancel requested; the task stops at its next checkpoint."
OWNER_LOST = "The replica running the task was lost; the task is canceled."


class Verdict(enum.Enum):
    """What a cancel of a task found."""

    ENDED = "ended"  # its execution ended (stopped, or finished first); its end is stored
    STOPPING = "stopping"  # recorded, not stopped within the timeout: it stops later
    LOST = "lost"  # its replica died: only the canceller can end the task
    IDLE = "idle"  # no execution anywhere (waiting for input, or run before the adapter)


class Execution:
    """One execution of a task: its bus run, and how the task ended (set by the executor)."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.canceled = False
        self._run: RunHandle | None = None

    @property
    def run(self) -> RunHandle:
        """The execution's bus run, set once :meth:`TaskRuns.executing` entered it."""
        assert self._run is not None
        return self._run

    @run.setter
    def run(self, run: RunHandle) -> None:
        self._run = run


def task_session(task_id: str) -> tuple[str, str, str]:
    """The bus session key of a task's execution."""
    _, task, _ = bus_session(TASK_APP, task_id, TASK_SESSION)
    return (TASK_APP, task, TASK_SESSION)


def verdict(result: CancelResult) -> Verdict:
    """What the bus's answer to a task's cancel says: the run is stopping, its replica was lost, no
    run was found (idle), or it ended."""
    run = result.run
    if result.outcome is Outcome.STOPPING:
        return Verdict.STOPPING
    if run is not None and run.end_reason == "owner_lost":
        return Verdict.LOST
    if result.outcome is Outcome.NOT_FOUND:
        return Verdict.IDLE
    return Verdict.ENDED


class TaskRuns:
    """The executions of A2A tasks as bus runs, on one bus."""

    def __init__(self, bus: CancelBus, *, timeout: float, mode: CancelMode, relay: bool) -> None:
        self.bus = bus
        self.timeout = timeout
        self.mode = mode
        self.relay = relay
        self.local: set[str] = set()  # the tasks executing on this replica
        self._watchers: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def executing(self, task_id: str) -> AsyncIterator[Execution]:
        """The bus run of one execution of the task, on this replica, for the block. Its cancels
        go to the trpc-agent runs started in the block (now or when they register). The run is
        held by a task of its own, so that an ``immediate`` cancel interrupts the agent's run,
        not the execution: the run ends after the block, once the task's end is stored."""
        loop = asyncio.get_running_loop()
        entered: asyncio.Future[RunHandle] = loop.create_future()
        execution = Execution()
        holder = asyncio.create_task(self._hold(task_id, entered, execution))
        try:
            run = await asyncio.shield(entered)
        except BaseException:
            holder.cancel()
            raise
        group = RunGroup()
        run.add_cancel_callback(group.cancel)
        execution.run = run
        self.local.add(task_id)
        try:
            with group.collecting():
                yield execution
        finally:
            self.local.discard(task_id)
            execution.done.set()
            await holder

    async def _hold(
        self, task_id: str, entered: asyncio.Future[RunHandle], execution: Execution
    ) -> None:
        try:
            async with self.bus.run(
                app_name=TASK_APP,
                user_id=task_session(task_id)[1],
                session_id=TASK_SESSION,
                metadata={"integration": "a2a", "task_id": task_id, "relay": self.relay},
                relay=self.relay,
            ) as run:
                entered.set_result(run)
                while not execution.done.is_set():
                    try:
                        await execution.done.wait()
                    except asyncio.CancelledError:
                        if run.cancel_requested is None:
                            raise
                        # an immediate cancel of this run: handed to the agent's run already
                if execution.canceled:
                    run.turn_boundary()  # recorded cancelled: RunCancelled, suppressed by the scope
        except BaseException as exc:
            if not entered.done():
                entered.set_exception(exc)
            elif not isinstance(exc, asyncio.CancelledError):
                log.exception("cancel-bus: the bus run of A2A task %s failed", task_id)

    async def cancel(self, task_id: str) -> tuple[Verdict, CancelResult]:
        """Cancel the task's execution wherever it runs; wait up to ``timeout`` for its end."""
        result = await self.bus.cancel_session(
            *task_session(task_id), mode=self.mode, reason=CANCEL_REASON, timeout=self.timeout
        )
        return verdict(result), result

    def end_if_lost(self, run_id: str, end: Callable[[], Awaitable[None]]) -> None:
        """In the background: once the run ends, ``end()`` the task if its replica was lost
        (a cancel answered ``stopping`` must still end the task canceled)."""
        task = asyncio.create_task(self._end_if_lost(run_id, end))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _end_if_lost(self, run_id: str, end: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                run = await self.bus.wait(run_id, timeout=WATCH_SLICE_SECONDS)
            except BusUnavailable as exc:
                log.warning("cancel-bus: waiting for the end of %s: %s", run_id, exc)
                await asyncio.sleep(1.0)
                continue
            except BusClosed:
                return
            if run is None or not run.is_active:
                break
        if run is not None and run.end_reason == "owner_lost":
            await end()

    async def relay_problem(self, task_id: str) -> str | None:
        """Why the task's events cannot be streamed from this replica, or None."""
        run = await self._active_run(task_id)
        if run is None:
            return f"task {task_id} is not executing on any replica"
        if not (run.metadata or {}).get("relay"):
            return (
                f"task {task_id} executes on replica {run.owner}, which does not relay its events"
                " (relay=False): resubscribe there"
            )
        return None

    async def relayed(self, task_id: str) -> AsyncIterator[dict[str, Any]]:
        """The task's events from now on, as its owner relays them (their JSON), until its
        execution ends (nothing if it has no relayed execution: see :meth:`relay_problem`)."""
        run = await self._active_run(task_id)
        if run is None or not (run.metadata or {}).get("relay"):
            return
        async for event in self.bus.follow(run.run_id):
            if event.type == RELAY_EVENT:
                yield event.data

    async def executing_on(self, task_id: str) -> str | None:
        """The replica (node id) executing the task, if any."""
        run = await self._active_run(task_id)
        return run.owner if run is not None else None

    async def _active_run(self, task_id: str) -> RunInfo | None:
        return await self.bus.session_run(*task_session(task_id))
