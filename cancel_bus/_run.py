"""One run on its owner: the public :class:`RunHandle` its code holds over the private
:class:`~._run_state.RunState` the node works on, and the run scope.

The split follows trio's ``CancelScope`` / ``CancelStatus``: what a run's code calls
(checkpoints, phase, output, pause) is on the handle; the token, the cancel timestamps and
what awaits writing are on the state, which only the node's rooms touch. ``checkpoint()`` is the
hot path: one attribute test, no I/O, no lock, no allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from contextvars import Token
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Protocol

from ._errors import CancelBusError, InvalidArgument, Queued, RunEnded, SessionBusy
from ._run_state import Ending, RunCancelled, RunState, current_run
from ._types import CancelMode, CancelRequest, MultitaskStrategy, RunInfo, RunStatus, StopCause


class RunOwner(Protocol):
    """What a run needs from its node (implemented by the node's table of live runs)."""

    def clock(self) -> float: ...

    async def start_run(self, spec: RunSpec) -> RunHandle: ...

    def finish_run(self, state: RunState, ending: Ending) -> Awaitable[None]: ...

    async def set_waiting(self, state: RunState, waiting: bool) -> None: ...

    def run_changed(self, state: RunState) -> None: ...

    def run_leaked(self, state: RunState) -> None: ...


MAX_LABEL = 200  # characters of a phase or an event type


@dataclass(frozen=True, slots=True)
class RunSpec:
    """A run to start, checked: its id, session key, metadata, relay, parent, and what it does
    to its session's active run (``strategy``, the cancel's ``interrupt_mode``, and how long
    it waits for that run's end: ``interrupt_timeout``); ``on_queued`` is told the run's record
    once it waits in the session's queue (strategy ``enqueue``); ``interrupted``: the run of
    its session it interrupted to start (recorded on it)."""

    run_id: str
    session: tuple[str, str, str] | None
    metadata: dict[str, Any] | None
    relay: bool
    parent: str | None = None
    strategy: MultitaskStrategy = MultitaskStrategy.REJECT
    interrupt_mode: CancelMode = CancelMode.CHECKPOINT
    interrupt_timeout: float = 10.0
    on_queued: Callable[[RunInfo], object] | None = None
    interrupted: str | None = None


class Interrupter(Protocol):
    """Who deals with a session's active run for a new one (the caller side): stops it, or
    waits for its end in the session's queue."""

    async def interrupt(self, holder: str, spec: RunSpec, timeout: float) -> RunInfo | None: ...

    async def await_turn(self, run_id: str, holder: str) -> None:
        """Return once ``holder`` or the queued ``run_id`` itself has ended (or a while has
        passed: the start is then tried again)."""

    async def withdraw(self, run_id: str) -> None:
        """The queued ``run_id`` will not start here: record it cancelled, best effort."""

    async def record_of(self, run_id: str) -> RunInfo | None:
        """The run as it stands (the one a queued run interrupted, read when it starts)."""


class RunHandle:
    """What the code of a run holds: ``checkpoint()``, ``turn_boundary()``, ``phase``,
    ``emit()``, ``pause()``/``resume()``, and what was asked of it.

    Once the run's scope has exited, what its code still does through the handle is a leak:
    output, events and phases are dropped, a checkpoint that would raise still raises, and each
    call is recorded on the run (``RunInfo.leaked_after_cancel``: counts and the first call's
    site) and counted (``BusStats.leaks``)."""

    __slots__ = ("_interrupted", "_owner", "_state")

    def __init__(self, state: RunState, owner: RunOwner) -> None:
        self._state = state
        self._owner = owner
        self._interrupted: RunInfo | None = None

    def checkpoint(self) -> None:
        """Raise :class:`RunCancelled` if a cancel (other than ``after_turn``) was delivered."""
        if self._state.stop_at_checkpoint:
            self._stop("checkpoint")

    def turn_boundary(self) -> None:
        """Like :meth:`checkpoint`, and also honours ``after_turn`` requests."""
        if self._state.cancel_requested is not None:
            self._stop("turn_boundary")

    def report_leak(self, what: str) -> None:
        """For adapters: the framework did ``what`` for this run after its end (an event, a
        token, a tool call). Recorded like the handle's own leaks."""
        self._leaked(what, depth=2)

    @property
    def cancel_requested(self) -> CancelRequest | None:
        """Why the run must stop: the recorded request, else its node's own stop (see
        :attr:`CancelRequest.cause`); None while it may go on."""
        return self._state.cancel_requested

    @property
    def stop_cause(self) -> StopCause | None:
        """Why its node stopped the run without a request (lease lost, Redis unreachable,
        drain), if it did."""
        return self._state.stop_cause

    def add_cancel_callback(self, callback: Callable[[CancelRequest], None]) -> None:
        """Call ``callback(request)`` when a cancel reaches this run, and again when a stronger
        mode escalates it (at once if one already has). For adapters that must react at once,
        e.g. by handing the cancel to a framework; it runs in the node's listener: be quick."""
        self._state.add_callback(callback)

    @property
    def run_id(self) -> str:
        """The run's id (unique in the namespace)."""
        return self._state.run_id

    @property
    def info(self) -> RunInfo:
        """The run as recorded when it started here."""
        return self._state.info

    @property
    def interrupted(self) -> RunInfo | None:
        """The run of the session this one interrupted to start (``multitask_strategy``
        ``interrupt`` or ``rollback``), as it ended: its id, and its output to go on from (none
        after a rollback); ``None`` if it interrupted nothing."""
        return self._interrupted

    @property
    def app_name(self) -> str | None:
        """The session's app, if the run has a session."""
        return self._state.info.app_name

    @property
    def user_id(self) -> str | None:
        """The session's user, if the run has a session."""
        return self._state.info.user_id

    @property
    def session_id(self) -> str | None:
        """The session's id, if the run has a session."""
        return self._state.info.session_id

    @property
    def session(self) -> tuple[str, str, str] | None:
        """``(app_name, user_id, session_id)``, or ``None`` for a run without a session."""
        return self._state.session

    @property
    def metadata(self) -> dict[str, Any] | None:
        """What the run was started with to describe itself (JSON)."""
        return self._state.info.metadata

    @property
    def created_at(self) -> float:
        """When the run was recorded (server clock)."""
        return self._state.info.created_at

    @property
    def started_at(self) -> float | None:
        """When the run started running (server clock); ``None`` while queued."""
        return self._state.info.started_at

    @property
    def final_status(self) -> RunStatus | None:
        """The status recorded once the run scope has exited (None before, or if fenced)."""
        return self._state.final_status

    def emit(self, text: str) -> None:
        """Append output; it is kept as partial output if the run is cancelled."""
        if not isinstance(text, str):
            raise InvalidArgument(f"emit takes a string, not {type(text).__name__}")
        if self._state.closed:
            self._leaked("emit")
            return
        kept = self._state.output.keep(text)
        if kept and self._state.relay:
            self._relay("output", {"text": kept})

    def emit_event(self, event_type: str, data: dict[str, Any]) -> None:
        """Relay an application event (a tool call, a tool result...) to followers of the run."""
        if not (isinstance(event_type, str) and 0 < len(event_type) <= MAX_LABEL):
            raise InvalidArgument(f"an event type is a string of 1 to {MAX_LABEL} characters")
        if not isinstance(data, dict):
            raise InvalidArgument(f"an event's data is a dict, not {type(data).__name__}")
        if self._state.closed:
            self._leaked("emit_event")
        elif self._state.relay:
            self._relay(event_type, data)

    @property
    def output(self) -> str:
        """What the run emitted so far (up to its output limit)."""
        return self._state.output.text

    @property
    def output_truncated(self) -> bool:
        """True once the output passed its limit and was cut."""
        return self._state.output.truncated

    @property
    def phase(self) -> str | None:
        """A short label of what the run is doing now; set it to tell the cluster."""
        return self._state.pending.phase

    @phase.setter
    def phase(self, value: str | None) -> None:
        if value is not None and not (isinstance(value, str) and len(value) <= MAX_LABEL):
            raise InvalidArgument(
                f"a run's phase is None or a string of at most {MAX_LABEL} characters"
            )
        state = self._state
        if state.closed:
            self._leaked("phase")
        elif value != state.pending.phase:
            state.pending.phase = value
            state.pending.phase_dirty = True
            self._owner.run_changed(state)

    async def pause(self) -> None:
        """Hand control back (status ``waiting``, e.g. awaiting a human). While waiting, a cancel
        ends the run at once; raises :class:`RunCancelled` if a cancel is already pending."""
        if self._state.closed:
            self._leaked("pause")
            raise RunEnded(self.run_id)
        self.checkpoint()
        await self._owner.set_waiting(self._state, True)

    async def resume(self) -> None:
        """Back to ``running``; raises :class:`RunCancelled` if it was cancelled while waiting."""
        if self._state.closed:
            self._leaked("resume")
            raise RunEnded(self.run_id)
        await self._owner.set_waiting(self._state, False)
        self.turn_boundary()

    def _stop(self, call: str) -> None:
        """A checkpoint that raises (after the run's end, a leak too)."""
        if self._state.closed:
            self._leaked(call, depth=3)
        self._state.observe(self._owner.clock())

    def _leaked(self, call: str, depth: int = 2) -> None:
        """Record a leak: ``call`` made by the frame ``depth`` levels up (the run's code)."""
        frame = sys._getframe(depth)
        site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        self._state.notes.leak(call, site, self._owner.clock())
        self._owner.run_leaked(self._state)

    def _relay(self, event_type: str, data: dict[str, Any]) -> None:
        at = f"{self._owner.clock():.6f}"
        try:
            body = json.dumps(data, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidArgument(f"an event's data must be JSON: {exc}") from None
        self._state.pending.relay.append((event_type, at, body))
        self._owner.run_changed(self._state)


class ProfiledRunHandle(RunHandle):
    """A handle that also records, per code site, the longest stretch from a checkpoint there
    to the next one: where the run cannot be cancelled promptly (``slowest_checkpoints``). The
    stretch before the first checkpoint counts for the site that entered the run."""

    __slots__ = ()

    def checkpoint(self) -> None:
        self._note_gap()
        super().checkpoint()

    def turn_boundary(self) -> None:
        self._note_gap()
        super().turn_boundary()

    def _note_gap(self) -> None:
        frame = sys._getframe(2)
        notes = self._state.notes
        notes.checkpoint_at(f"{frame.f_code.co_filename}:{frame.f_lineno}")
        if notes.dirty:
            self._owner.run_changed(self._state)


class RunScope:
    """``async with bus.run(...) as run``: registers on entry, records the end on exit."""

    def __init__(
        self, owner: RunOwner, spec: RunSpec, interrupter: Interrupter | None = None
    ) -> None:
        self._owner = owner
        self._spec = spec
        self._interrupter = interrupter
        self._handle: RunHandle | None = None
        self._current: Token[RunState | None] | None = None

    async def __aenter__(self) -> RunHandle:
        handle = await self._start()
        handle._state.bind_task(asyncio.current_task())
        if isinstance(handle, ProfiledRunHandle):
            frame = sys._getframe(1)
            notes = handle._state.notes
            notes.last_checkpoint = time.perf_counter()
            notes.last_site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        self._handle = handle
        self._current = current_run.set(handle._state)
        await self._read_interrupted(handle)
        return handle

    async def _start(self) -> RunHandle:
        """Start the run; a busy session's active run is interrupted first if the strategy
        says so (again, if another run took the session meanwhile), within its timeout — or
        waited for in the session's queue, for as long as it takes."""
        spec = self._spec
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.interrupt_timeout
        interrupted: RunInfo | None = None
        queued = False
        while True:
            try:
                handle = await self._owner.start_run(spec)
            except Queued as waiting:
                told, queued = queued, True
                await self._wait_turn(waiting, tell=not told)
                continue
            except SessionBusy as busy:
                left = deadline - loop.time()
                if spec.strategy is MultitaskStrategy.REJECT or not self._interrupter or left <= 0:
                    raise
                ended = await self._interrupter.interrupt(busy.active_run_id, spec, left)
                interrupted = ended or interrupted
                if interrupted is not None:
                    spec = replace(spec, interrupted=interrupted.run_id)
                continue
            except RunCancelled:
                raise  # it must not start (cancelled while it waited its turn: recorded so)
            except BaseException:
                if queued:
                    await self._withdraw()
                raise
            handle._interrupted = interrupted
            return handle

    async def _read_interrupted(self, handle: RunHandle) -> None:
        """A queued run that ``enqueue`` recorded after interrupting another: that run, read
        once the scope holds the run (a failed read leaves ``interrupted`` None; a cancelled
        one ends the run as its task did)."""
        recorded = handle._state.info.interrupted
        if handle._interrupted is not None or recorded is None or self._interrupter is None:
            return
        try:
            handle._interrupted = await self._interrupter.record_of(recorded)
        except CancelBusError:
            pass
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise

    async def _wait_turn(self, waiting: Queued, tell: bool) -> None:
        """Wait in the session's queue for its active run to end (first, with ``tell``, the
        spec's ``on_queued`` hears of it); a queued run that stops waiting (its task cancelled,
        Redis away, the bus closing, ``on_queued`` raising) is withdrawn from the queue."""
        assert self._interrupter is not None
        try:
            if tell and self._spec.on_queued is not None:
                self._spec.on_queued(RunInfo.from_redis(waiting.record))
            await self._interrupter.await_turn(self._spec.run_id, waiting.active_run_id)
        except BaseException:
            await self._withdraw()
            raise

    async def _withdraw(self) -> None:
        assert self._interrupter is not None
        await asyncio.shield(self._interrupter.withdraw(self._spec.run_id))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        handle = self._handle
        assert handle is not None and self._current is not None, "the run scope was not entered"
        with contextlib.suppress(ValueError):  # exited from another context (a generator the
            current_run.reset(self._current)  # GC closed): that context's run is not ours
        state = handle._state
        ending, suppress = state.settle(exc, self._owner.clock())
        state.close()
        # a cancellation of this wait is delivered once the end is recorded (or handed to the
        # outbox): when the run's task is over, so is the run
        await self._owner.finish_run(state, ending)
        return suppress
