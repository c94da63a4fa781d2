"""Owner-side updates of active runs (phase, delivery time, relayed output), off the hot path.

A run marks itself changed (a set insert and an event set); one task writes every changed run in a
single pipeline, and while that write is in flight new changes pile up for the next one. Writes
are serialised by a lock, so a run's final flush before its finish lands after everything it
emitted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ._errors import BusUnavailable, CancelBusError
from ._redis import raise_if_cancelling
from ._run import RunHandle
from ._store import RunStore, SyncItem

log = logging.getLogger("cancel_bus")

MAX_PENDING_RELAY = 10_000


class RunSync:
    def __init__(self, store: RunStore, node_id: Callable[[], str]) -> None:
        self._store = store
        self._node_id = node_id
        self._dirty: dict[str, RunHandle] = {}
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopped = False
        self.relay_dropped = 0

    def mark(self, handle: RunHandle) -> None:
        self._dirty[handle.run_id] = handle
        overflow = len(handle.pending_relay) - MAX_PENDING_RELAY
        if overflow > 0:
            del handle.pending_relay[:overflow]
            self.relay_dropped += overflow
        self._wake.set()

    async def flush(self, handle: RunHandle) -> None:
        """Before a run's finish: write its relayed output, so followers see all of it before the
        end. Its phase and delivery time travel with the finish itself (no round trip)."""
        if not handle.relay:
            handle.phase_dirty = handle.delivery_dirty = False
            return
        self._dirty.pop(handle.run_id, None)
        await self._write([handle])

    def stop(self) -> None:
        """End :meth:`run_forever` at its next turn (even if a cancellation was swallowed)."""
        self._stopped = True
        self._wake.set()

    async def run_forever(self) -> None:
        self._stopped = False  # a bus that failed to start may start again
        while not self._stopped:
            await self._wake.wait()
            self._wake.clear()
            handles = list(self._dirty.values())
            self._dirty.clear()
            try:
                await self._write(handles)
            except CancelBusError as exc:
                raise_if_cancelling()
                log.warning("cancel-bus: run updates not written yet: %s", exc)
                for handle in handles:
                    self._dirty.setdefault(handle.run_id, handle)
                await asyncio.sleep(0.5)
                self._wake.set()

    async def _write(self, handles: list[RunHandle]) -> None:
        async with self._lock:
            taken = [(handle, _take(handle)) for handle in handles]
            by_epoch: dict[str, list[SyncItem]] = {}
            for handle, item in taken:
                if item is not None:
                    by_epoch.setdefault(handle.epoch, []).append(item)
            try:
                for epoch, items in by_epoch.items():
                    await self._store.sync_runs(self._node_id(), epoch, items)
            except BusUnavailable:
                for handle, item in taken:
                    if item is not None:
                        _restore(handle, item)
                raise


def _take(handle: RunHandle) -> SyncItem | None:
    phase = (handle.phase or "") if handle.phase_dirty else ""
    delivered = ""
    if handle.delivery_dirty and handle.delivered_at is not None:
        delivered = f"{handle.delivered_at:.6f}"
    entries = handle.pending_relay
    if not (phase or delivered or entries):
        return None
    handle.phase_dirty = handle.delivery_dirty = False
    handle.pending_relay = []
    return SyncItem(handle.run_id, phase, delivered, entries)


def _restore(handle: RunHandle, item: SyncItem) -> None:
    handle.phase_dirty = handle.phase_dirty or bool(item.phase)
    handle.delivery_dirty = handle.delivery_dirty or bool(item.delivered_at)
    handle.pending_relay[:0] = item.relay_entries
