"""Selector cancels: every active run matching a selector (a dry run only counts them), and —
while a tombstone holds — every matching run started, claimed or queued later, so a user's
"stop everything" also catches a run being started at that moment.

The tombstone is laid *before* the active runs are read: a run started during the read is either
read (and cancelled) or meets the tombstone at its start. Without a hold, the tombstone lasts
only as long as the operation.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from ._calls import ScriptCalls
from ._errors import InvalidArgument
from ._messages import run_target
from ._ports import Canceller
from ._protocol import CancelOrder
from ._reads import Reads
from ._types import CancelMode, SelectorResult, StopCause, Tombstone

OPERATION_HOLD = 60.0  # seconds a tombstone lasts when only the operation needs it


class Selections:
    """Selector cancels and tombstones; each matched run's cancel is the caller side's."""

    def __init__(
        self, calls: ScriptCalls, reads: Reads, caller: Canceller, clock: Callable[[], float]
    ) -> None:
        self._calls = calls
        self._reads = reads
        self._caller = caller
        self._clock = clock

    async def cancel_where(
        self,
        selector: dict[str, Any],
        *,
        dry_run: bool,
        hold: float | None,
        mode: CancelMode,
        reason: str | None,
        requested_by: str | None,
        wait: bool,
        timeout: float,
    ) -> SelectorResult:
        if dry_run:
            run_ids = await self._calls.select_runs(selector)
            return SelectorResult(matched=len(run_ids), run_ids=run_ids, dry_run=True)
        tombstone = await self._lay(selector, hold or OPERATION_HOLD, mode, reason, requested_by)
        try:
            run_ids = await self._calls.select_runs(selector)
            orders = [
                CancelOrder(
                    run_target(run_id), run_id, None, mode, reason, requested_by, StopCause.USER
                )
                for run_id in run_ids
            ]
            results = await asyncio.gather(
                *(self._caller.cancel(order, wait, timeout) for order in orders)
            )
        finally:
            if hold is None:
                await self._calls.remove_tombstone(tombstone.tombstone_id)
        return SelectorResult(
            matched=len(run_ids),
            run_ids=run_ids,
            dry_run=False,
            results=list(results),
            tombstone=tombstone if hold is not None else None,
        )

    async def tombstones(self) -> list[Tombstone]:
        return await self._reads.tombstones()

    async def remove_tombstone(self, tombstone_id: str) -> bool:
        return await self._calls.remove_tombstone(tombstone_id)

    async def _lay(
        self,
        selector: dict[str, Any],
        seconds: float,
        mode: CancelMode,
        reason: str | None,
        requested_by: str | None,
    ) -> Tombstone:
        tombstone_id = os.urandom(8).hex()
        now = self._clock()
        laid = await self._calls.add_tombstone(
            tombstone_id, selector, mode, reason, requested_by, StopCause.USER, seconds
        )
        if not laid:
            raise InvalidArgument("too many tombstones are live: remove some first")
        return Tombstone(
            tombstone_id=tombstone_id,
            selector=selector,
            mode=mode,
            cause=StopCause.USER,
            reason=reason,
            requested_by=requested_by,
            created_at=now,
            expires_at=now + seconds,
        )
