"""Local callers waiting for runs to end, resolved by a finish notice or by a re-check.

A notice that arrives before its waiter registered (a session cancel learns the run id only
from Redis's answer) is kept for a short while, so the waiter still finds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ._timed import TimedMap
from ._types import RunInfo

RECENT_SECONDS = 60.0
RECENT_MAX = 10_000


class Waiters:
    """Futures per run id. A future's result is the final record, or ``None`` when the notice
    did not carry it (the waiter then reads it)."""

    def __init__(self) -> None:
        self._futures: dict[str, set[asyncio.Future[RunInfo | None]]] = {}
        self._recent: TimedMap[str, tuple[RunInfo | None]] = TimedMap(RECENT_SECONDS, RECENT_MAX)

    def add(self, run_id: str) -> asyncio.Future[RunInfo | None]:
        future: asyncio.Future[RunInfo | None] = asyncio.get_running_loop().create_future()
        recent = self._recent.get(run_id)
        if recent is not None:
            future.set_result(recent[0])
        else:
            self._futures.setdefault(run_id, set()).add(future)
        return future

    def discard(self, run_id: str, future: asyncio.Future[RunInfo | None]) -> None:
        futures = self._futures.get(run_id)
        if futures is not None:
            futures.discard(future)
            if not futures:
                del self._futures[run_id]

    def resolve(self, run_id: str, run: RunInfo | None) -> None:
        self._recent.put(run_id, (run,))
        for future in self._futures.pop(run_id, ()):
            if not future.done():
                future.set_result(run)

    def forget(self, run_id: str) -> None:
        """Drop a notice found wrong (the run is still active): later waiters wait again."""
        self._recent.pop(run_id)

    async def until_end(
        self,
        run_id: str,
        deadline: float,
        read: Callable[[str], Awaitable[RunInfo | None]],
    ) -> RunInfo | None:
        """The run's final record once it ends, or None if the (loop-time) deadline comes
        first. A notice without the record is checked with ``read``; if the run is still
        active, the wait goes on."""
        remaining = deadline - asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(max(remaining, 0)):
                while True:
                    future = self.add(run_id)
                    try:
                        final = await future
                    finally:
                        self.discard(run_id, future)
                    if final is None:
                        final = await read(run_id)
                    if final is None or not final.is_active:
                        return final
                    self.forget(run_id)
        except TimeoutError:
            return None

    def run_ids(self) -> list[str]:
        return list(self._futures)

    def __len__(self) -> int:
        return sum(len(futures) for futures in self._futures.values())
