"""This node's live runs: registering and ending them (the owner every run reports to), the
cancels that reach them, and those that came before their start returned here.

A burst of ends (100,000 runs ending in one event-loop turn) is a queue: each end is a queued
item (:mod:`._chunks`), worked on a bounded chunk at a time, and the calls' batcher sends each
chunk's finishes as one script call; the event-loop turn that woke them stays short, and the
heartbeat (on calls and connections of its own) runs between chunks. A finish that Redis does
not answer within an interval of being sent, or cannot take (unavailable, out of memory, refusing
the node's user), waits in the outbox, not in the run's exit: what Redis does never reaches the
run's code from its exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from . import _tracing as tracing
from ._calls import ScriptCalls
from ._chunks import ChunkedQueue, Settling
from ._duties import Spawn
from ._errors import BusUnavailable, CancelBusError, RunExists
from ._messages import SESSION_TARGET_PREFIX, run_target, session_target
from ._ports import Deferred, Delivery, Identified, Updates
from ._protocol import CancelOrder, Code, Finish, Finished
from ._reads import Reads
from ._run import ProfiledRunHandle, RunHandle, RunSpec
from ._run_state import Ending, RunCancelled, RunState
from ._state import Lifecycle
from ._timed import TimedMap
from ._types import (
    BusStats,
    CancelMode,
    CancelRequest,
    MultitaskStrategy,
    RunStatus,
    StopCause,
)

log = logging.getLogger("cancel_bus")

EARLY_CANCEL_SECONDS = 30.0
MAX_ERROR = 1000


class LocalRuns:
    def __init__(
        self,
        *,
        calls: ScriptCalls,
        reads: Reads,
        lease: Identified,
        sync: Updates,
        outbox: Deferred,
        lifecycle: Lifecycle,
        stats: BusStats,
        max_output_chars: int,
        spawn: Spawn,
        profile_checkpoints: bool = False,
    ) -> None:
        self._calls = calls
        self._reads = reads
        self._handle_class = ProfiledRunHandle if profile_checkpoints else RunHandle
        self._lease = lease
        self._sync = sync
        self._outbox = outbox
        self._lifecycle = lifecycle
        self._stats = stats
        self._max_output_chars = max_output_chars
        self._runs: dict[str, RunState] = {}
        self._handles: dict[str, RunHandle] = {}  # what each run's code holds
        self._empty = asyncio.Event()
        self._empty.set()
        self._early: TimedMap[str, CancelRequest] = TimedMap(EARLY_CANCEL_SECONDS, 10_000)
        self.starting = 0  # starts sent to Redis, not answered yet
        self._claiming: set[str] = set()  # their run ids
        self.finishing = 0  # finishes of runs still in the table, not answered yet
        self._ends: ChunkedQueue[tuple[RunState, Ending]] = ChunkedQueue(self._end, spawn)
        self.clock = lease.clock  # the RunOwner's clock: the lease's, called directly

    # -- the table ----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def states(self) -> list[RunState]:
        return list(self._runs.values())

    def handles(self) -> list[RunHandle]:
        return list(self._handles.values())

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def agrees_with(self, recorded: int) -> bool:
        """Whether Redis's count of this node's runs can be right: the table's count, give or
        take the starts and finishes on their way."""
        held = len(self._runs)
        return held - self.finishing <= recorded <= held + self.starting

    async def wait_empty(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._empty.wait(), timeout)

    # -- the cancels that reach runs here -----------------------------------------------------

    def deliver(self, run_id: str, request: CancelRequest, target: str | None = None) -> Delivery:
        """Set the run's token; a run not here (yet) keeps the request for its start. A session
        ``target`` must be the run's own session."""
        state = self._runs.get(run_id)
        if state is None:
            self._early.put(run_id, request)
            return Delivery.EARLY
        if target is not None and target.startswith(SESSION_TARGET_PREFIX):
            session = state.session
            if session is None or target != session_target(session):
                return Delivery.MISADDRESSED
        if not state.deliver(request, self.clock()):
            return Delivery.UNCHANGED
        self._sync.mark_delivered(state)
        if request.traceparent:
            tracing.happened(
                "cancel_bus.deliver",
                request.traceparent,
                {"cancel_bus.run_id": run_id, "cancel_bus.node": self._lease.node_id},
            )
        return Delivery.DELIVERED

    async def drain(self, timeout: float) -> None:
        """The end of a drain: cancel every run still here, as the node's own request
        (``node_shutdown``), and wait up to ``timeout`` for them to end. A request that cannot
        be recorded is recorded by the run's finish instead."""
        states = self.states()

        async def cancel(state: RunState) -> None:
            try:
                async with asyncio.timeout(timeout):
                    answer = await self._calls.request_cancel(
                        _shutdown(state.run_id, self._lease.node_id),
                        waiter="",
                        caller=self._lease.node_id,
                    )
            except (CancelBusError, TimeoutError):
                state.stop(StopCause.NODE_SHUTDOWN, self.clock())
                return
            request = answer.run.cancel_request if answer.run is not None else None
            if request is not None:
                self.deliver(state.run_id, request)

        await asyncio.gather(*(cancel(state) for state in states))
        if states:
            await self.wait_empty(timeout)

    def stop_all(self, cause: StopCause) -> None:
        """Stop every run here without a request (see :meth:`RunState.stop`)."""
        now = self.clock()
        for state in list(self._runs.values()):
            state.stop(cause, now)

    # -- the RunOwner protocol (called by RunScope and RunHandle) -----------------------------

    async def start_run(self, spec: RunSpec) -> RunHandle:
        self._lifecycle.require_open(accepting=True)
        if spec.run_id in self._runs or spec.run_id in self._claiming:
            # Redis would take this node's second start of the id for a retried first one
            raise RunExists(spec.run_id, "running")
        me = self._lease.identity
        self.starting += 1
        self._claiming.add(spec.run_id)
        try:  # Fenced, SessionBusy, RunExists, RunCancelled (it must not start)...
            fields = await self._calls.start_run(
                spec.run_id,
                me.node_id,
                me.epoch,
                spec.session,
                spec.metadata,
                spec.relay,
                spec.parent,
                queue=spec.strategy is MultitaskStrategy.ENQUEUE,
                interrupted=spec.interrupted,
            )
        finally:
            self.starting -= 1
            self._claiming.discard(spec.run_id)
        if self._lease.identity != me or not self._lease.may_run:
            # the answer outlived the lease it was given under (the fence stopped the runs, or
            # Redis said the lease is gone): another node may resolve the run (or has) while
            # its code would run here. A fence merely due stops it with the others.
            raise BusUnavailable(
                f"node {me.node_id} may have lost its lease while the start of run "
                f"{spec.run_id} was on its way (it stopped its runs): the run was not started; "
                "its record is resolved as its node's"
            )
        state = RunState(
            spec.run_id,
            fields,
            epoch=me.epoch,
            relay=spec.relay,
            max_output_chars=self._max_output_chars,
        )
        handle = self._handle_class(state, self)
        self._runs[spec.run_id] = state
        self._handles[spec.run_id] = handle
        self._empty.clear()
        early = self._early.pop(spec.run_id)
        if early is not None:
            self.deliver(spec.run_id, early)
        return handle

    def finish_run(self, state: RunState, ending: Ending) -> Settling:
        """Queue the run's end (see the module's docstring); the future settles once it is
        recorded, refused, or deferred to the outbox. A run whose code outlived its bus's close
        writes nothing (the close recorded how it stopped; the clients are closed)."""
        if self._lifecycle.phase == "closed":
            log.warning(
                "cancel-bus: run %s ended after its bus closed: the end is not recorded (the "
                "record says how the close stopped it)",
                state.run_id,
            )
            done = Settling(loop=asyncio.get_running_loop())
            done.set_result(None)
            return done
        return self._ends.put((state, ending))

    async def _end(self, ends: list[tuple[RunState, Ending]]) -> list[BaseException | None]:
        """Record a chunk of ends: their relayed output first (one write), then their finishes
        together; an end Redis does not take now waits in the outbox. -> each one's error."""
        with contextlib.suppress(CancelBusError):  # relayed output is best effort; the end is not
            await self._sync.flush([state for state, _ in ends])
        if len(self._outbox):  # Redis is failing: queue behind the others, don't hold the exit
            self._defer(ends, "earlier finishes are waiting for Redis")
            return [None] * len(ends)
        finishes = [self._finish(state, ending) for state, ending in ends]
        self.finishing += len(ends)
        try:
            answers = await self._calls.finish_runs(finishes, timeout=self._lease.patience)
        finally:
            self.finishing -= len(ends)
        errors: list[BaseException | None] = []
        unanswered: list[tuple[RunState, Ending]] = []
        why = ""
        for (state, ending), answer in zip(ends, answers, strict=True):
            error: BaseException | None = None
            try:
                if isinstance(answer, BaseException):
                    raise answer
                self._finished(state, answer)
            except Exception as exc:  # unavailable, refused, or a defect: the outbox retries it
                unanswered.append((state, ending))
                why = str(exc)
            except BaseException as exc:  # a cancellation: given to the run's exit
                error = exc
            errors.append(error)
        if unanswered:
            self._defer(unanswered, why)
        return errors

    async def set_waiting(self, state: RunState, waiting: bool) -> None:
        """Mark the run waiting or running; a cancel pending on it (or that ended it while it
        waited) is delivered and raised."""
        node_id = self._lease.node_id
        if await self._calls.set_waiting(state.run_id, node_id, state.epoch, waiting):
            return
        run = await self._reads.get_run(state.run_id)
        request = run.cancel_request if run is not None else None
        if request is None:
            target = "waiting" if waiting else "running"
            status = run.status.value if run is not None else "gone"
            raise CancelBusError(f"run {state.run_id} cannot become {target}: it is {status}")
        self.deliver(state.run_id, request)
        raise RunCancelled(state.run_id, request)

    def run_changed(self, state: RunState) -> None:
        self._sync.mark(state)

    def run_leaked(self, state: RunState) -> None:
        self._stats.leaks += 1
        self._sync.mark(state)

    # -- internals ----------------------------------------------------------------------------

    def _defer(self, ends: list[tuple[RunState, Ending]], why: str) -> None:
        """Hand ends to the outbox (one log line for the lot: a burst is not a flood of them)."""
        first = ends[0][0].run_id
        more = f" and {len(ends) - 1} more" if len(ends) > 1 else ""
        log.warning("cancel-bus: finish of %s%s deferred: %s", first, more, why)
        self._stats.finishes_deferred += len(ends)
        for state, ending in ends:
            self._outbox.add(state.run_id, functools.partial(self._write_finish, state, ending))

    async def _write_finish(self, state: RunState, ending: Ending) -> None:
        """One run's finish, alone (the outbox's retry)."""
        self.finishing += 1
        try:
            answer = await self._calls.finish_run(self._finish(state, ending), self._lease.patience)
        finally:
            self.finishing -= 1
        self._finished(state, answer)

    def _finish(self, state: RunState, ending: Ending) -> Finish:
        """The run's end as the finish script takes it (the run is marked as finishing)."""
        state.finishing = True
        return Finish(
            run_id=state.run_id,
            node_id=self._lease.identity.node_id,
            epoch=state.epoch,
            status=ending.status,
            stop_cause=state.stop_cause,
            output=state.output.text,
            output_truncated=state.output.truncated,
            error=ending.error[:MAX_ERROR] if ending.error else None,
            phase=state.pending.phase,
            delivered_at=state.delivered_at,
            observed_at=state.observed_at,
            record=state.record,
            notes=state.notes.take(),
        )

    def _traced_end(self, state: RunState) -> None:
        """The cancel's last moments here, in its trace: observed at a checkpoint, recorded."""
        request = state.request
        if request is None or not request.traceparent:
            return
        here = {"cancel_bus.run_id": state.run_id, "cancel_bus.node": self._lease.node_id}
        if state.observed_at is not None:
            tracing.happened("cancel_bus.observe", request.traceparent, here, state.observed_at)
        status = state.final_status.value if state.final_status else ""
        tracing.happened(
            "cancel_bus.finish", request.traceparent, {**here, "cancel_bus.status": status}
        )

    def _finished(self, state: RunState, answer: Finished) -> None:
        """Redis answered the run's finish: it leaves the table."""
        self._runs.pop(state.run_id, None)
        self._handles.pop(state.run_id, None)
        if not self._runs:
            self._empty.set()
        if answer.code is Code.FENCED:
            self._stats.finishes_fenced += 1
            log.warning(
                "cancel-bus: finish of %s refused: its incarnation was fenced", state.run_id
            )
            return
        state.final_status = RunStatus(answer.status)
        self._traced_end(state)


def _shutdown(run_id: str, node_id: str) -> CancelOrder:
    """The cancel a draining node records for a run it still holds."""
    cause = StopCause.NODE_SHUTDOWN
    return CancelOrder(
        run_target(run_id), run_id, None, CancelMode.IMMEDIATE, cause.value, node_id, cause
    )
