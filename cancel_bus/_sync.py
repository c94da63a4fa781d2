"""Owner-side updates of active runs (phase, delivery time, relayed output), off the hot path.

A run marks itself changed (a dict insert and an event set); one task writes every changed run in
a single script call, and while that write is in flight new changes pile up for the next one. A
delivery time lingers a moment first: the run's finish, if it comes sooner, carries it.
Writes are serialised by a lock, so a run's final flush before its finish lands after everything
it emitted.
"""

from __future__ import annotations

import asyncio
import math

from ._calls import ScriptCalls
from ._duties import Duty
from ._errors import BusUnavailable, CancelBusError
from ._ports import Identified
from ._protocol import SyncItem
from ._redis import backoff
from ._run_state import RunState
from ._types import BusStats

MAX_PENDING_RELAY = 10_000
DELIVERY_LINGER = 0.1  # seconds a delivery time waits for the run's finish to carry it


class RunSync:
    def __init__(self, calls: ScriptCalls, lease: Identified, stats: BusStats) -> None:
        self._calls = calls
        self._lease = lease
        self._stats = stats
        self._dirty: dict[str, RunState] = {}
        self.wake = asyncio.Event()  # a run changed
        self._linger: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()

    def mark(self, state: RunState) -> None:
        self._dirty[state.run_id] = state
        overflow = len(state.pending.relay) - MAX_PENDING_RELAY
        if overflow > 0:
            del state.pending.relay[:overflow]
            self._stats.relay_dropped += overflow
        self.wake.set()

    def mark_delivered(self, state: RunState) -> None:
        """A cancel reached the run: its delivery time is written within
        :data:`DELIVERY_LINGER`, unless the run's finish carries it first (most runs stop at
        their next checkpoint: one round trip, not two)."""
        self._dirty[state.run_id] = state
        if self._linger is None and not self.wake.is_set():
            self._linger = asyncio.get_running_loop().call_later(DELIVERY_LINGER, self.wake.set)

    async def flush(self, states: list[RunState]) -> None:
        """Before runs' finishes: write their relayed output (one write for all), so followers
        see all of it before the end. Their phase and delivery time travel with the finish
        itself (no round trip)."""
        relayed = []
        for state in states:
            if state.relay:
                self._dirty.pop(state.run_id, None)
                relayed.append(state)
            else:
                state.pending.clear()
        if relayed:
            await self._write(relayed)

    def duty(self) -> Duty:
        """Woken by a run that changed; a write that failed is tried again after a backoff."""
        return Duty("run updates", self.turn, lambda: math.inf, backoff(0.1, 2.0), self.wake)

    async def turn(self) -> None:
        """Write every changed run (those whose write fails stay changed, for the next turn)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        states = list(self._dirty.values())
        self._dirty.clear()
        try:
            await self._write(states)
        except CancelBusError:
            for state in states:
                self._dirty.setdefault(state.run_id, state)
            raise

    async def _write(self, states: list[RunState]) -> None:
        async with self._lock:
            taken = [(state, state.take_updates()) for state in states]
            by_epoch: dict[str, list[SyncItem]] = {}
            for state, updates in taken:
                if updates is not None:
                    by_epoch.setdefault(state.epoch, []).append(SyncItem(state.run_id, *updates))
            try:
                for epoch, items in by_epoch.items():
                    await self._calls.sync_runs(self._lease.node_id, epoch, items)
            except BusUnavailable:
                for state, updates in taken:
                    if updates is not None:
                        state.put_back(*updates)
                raise
