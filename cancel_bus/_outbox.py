"""Terminal writes that could not land yet, retried until Redis accepts or fences them.

A finish is never silently lost: while Redis is unreachable the run's end waits here, and the
node keeps heartbeating it as an active run. Every retry sends all of them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ._errors import BusUnavailable
from ._redis import raise_if_cancelling

log = logging.getLogger("cancel_bus")

Write = Callable[[], Awaitable[None]]


class Outbox:
    def __init__(self, retry_interval: float = 0.5, max_interval: float = 5.0) -> None:
        self._pending: dict[str, Write] = {}
        self._wake = asyncio.Event()
        self._retry = asyncio.Event()
        self._retry_interval = retry_interval
        self._max_interval = max_interval
        self._stopped = False

    def add(self, run_id: str, write: Write) -> None:
        self._pending[run_id] = write
        self._wake.set()

    def retry_now(self) -> None:
        """Redis answers again: end the wait before the next retry."""
        if self._pending:
            self._retry.set()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    async def flush(self) -> bool:
        """Try every pending write once, all together (the store batches them); True if none is
        left."""
        pending = list(self._pending.items())
        results = await asyncio.gather(*(write() for _, write in pending), return_exceptions=True)
        raise_if_cancelling()
        for (run_id, write), result in zip(pending, results, strict=True):
            if isinstance(result, BusUnavailable):
                continue  # still waiting for Redis
            if isinstance(result, BaseException):  # not a transient failure: retrying won't help
                log.error("cancel-bus: terminal write of %s dropped: %r", run_id, result)
            if self._pending.get(run_id) is write:
                del self._pending[run_id]
        return not self._pending

    def stop(self) -> None:
        """End :meth:`run_forever` at its next turn (even if a cancellation was swallowed)."""
        self._stopped = True
        self._wake.set()

    async def run_forever(self) -> None:
        self._stopped = False  # a bus that failed to start may start again
        interval = self._retry_interval
        while not self._stopped:
            raise_if_cancelling()  # a cancellation redis-py swallowed ends the loop too
            await self._wake.wait()
            if await self.flush():
                self._wake.clear()
                interval = self._retry_interval
                continue
            log.warning("cancel-bus: %d terminal write(s) waiting for Redis", len(self._pending))
            self._retry.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._retry.wait(), interval)
            interval = min(interval * 2, self._max_interval)
