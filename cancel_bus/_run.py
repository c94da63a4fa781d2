"""One run on its owner: the public :class:`RunHandle` its code holds, the private
:class:`RunState` the node works on, and the run scope.

The split follows trio's ``CancelScope`` / ``CancelStatus``: what a run's code calls
(checkpoints, phase, output, pause) is on the handle; the token, the cancel timestamps and
what awaits writing are on the state, which only the node's rooms touch. ``checkpoint()`` is the
hot path: one attribute test, no I/O, no lock, no allocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, NoReturn, Protocol

from ._errors import InvalidArgument, RunCancelled, RunEnded
from ._types import CancelMode, CancelRequest, RunInfo, RunStatus, StopCause

log = logging.getLogger("cancel_bus")

RelayEntry = tuple[str, str, str]  # event type, time, data as JSON


class RunOwner(Protocol):
    """What a run needs from its node (implemented by the node's table of live runs)."""

    def clock(self) -> float: ...

    async def start_run(self, spec: RunSpec) -> RunHandle: ...

    def finish_run(self, state: RunState, ending: Ending) -> Awaitable[None]: ...

    async def set_waiting(self, state: RunState, waiting: bool) -> None: ...

    def run_changed(self, state: RunState) -> None: ...

    def run_leaked(self, state: RunState) -> None: ...


# The run whose code is executing (set by its scope, seen by the tasks its code starts): a run
# started there is its child, unless told otherwise — while it has not ended (a scope exited
# from another task cannot reset this task's context).
current_run: ContextVar[RunState | None] = ContextVar("cancel_bus_current_run", default=None)
MAX_LABEL = 200  # characters of a phase or an event type


@dataclass(frozen=True, slots=True)
class RunSpec:
    run_id: str
    session: tuple[str, str, str] | None
    metadata: dict[str, Any] | None
    relay: bool
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class Ending:
    """How a run's code ended, as its scope saw it: the status to record and the error."""

    status: RunStatus
    error: str | None


class RunState:
    """The node's side of one run: the token (a recorded request, or its node's own stop), the
    cancel timestamps, the output, and the updates waiting to be written."""

    __slots__ = (
        "_callbacks",
        "_exiting",
        "_fields",
        "_info",
        "_leak_delta",
        "_leaked",
        "_task",
        "_task_cancel_sent",
        "chunks",
        "closed",
        "delivered_at",
        "delivery_dirty",
        "epoch",
        "final_status",
        "finishing",
        "gaps",
        "gaps_dirty",
        "handle",
        "last_checkpoint",
        "last_site",
        "local_stop",
        "max_output_chars",
        "observed_at",
        "output_size",
        "output_truncated",
        "pending_relay",
        "phase",
        "phase_dirty",
        "relay",
        "request",
        "run_id",
        "stop_at_checkpoint",
    )

    def __init__(
        self,
        run_id: str,
        fields: dict[str, str],
        *,
        epoch: str,
        relay: bool,
        max_output_chars: int,
    ) -> None:
        self.run_id = run_id
        self._fields = fields  # the record as its start left it, parsed on first use
        self._info: RunInfo | None = None
        self.epoch = epoch
        self.relay = relay
        self.max_output_chars = max_output_chars
        self.request: CancelRequest | None = None  # recorded in Redis
        self.local_stop: CancelRequest | None = None  # its node stopped it, nobody asked
        self.stop_at_checkpoint = False
        self.delivered_at: float | None = None
        self.delivery_dirty = False
        self.observed_at: float | None = None
        self.chunks: list[str] = []
        self.output_size = 0
        self.output_truncated = False
        self.pending_relay: list[RelayEntry] = []
        self.phase: str | None = None
        self.phase_dirty = False
        self.final_status: RunStatus | None = None
        self.finishing = False  # its finish has been sent
        self.closed = False  # its scope has exited: what its code does now is a leak
        self.gaps: dict[str, float] = {}  # profiled: the longest stretch after each checkpoint
        self.gaps_dirty = False
        self.last_checkpoint = 0.0  # profiled: when (perf_counter) and where the last one was
        self.last_site: str | None = None
        self.handle: RunHandle | None = None
        self._leak_delta: dict[str, Any] | None = None
        self._leaked = False
        self._task: asyncio.Task[Any] | None = None
        self._task_cancel_sent = False
        self._exiting = False
        self._callbacks: list[Callable[[CancelRequest], None]] = []

    @property
    def info(self) -> RunInfo:
        """The run as recorded when it started here."""
        if self._info is None:
            self._info = RunInfo.from_redis(self._fields)
        return self._info

    @property
    def cancel_requested(self) -> CancelRequest | None:
        return self.request or self.local_stop

    @property
    def stop_cause(self) -> StopCause | None:
        return self.local_stop.cause if self.local_stop is not None else None

    @property
    def output(self) -> str:
        return "".join(self.chunks)

    def deliver(self, request: CancelRequest, at: float) -> bool:
        """Set the token for a recorded request (idempotent; a stronger mode escalates).
        True if anything changed."""
        current = self.request
        if current is None:
            self.request = request
            self.delivered_at = at
            self.delivery_dirty = True
        elif request.mode.strength > current.mode.strength:
            self.request = replace(current, mode=request.mode)
        else:
            return False
        self._arm(self.request)
        return True

    def stop(self, cause: StopCause, at: float) -> None:
        """Stop without a request in Redis: like an ``immediate`` cancel, recorded with its
        cause (``cancelled`` only for a drain, which records its own request)."""
        if self.local_stop is None:
            self.local_stop = CancelRequest(CancelMode.IMMEDIATE, cause.value, None, at, cause)
            self._arm(self.local_stop)

    def add_callback(self, callback: Callable[[CancelRequest], None]) -> None:
        self._callbacks.append(callback)
        if self.cancel_requested is not None:
            callback(self.cancel_requested)

    def observe(self, at: float) -> NoReturn:
        if self.observed_at is None:
            self.observed_at = at
        raise RunCancelled(self.run_id, self.cancel_requested)

    def keep(self, text: str) -> str:
        """Append output within the limit; -> the part kept."""
        room = self.max_output_chars - self.output_size
        if len(text) > room:
            text = text[: max(room, 0)]
            self.output_truncated = True
        if text:
            self.chunks.append(text)
            self.output_size += len(text)
        return text

    def bind_task(self, task: asyncio.Task[Any] | None) -> None:
        """The task an ``immediate`` cancel interrupts: the one that entered the run scope (a
        cancel that came while the run was being registered interrupts it now)."""
        self._task = task
        request = self.cancel_requested
        if request is not None and request.mode is CancelMode.IMMEDIATE:
            self._interrupt()

    def settle(self, exc: BaseException | None, at: float) -> tuple[Ending, bool]:
        """How the run ended, and whether its exception is to be suppressed.

        Our own ``immediate`` cancellation is balanced with ``uncancel()`` and turned into a
        cancel; it is swallowed only if no other cancellation of the task is pending. A
        ``CancelledError`` that is not ours is recorded as a failure and never swallowed."""
        self._exiting = True
        task = self._task
        sent = self._task_cancel_sent and task is not None
        pending = task.uncancel() if sent and task is not None else 0
        if exc is None:
            return Ending(RunStatus.SUCCEEDED, None), False
        if isinstance(exc, RunCancelled) and exc.run_id == self.run_id:
            return Ending(RunStatus.CANCELLED, None), True
        if isinstance(exc, asyncio.CancelledError):
            if sent:  # asked to stop, and stopped; the exception goes on while another
                # cancellation is pending (an enclosing run's in the same task, or a foreign one)
                if self.observed_at is None:
                    self.observed_at = at
                return Ending(RunStatus.CANCELLED, None), pending == 0
            return Ending(RunStatus.FAILED, "interrupted: the asyncio task was cancelled"), False
        return Ending(RunStatus.FAILED, f"{type(exc).__name__}: {exc}"), False

    def record(self) -> dict[str, str]:
        """The run as this node knows it, to re-create a record Redis lost."""
        info = self.info
        record: dict[str, str] = {"status": "running", "created_at": f"{info.created_at:.6f}"}
        if info.started_at is not None:
            record["started_at"] = f"{info.started_at:.6f}"
        if info.app_name is not None and info.user_id is not None and info.session_id is not None:
            record.update(app_name=info.app_name, user_id=info.user_id)
            record["session_id"] = info.session_id
        if info.metadata is not None:
            record["metadata"] = json.dumps(info.metadata, separators=(",", ":"))
        if self.relay:
            record["relay"] = "1"
        if self.phase is not None:
            record["phase"] = self.phase
        if self.request is not None:
            request = self.request
            record["cancel_requested_at"] = f"{request.requested_at:.6f}"
            record["cancel_mode"] = request.mode.value
            record["cancel_cause"] = request.cause.value
            if request.reason:
                record["cancel_reason"] = request.reason
            if request.requested_by:
                record["requested_by"] = request.requested_by
        return record

    def close(self) -> None:
        """Its scope has exited. A profiled run's last stretch counts for its last checkpoint."""
        self.closed = True
        if self.last_site is not None:
            self.note_gap(self.last_site, time.perf_counter() - self.last_checkpoint)

    def leak(self, call: str, site: str, at: float) -> None:
        """Its code called the library after its end (see :class:`RunHandle`)."""
        delta = self._leak_delta
        if delta is None:
            delta = self._leak_delta = {"calls": {}}
            if not self._leaked:
                self._leaked = True
                delta.update(first_call=call, first_site=site, first_at=f"{at:.6f}")
        delta["calls"][call] = delta["calls"].get(call, 0) + 1

    def note_gap(self, site: str, seconds: float) -> None:
        """A profiled run went ``seconds`` from the checkpoint at ``site`` to the next one."""
        worst = self.gaps.get(site, 0.0)
        if seconds > worst:
            self.gaps[site] = seconds
            self.gaps_dirty = self.gaps_dirty or seconds - worst > 0.01

    def take_notes(self) -> str:
        """What is new in the run's notes, as JSON ('' if nothing): leaks, checkpoint gaps."""
        notes: dict[str, Any] = {}
        if self._leak_delta is not None:
            notes["leaked_after_cancel"], self._leak_delta = self._leak_delta, None
        if self.gaps_dirty or (self.closed and self.gaps):
            self.gaps_dirty = False
            slowest = sorted(self.gaps.items(), key=lambda item: item[1], reverse=True)
            notes["slowest_checkpoints"] = {site: round(s * 1000, 1) for site, s in slowest[:10]}
        return json.dumps(notes, separators=(",", ":")) if notes else ""

    def take_updates(self) -> tuple[str, str, list[RelayEntry], str] | None:
        """The phase, delivery time, relay entries and notes not written yet (taken), or
        None."""
        phase = (self.phase or "") if self.phase_dirty else ""
        delivered = ""
        if self.delivery_dirty and self.delivered_at is not None:
            delivered = f"{self.delivered_at:.6f}"
        entries = self.pending_relay
        notes = self.take_notes() if self._leak_delta is not None or self.gaps_dirty else ""
        if not (phase or delivered or entries or notes):
            return None
        self.phase_dirty = self.delivery_dirty = False
        self.pending_relay = []
        return phase, delivered, entries, notes

    def put_back(self, phase: str, delivered: str, entries: list[RelayEntry], notes: str) -> None:
        """Updates that could not be written: again, before any newer ones."""
        self.phase_dirty = self.phase_dirty or bool(phase)
        self.delivery_dirty = self.delivery_dirty or bool(delivered)
        self.pending_relay[:0] = entries
        if notes:
            leak = json.loads(notes).get("leaked_after_cancel")
            if leak is not None:
                delta = self._leak_delta = self._leak_delta or {"calls": {}}
                for key in ("first_call", "first_site", "first_at"):
                    if key in leak:
                        delta.setdefault(key, leak[key])
                for call, n in leak["calls"].items():
                    delta["calls"][call] = delta["calls"].get(call, 0) + n
            self.gaps_dirty = True

    def _arm(self, request: CancelRequest) -> None:
        """Make checkpoints raise (and interrupt the task) as ``request`` asks; tell callbacks."""
        if request.mode is not CancelMode.AFTER_TURN:
            self.stop_at_checkpoint = True
        if request.mode is CancelMode.IMMEDIATE:
            self._interrupt()
        for callback in self._callbacks:
            try:
                callback(request)
            except Exception:
                log.exception("cancel-bus: a cancel callback of run %s failed", self.run_id)

    def _interrupt(self) -> None:
        task = self._task
        if task is None or self._exiting or self._task_cancel_sent or task.done():
            return
        self._task_cancel_sent = True
        task.cancel(msg=f"cancel-bus: run {self.run_id} cancelled (immediate)")


class RunHandle:
    """What the code of a run holds: ``checkpoint()``, ``turn_boundary()``, ``phase``,
    ``emit()``, ``pause()``/``resume()``, and what was asked of it.

    Once the run's scope has exited, what its code still does through the handle is a leak:
    output, events and phases are dropped, a checkpoint that would raise still raises, and each
    call is recorded on the run (``RunInfo.leaked_after_cancel``: counts and the first call's
    site) and counted (``BusStats.leaks``)."""

    __slots__ = ("_owner", "_state")

    def __init__(self, state: RunState, owner: RunOwner) -> None:
        self._state = state
        self._owner = owner
        state.handle = self

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
        return self._state.run_id

    @property
    def info(self) -> RunInfo:
        """The run as recorded when it started here."""
        return self._state.info

    @property
    def app_name(self) -> str | None:
        return self._state.info.app_name

    @property
    def user_id(self) -> str | None:
        return self._state.info.user_id

    @property
    def session_id(self) -> str | None:
        return self._state.info.session_id

    @property
    def session(self) -> tuple[str, str, str] | None:
        info = self._state.info
        if info.app_name is None or info.user_id is None or info.session_id is None:
            return None
        return (info.app_name, info.user_id, info.session_id)

    @property
    def metadata(self) -> dict[str, Any] | None:
        return self._state.info.metadata

    @property
    def created_at(self) -> float:
        return self._state.info.created_at

    @property
    def started_at(self) -> float | None:
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
        kept = self._state.keep(text)
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
        return self._state.output

    @property
    def output_truncated(self) -> bool:
        return self._state.output_truncated

    @property
    def phase(self) -> str | None:
        return self._state.phase

    @phase.setter
    def phase(self, value: str | None) -> None:
        if value is not None and not (isinstance(value, str) and len(value) <= MAX_LABEL):
            raise InvalidArgument(
                f"a run's phase is None or a string of at most {MAX_LABEL} characters"
            )
        state = self._state
        if state.closed:
            self._leaked("phase")
        elif value != state.phase:
            state.phase = value
            state.phase_dirty = True
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
        self._state.leak(call, site, self._owner.clock())
        self._owner.run_leaked(self._state)

    def _relay(self, event_type: str, data: dict[str, Any]) -> None:
        at = f"{self._owner.clock():.6f}"
        try:
            body = json.dumps(data, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidArgument(f"an event's data must be JSON: {exc}") from None
        self._state.pending_relay.append((event_type, at, body))
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
        state, now = self._state, time.perf_counter()
        frame = sys._getframe(2)
        if state.last_site is not None:
            state.note_gap(state.last_site, now - state.last_checkpoint)
            if state.gaps_dirty:
                self._owner.run_changed(state)
        state.last_checkpoint, state.last_site = now, f"{frame.f_code.co_filename}:{frame.f_lineno}"


class RunScope:
    """``async with bus.run(...) as run``: registers on entry, records the end on exit."""

    def __init__(self, owner: RunOwner, spec: RunSpec) -> None:
        self._owner = owner
        self._spec = spec
        self._handle: RunHandle | None = None
        self._current: Token[RunState | None] | None = None

    async def __aenter__(self) -> RunHandle:
        handle = await self._owner.start_run(self._spec)
        handle._state.bind_task(asyncio.current_task())
        if isinstance(handle, ProfiledRunHandle):
            frame = sys._getframe(1)
            state = handle._state
            state.last_checkpoint = time.perf_counter()
            state.last_site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        self._handle = handle
        self._current = current_run.set(handle._state)
        return handle

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
