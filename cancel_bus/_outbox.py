"""Terminal writes that could not land yet, retried until Redis accepts or fences them.

A finish is never silently lost: while Redis cannot take it (unreachable, out of memory, read-only
after a failover, refusing the node's user) the run's end waits here, and the node keeps
heartbeating it as an active run. Every retry sends all of them at once. A write that fails for
another reason (a defect) is kept and retried too: dropping it would leave its run recorded
active for good. The log says when writes start waiting, when the reason changes, and when they
are through.
"""

from __future__ import annotations

import asyncio
import math

from ._duties import Duty, raise_if_cancelling
from ._errors import BusUnavailable, CancelBusError
from ._ports import Write
from ._redis import backoff


class Outbox:
    def __init__(self, retry_interval: float = 0.5, max_interval: float = 5.0) -> None:
        self._pending: dict[str, Write] = {}
        self.wake = asyncio.Event()  # a write to try (now, not at the next retry)
        self._backoff = backoff(retry_interval, max_interval)

    def add(self, run_id: str, write: Write) -> None:
        self._pending[run_id] = write
        self.wake.set()

    def retry_now(self) -> None:
        """Redis answers again: end the wait before the next retry."""
        if self._pending:
            self.wake.set()

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def duty(self) -> Duty:
        """Woken by a write added (or Redis answering again); retried after a backoff until
        none is left. Its trouble (the duty's log) says when writes start waiting, why, and
        when they are through."""
        return Duty("terminal writes", self.flush, lambda: math.inf, self._backoff, self.wake)

    async def flush(self) -> None:
        """Try every pending write once, all together (their calls leave in batches). Raises what
        kept one (or more) waiting: :class:`BusUnavailable`, or a defect."""
        pending = list(self._pending.items())
        results = await asyncio.gather(*(write() for _, write in pending), return_exceptions=True)
        raise_if_cancelling()
        failed: BaseException | None = None
        for (run_id, write), result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):  # kept: dropping it would leave it active
                failed = failed or result
                example = run_id
            elif self._pending.get(run_id) is write:
                del self._pending[run_id]
        if failed is not None:
            what = f"{len(self._pending)} waiting, e.g. {example}: {failed}"
            if isinstance(failed, BusUnavailable):
                raise BusUnavailable(what, failed.code) from failed
            raise CancelBusError(what) from failed
