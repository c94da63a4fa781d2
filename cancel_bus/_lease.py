"""A node's lease: registration, heartbeat, the server-clock estimate, fencing and reaping.

The lease is renewed every ``lease_ttl / 3``. A node that could not renew for a whole
``lease_ttl`` (counted from when its last successful heartbeat was *sent*, so never later than
Redis's own view) treats itself as fenced before anyone tells it: it stops its runs and rejoins
as a new incarnation. Redis fences it too: every owner write checks the lease and the epoch.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from typing import Protocol

from ._errors import BusUnavailable, Fenced, NodeIdInUse
from ._redis import raise_if_cancelling
from ._store import RunStore

log = logging.getLogger("cancel_bus")

REAP_BUDGET = 500


class LeaseHolder(Protocol):
    async def lease_renewed(self, recorded_runs: int) -> None: ...

    async def lease_lost(self, why: str) -> None: ...

    async def lease_missing(self) -> None: ...

    def count_reaped(self, runs: int, nodes: int) -> None: ...


class Lease:
    def __init__(
        self,
        store: RunStore,
        *,
        lease_ttl: float,
        version: str,
        auth: Callable[[], str],
        holder: LeaseHolder,
    ) -> None:
        self._store = store
        self.lease_ttl = lease_ttl
        self._version = version
        self._auth = auth
        self._holder = holder
        self.node_id = ""
        self.epoch = ""
        self.offset = 0.0
        self.valid = False
        self._last_renewed = 0.0
        self._stopped = False

    @property
    def interval(self) -> float:
        return self.lease_ttl / 3

    def clock(self) -> float:
        """Now, on the Redis server clock (estimated from the heartbeats)."""
        return time.time() + self.offset

    async def register(self, node_id: str, restore: bool = False) -> None:
        """Take the lease for ``node_id``: a new incarnation (a fresh random epoch), or, with
        ``restore``, this incarnation again after Redis forgot it (:class:`Fenced` if Redis
        still knows it: then it was fenced). Waits out an expired incarnation of the same id;
        refuses a live one (:class:`NodeIdInUse`)."""
        epoch = self.epoch if restore else secrets.token_hex(8)
        give_up = time.monotonic() + self.lease_ttl + 2.0
        while True:
            sent, local_sent = time.monotonic(), time.time()
            try:  # bounded: a late answer would date the lease from a stale send time
                async with asyncio.timeout(self.interval):
                    code, server_now = await self._store.register_node(
                        node_id, self.lease_ttl, self._version, self._auth(), epoch, restore
                    )
            except TimeoutError:
                raise BusUnavailable("no answer from Redis to the node registration") from None
            if code == "ok":
                self.node_id, self.epoch, self.valid = node_id, epoch, True
                self._renewed(sent, local_sent, server_now)
                return
            if code == "fenced":
                raise Fenced(f"node {node_id} was fenced while Redis forgot it")
            if code == "in_use":
                if time.monotonic() > give_up:
                    raise NodeIdInUse(node_id)
                await asyncio.sleep(min(1.0, self.interval))

    def stop(self) -> None:
        """End :meth:`run_forever` at its next turn (even if a cancellation was swallowed)."""
        self._stopped = True

    async def run_forever(self) -> None:
        self._stopped = False  # a bus that failed to start may start again
        while not self._stopped:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
            except Exception:  # the heartbeat must outlive any failure
                raise_if_cancelling()
                log.exception("cancel-bus: heartbeat of %s failed", self.node_id)

    async def beat(self) -> None:
        """One heartbeat, then reap expired nodes. Reports loss or amnesia to the holder."""
        if self.valid and time.monotonic() - self._last_renewed > self.lease_ttl:
            self.valid = False
            await self._holder.lease_lost("no successful heartbeat for a whole lease")
            return
        if not self.valid:
            return
        sent, local_sent = time.monotonic(), time.time()
        try:
            async with asyncio.timeout(self.interval):
                code, server_now, recorded = await self._store.heartbeat(
                    self.node_id, self.epoch, self.lease_ttl
                )
        except (BusUnavailable, TimeoutError) as exc:
            log.warning("cancel-bus: heartbeat of %s failed: %s", self.node_id, exc)
            return
        if code == "fenced":
            self.valid = False
            await self._holder.lease_lost("Redis says the lease expired")
        elif code == "missing":
            await self._holder.lease_missing()
        else:
            self._renewed(sent, local_sent, server_now)
            await self._holder.lease_renewed(recorded)
            await self.reap()

    async def reap(self) -> None:
        """Resolve the runs of expired nodes (any live node may do it; idempotent) for at most
        half a heartbeat interval: the rest waits for the next beat, so a dead node with many
        runs never holds up this node's own heartbeat until its lease runs out."""
        until = time.monotonic() + self.interval / 2
        try:
            while True:
                runs, nodes, more = await self._store.reap(REAP_BUDGET, self._auth())
                if runs or nodes:
                    self._holder.count_reaped(runs, nodes)
                if not more or time.monotonic() > until:
                    return
        except BusUnavailable as exc:
            log.warning("cancel-bus: reaping failed: %s", exc)

    def _renewed(self, sent: float, local_sent: float, server_now: float) -> None:
        self._last_renewed = sent
        self.offset = server_now - (local_sent + time.time()) / 2
