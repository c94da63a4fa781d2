"""The path proves itself: every probe interval the node sends a probe to its own channel,
through Redis. One that has not come back by the next is a failure: the node is not ready
(``problem``), whatever its connection looks like — a subscriber on the wrong server, a
subscription silently gone."""

from __future__ import annotations

import logging
import os
import time

from ._duties import Duty
from ._errors import BusUnavailable
from ._notices import Notices
from ._ports import Identified
from ._redis import backoff
from ._types import BusStats

log = logging.getLogger("cancel_bus")


class ChannelProbe:
    def __init__(self, notices: Notices, lease: Identified, stats: BusStats) -> None:
        self._notices = notices
        self._lease = lease
        self._stats = stats
        self.interval = min(5.0, lease.patience)
        self._probe: tuple[str, float] | None = None  # (nonce, sent at: monotonic) on its way
        self.probe_back: tuple[float, float] | None = None  # (server time, latency s) of the last
        self.probes_back = 0
        self._failed_at: float | None = None

    @property
    def problem(self) -> str | None:
        """Why this node's channel cannot be trusted now, or None."""
        if self._failed_at is None:
            return None
        return (
            "its own channel is silent: a probe sent through Redis did not come back "
            f"within {self.interval:.1f} s"
        )

    def duty(self) -> Duty:
        return Duty("probe", self.probe, lambda: self.interval, backoff(0.1, 5.0))

    async def probe(self) -> None:
        """Judge the previous probe (back, or failed), send the next."""
        if self._probe is not None:  # not back within an interval
            self._stats.probes_failed += 1
            first = self._failed_at is None
            self._failed_at = time.monotonic()
            if first:
                log.error("cancel-bus: node %s: %s", self._lease.node_id, self.problem)
        nonce = os.urandom(8).hex()
        self._probe = (nonce, time.monotonic())
        try:
            me = self._lease.identity
            receivers = await self._notices.probe(me.node_id, me.epoch, nonce)
        except BusUnavailable as exc:
            log.debug("cancel-bus: probe not sent: %s", exc)
            self._probe = None  # Redis is away: the lease says so; this proves nothing
            return
        if receivers == 0:
            log.warning("cancel-bus: node %s: nobody subscribes its channel", self._lease.node_id)

    def came_back(self, nonce: str) -> None:
        """A probe reached this node through its channel."""
        probe = self._probe
        if probe is None or probe[0] != nonce:
            return
        latency = time.monotonic() - probe[1]
        self.probes_back += 1
        self._probe = None
        self._failed_at = None
        self.probe_back = (self._lease.clock(), latency)
