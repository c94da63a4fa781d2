"""The sweep: pub/sub is at-most-once, so after every subscribe confirmation and every
``sweep_interval`` the node delivers every cancel pending on its runs and answers the local
waiters whose run has ended — from the stored state."""

from __future__ import annotations

import logging

from ._duties import Duty
from ._errors import BusUnavailable
from ._ports import Delivery, Identified, Owner
from ._reads import Reads
from ._redis import backoff
from ._types import BusStats
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")


class Sweep:
    def __init__(
        self,
        reads: Reads,
        lease: Identified,
        local: Owner,
        waiters: Waiters,
        stats: BusStats,
        interval: float,
    ) -> None:
        self._reads = reads
        self._lease = lease
        self._local = local
        self._waiters = waiters
        self._stats = stats
        self._interval = interval

    def duty(self) -> Duty:
        return Duty(
            "sweep", self.sweep, lambda: self._interval, backoff(0.1, self._interval), at_once=False
        )

    async def sweep(self) -> None:
        """Deliver every cancel pending on this node's runs; answer local waiters whose run has
        ended — from the stored state."""
        try:
            pending = await self._reads.pending_cancels(self._lease.node_id)
            for run_id, mode in pending.items():
                state = self._local.get(run_id)
                current = state.request if state is not None else None
                if state is None or (current and current.mode.strength >= mode.strength):
                    continue
                run = await self._reads.get_run(run_id)
                request = run.cancel_request if run is not None else None
                delivered = request is not None and self._local.deliver(run_id, request)
                if delivered is Delivery.DELIVERED:
                    self._stats.cancels_recovered_by_sweep += 1
            for run in await self._reads.get_runs(self._waiters.run_ids()):
                if not run.is_active:
                    self._waiters.resolve(run.run_id, run)
        except BusUnavailable as exc:
            log.debug("cancel-bus: sweep skipped: %s", exc)
