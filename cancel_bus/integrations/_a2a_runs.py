"""The bus side of both A2A adapters (no a2a-sdk import): each execution of a task is a bus run.

The replica that executes a task registers a bus run of the session ``("a2a", <task id>,
"task")`` before the task's first event, so the task never exists in the store without its
execution being findable by every replica. A cancel of the task (any replica, any mode) is a
cancel of that run; its owner hands it to the task's trpc-agent runs (:class:`RunGroup`, so a
cancel that lands before the agent's run registered is applied when it does), and ends the run
only once the task's final state is stored: a canceller that saw the run end reads the final task.
The run relays the task's events, so any replica can stream them (``tasks/resubscribe``).

The executions of a task take turns, as a2a-sdk's own handler runs the messages of a task on one
process: a message for a task whose execution is still going, on any replica, waits for that
execution's end (its run's end, through the bus), then runs. The replica a message reached keeps
its messages in arrival order; across replicas, the next to start is the first to claim the
task's run once it is free. A message can also take its turn ahead of its execution
(:meth:`TaskRuns.reserve`), so that nothing else runs on the task in between (a2a-sdk 1.x sets its
execution up only then).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

from cancel_bus import (
    BusClosed,
    BusUnavailable,
    CancelBus,
    CancelMode,
    CancelResult,
    Outcome,
    RunHandle,
    RunInfo,
    SessionBusy,
)

from .trpc_agent import RunGroup, bus_session

log = logging.getLogger("cancel_bus.integrations.a2a")

E = TypeVar("E")

TASK_APP = "a2a"
TASK_SESSION = "task"
CANCEL_REASON = "A2A tasks/cancel"
RELAY_EVENT = "a2a"  # the relayed events' type
LEAKED_EVENT = "a2a_event"  # what a task's executor did after its run ended (a leak)
WATCH_SLICE_SECONDS = 60.0
CANCEL_PENDING = "Cancel requested; the task stops at its next checkpoint."
OWNER_LOST = "The replica running the task was lost; the task is canceled."
END_GRACE_SECONDS = 5.0  # how long a waiting message streams on for the end of the one before it


class Verdict(enum.Enum):
    """What a cancel of a task found."""

    ENDED = "ended"  # its execution ended (stopped, or finished first); its end is stored
    STOPPING = "stopping"  # recorded, not stopped within the timeout: it stops later
    LOST = "lost"  # its replica died: only the canceller can end the task
    IDLE = "idle"  # no execution anywhere (waiting for input, or run before the adapter)


class Execution:
    """One execution of a task: its bus run (held by a task of its own), whether it waited for
    an execution of the task before it, and how the task ended (set by the executor)."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.canceled = False
        self.waited = False
        self.entered: asyncio.Future[RunHandle] = asyncio.get_running_loop().create_future()
        self.holder: asyncio.Task[None] | None = None

    @property
    def run(self) -> RunHandle:
        """The execution's bus run (once entered)."""
        return self.entered.result()

    async def end(self) -> None:
        """End the run (the task's end is stored by then)."""
        self.done.set()
        if self.holder is not None:
            await self.holder


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
        self._reserved: dict[str, Execution] = {}
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def executing(self, task_id: str) -> AsyncIterator[Execution]:
        """The bus run of one execution of the task, on this replica, for the block: the run
        reserved for it (:meth:`reserve`), or one entered in the task's turn (once the task's
        execution before it, on any replica, ended). Its cancels go to the trpc-agent runs
        started in the block (now or when they register). The run is held by a task of its own,
        so that an ``immediate`` cancel interrupts the agent's run, not the execution: the run
        ends after the block, once the task's end is stored."""
        execution = self._reserved.pop(task_id, None) or await self._enter(task_id)
        group = RunGroup()
        execution.run.add_cancel_callback(group.cancel)
        self.local.add(task_id)
        try:
            with group.collecting():
                yield execution
        finally:
            self.local.discard(task_id)
            await execution.end()

    async def reserve(self, task_id: str) -> Execution:
        """The task's turn, taken now for an execution that starts later on this replica (the
        next :meth:`executing` of the task here adopts it); :meth:`release` it if none does."""
        execution = await self._enter(task_id)
        self._reserved[task_id] = execution
        return execution

    async def release(self, task_id: str, execution: Execution) -> None:
        """End a reserved turn that no execution adopted (nothing if one did)."""
        if self._reserved.get(task_id) is execution:
            del self._reserved[task_id]
            await execution.end()

    async def _enter(self, task_id: str) -> Execution:
        """Enter a bus run of the task's session, in turn: while another execution of the task
        runs (on any replica), wait for its end; the waiters of this replica go in order."""
        async with self._turn(task_id):
            waited = False
            while True:
                execution = Execution()
                execution.holder = asyncio.create_task(self._hold(task_id, execution))
                try:
                    await asyncio.shield(execution.entered)
                except SessionBusy as busy:
                    waited = True
                    await self._after(busy.active_run_id)
                    continue
                except BaseException:
                    execution.holder.cancel()
                    raise
                execution.waited = waited
                return execution

    @asynccontextmanager
    async def _turn(self, task_id: str) -> AsyncIterator[None]:
        lock, waiting = self._turns.get(task_id, (asyncio.Lock(), 0))
        self._turns[task_id] = (lock, waiting + 1)
        try:
            async with lock:
                yield
        finally:
            lock, waiting = self._turns[task_id]
            if waiting == 1:
                del self._turns[task_id]
            else:
                self._turns[task_id] = (lock, waiting - 1)

    async def _after(self, run_id: str) -> RunInfo | None:
        """Wait for the run's end (on any node); the run as it ended (None: no record)."""
        while True:
            try:
                run = await self.bus.wait(run_id, timeout=WATCH_SLICE_SECONDS)
            except BusUnavailable as exc:
                log.warning("cancel-bus: waiting for the end of %s: %s", run_id, exc)
                await asyncio.sleep(1.0)
                continue
            if run is None or not run.is_active:
                return run

    async def _hold(self, task_id: str, execution: Execution) -> None:
        entered = execution.entered
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
        try:
            run = await self._after(run_id)
        except BusClosed:
            return
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


