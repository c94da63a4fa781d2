"""One owner of a node's background work: every duty listed in one place, one task group.

A node's loops are :class:`Duty` values declared once (``_node.py``), each with its period and
its backoff (redis-py's backoff classes): the heartbeat, the subscription, the probe, the sweep,
the outbox, the run updates, the server check. A duty runs turn after turn: a turn returns how
long until the next (or ``None``: its period; its ``wake`` event cuts the rest short); a turn that
raises is logged once per change of state (:class:`Trouble`) and tried again after its backoff,
counted from when the failed turn began (a turn that waited out a timeout has rested already) —
background work outlives its errors. One-off work — a rejoin, a batch of script calls on its
way, a chunk of run ends — is spawned into the same group.

Everything runs under one ``asyncio.TaskGroup`` held by one task. :meth:`Duties.stop` cancels
it; the group cancels every task and waits for them, and the whole stop is bounded: a task that
does not stop in time (a cancellation swallowed below cancel-bus) is named in one line, and the
stop returns. Each turn also checks whether its task is being cancelled, so a cancellation
redis-py swallowed still ends the duty at its next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from ._errors import BusClosed
from ._trouble import Trouble, kind_of

log = logging.getLogger("cancel_bus")

STOP_SECONDS = 3.0  # the bound of a stop
Spawn = Callable[[str, Coroutine[Any, Any, None]], "asyncio.Task[None]"]  # Duties.spawn


class Backoff(Protocol):
    """How long to rest after failures in a row (``_redis.backoff()``: redis-py's classes)."""

    def compute(self, failures: int) -> float: ...


def raise_if_cancelling() -> None:
    """For a loop that carries on after errors: stop if the task is being cancelled. A library
    may surface a cancellation as an error (a timeout context that saw it); going on would make
    the task impossible to cancel."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(frozen=True)
class Duty:
    """A loop of the node: ``turn`` every ``period()`` seconds, or when ``wake`` is set."""

    name: str
    turn: Callable[[], Awaitable[float | None]]  # -> seconds until the next turn (None: period)
    period: Callable[[], float]
    backoff: Backoff  # between the starts of failed turns (by the count of failures in a row)
    wake: asyncio.Event | None = None
    at_once: bool = True  # the first turn at once, else after a period


class Duties:
    def __init__(self) -> None:
        self._group: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._declared: list[Duty] = []
        self._names: dict[asyncio.Task[Any], str] = {}

    @property
    def running(self) -> bool:
        return self._group is not None

    def add(self, duty: Duty) -> None:
        """Run ``duty`` from now on (or from :meth:`start`)."""
        self._declared.append(duty)
        if self._group is not None:
            self._spawn_in(self._group, duty.name, self._keep(duty))

    def spawn(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """One-off work in the group (:class:`BusClosed` once stopped: ``work`` is closed)."""
        if self._group is None:
            work.close()
            raise BusClosed("the bus's background work is stopped")
        return self._spawn_in(self._group, name, work)

    async def start(self) -> None:
        """Start the group, and every duty declared so far."""
        if self._runner is not None:
            return
        self._ready.clear()
        self._runner = asyncio.create_task(self._run(), name="cancel-bus duties")
        await self._ready.wait()

    async def stop(self, bound: float = STOP_SECONDS) -> None:
        """Cancel everything, and wait for it within ``bound`` seconds."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._group = None  # nothing more is spawned
        runner.cancel()
        done, _ = await asyncio.wait({runner}, timeout=bound)
        if not done:
            stuck = sorted(name for task, name in self._names.items() if not task.done())
            log.error(
                "cancel-bus: background work did not stop within %.1f s, left behind: %s",
                bound,
                ", ".join(stuck) or "the group",
            )
        self._group = None
        self._declared.clear()

    async def _run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for duty in self._declared:
                    self._spawn_in(group, duty.name, self._keep(duty))
                self._ready.set()
                await asyncio.Future()  # until cancelled by stop()
        finally:
            self._group = None
            self._ready.set()

    def _spawn_in(
        self, group: asyncio.TaskGroup, name: str, work: Coroutine[Any, Any, None]
    ) -> asyncio.Task[None]:
        guarded = _guarded(name, work)
        try:
            task = group.create_task(guarded, name=f"cancel-bus {name}")
        except RuntimeError:  # the group is shutting down
            guarded.close()
            work.close()
            raise BusClosed("the bus's background work is stopping") from None
        self._names[task] = name
        task.add_done_callback(self._names.pop)
        return task

    async def _keep(self, duty: Duty) -> None:
        trouble = Trouble(duty.name)
        failures = 0
        rest = 0.0 if duty.at_once else duty.period()
        while True:
            await _rest(rest, duty.wake)
            began = time.monotonic()
            try:
                due = await duty.turn()
            except Exception as exc:  # a duty outlives its errors
                raise_if_cancelling()
                failures += 1
                trouble.failing(kind_of(exc), str(exc) or repr(exc))
                rest = duty.backoff.compute(failures) - (time.monotonic() - began)
                continue
            if failures:
                failures = 0
                trouble.over()
            rest = duty.period() if due is None else due


async def _rest(seconds: float, wake: asyncio.Event | None) -> None:
    """Sleep ``seconds`` (``inf``: for good), or until ``wake`` is set (then it is cleared).
    A cancellation redis-py swallowed in the turn before ends the duty here, not a rest later."""
    raise_if_cancelling()
    if wake is None:
        await asyncio.sleep(seconds)
        return
    if not wake.is_set() and seconds > 0:
        timeout = None if math.isinf(seconds) else seconds
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout)
    wake.clear()


async def _guarded(name: str, work: Awaitable[None]) -> None:
    """One-off work never takes the group down: its error is logged (cancellation passes)."""
    try:
        await work
    except Exception:
        log.exception("cancel-bus: background work %s failed", name)