class Turn(Generic[E]):
    """A message for a task, waiting for the task's turn on this replica (:meth:`TaskRuns.
    reserve`): ``execution`` once it came."""

    def __init__(self, runs: TaskRuns, task_id: str) -> None:
        self.runs = runs
        self.task_id = task_id
        self.execution: Execution | None = None

    async def wait(self) -> Execution:
        """Until the task's turn came (its executions before, on any replica, ended)."""
        self.execution = await self.runs.reserve(self.task_id)
        return self.execution

    async def earlier(
        self, events: AsyncIterator[E], is_end: Callable[[E], bool]
    ) -> AsyncIterator[E]:
        """``events`` (the task's, from the message's arrival: those of the executions before
        it) until the task's turn came and, if it waited for an execution, the last one yielded
        ended it (or, if none does within ``END_GRACE_SECONDS`` of the turn, at that grace: an
        execution that ended without an end event)."""
        loop = asyncio.get_running_loop()
        turn = asyncio.ensure_future(self.wait())
        following: asyncio.Future[E] | None = asyncio.ensure_future(anext(events))
        ended, deadline = False, None
        try:
            while following is not None and not (turn.done() and (ended or _over(turn))):
                if turn.done() and deadline is None:
                    deadline = loop.time() + END_GRACE_SECONDS
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                waits: set[asyncio.Future[Any]] = {following}
                if not turn.done():
                    waits.add(turn)
                done, _ = await asyncio.wait(
                    waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if following in done:
                    try:
                        event = following.result()
                    except StopAsyncIteration:
                        following = None
                        break
                    except Exception as exc:  # the stream failed: the message waits unseen
                        log.warning("cancel-bus: following task %s: %s", self.task_id, exc)
                        following = None
                        break
                    following = asyncio.ensure_future(anext(events))
                    ended = is_end(event)
                    yield event
                elif not done:
                    break  # the grace passed
            await turn
        finally:
            await _stop(following, events)
            await _stop(turn, None)

    async def release(self) -> None:
        """End the turn if no execution took it."""
        if self.execution is not None:
            await self.runs.release(self.task_id, self.execution)


def _over(turn: asyncio.Future[Execution]) -> bool:
    """Whether a turn that came needs no end event to stream: it failed, or it waited for no
    execution (none ran since the message came)."""
    return turn.cancelled() or turn.exception() is not None or not turn.result().waited


async def _stop(pending: asyncio.Future[Any] | None, events: AsyncIterator[Any] | None) -> None:
    """Cancel ``pending`` (its outcome retrieved) and close ``events``."""
    if pending is not None:
        pending.cancel()
        await asyncio.wait({pending})
        if not pending.cancelled():
            pending.exception()
    close = getattr(events, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
