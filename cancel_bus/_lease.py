"""A node's lease: registration, heartbeat, the server-clock estimate, fencing and reaping.

The lease is renewed every ``lease_ttl / 3``; a heartbeat that fails or times out is retried at
once, with a short backoff, not a whole interval later. Redis being unreachable is nobody's
death: the node keeps its runs and its lease until Redis says the lease is gone (the heartbeat
answers ``fenced``: the node was declared dead, or a new incarnation holds its id), or until
``self_fence_after`` seconds without contact, when it stops its runs with the honest cause
``redis_unreachable``. On Redis's side leases run on the lease clock (``_scripts.py``), which a
stall, a pause or a failover cannot advance by more than one heartbeat interval.
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
from ._types import StopCause

log = logging.getLogger("cancel_bus")

REAP_BUDGET = 500
RETRY_FIRST = 0.05  # seconds before the first retry of a failed heartbeat; doubles up to...
RETRY_SHARE = 0.25  # ... this share of the interval
WARN_EVERY = 5.0  # seconds between warnings while heartbeats keep failing


class LeaseHolder(Protocol):
    async def lease_renewed(self, recorded_runs: int) -> None: ...

    async def lease_lost(self, cause: StopCause, why: str) -> None: ...

    async def lease_missing(self) -> None: ...

    def count_reaped(self, runs: int, nodes: int) -> None: ...


class Lease:
    def __init__(
        self,
        store: RunStore,
        *,
        node_id: str,
        lease_ttl: float,
        self_fence_after: float,
        version: str,
    ) -> None:
        self._store = store
        self.lease_ttl = lease_ttl
        self.self_fence_after = self_fence_after
        self._version = version
        self.holder: LeaseHolder | None = None  # told of renewals, losses, amnesia, reaps
        self.probe: Callable[[], tuple[float, float] | None] = lambda: None  # shown with it
        self.node_id = node_id  # this incarnation's, once registered
        self.epoch = ""
        self.offset = 0.0
        self.valid = False  # Redis has not said this incarnation's lease is gone
        self.self_fenced = False  # runs stopped: no contact with Redis for the deadline
        self._last_renewed = 0.0  # monotonic send time of the last heartbeat that answered
        self._last_warning = 0.0
        self._stopped = False

    @property
    def interval(self) -> float:
        return self.lease_ttl / 3

    @property
    def fresh(self) -> bool:
        """Valid, and renewed within the last lease: what readiness asks."""
        return self.valid and time.monotonic() - self._last_renewed <= self.lease_ttl

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
                        node_id, self.lease_ttl, self._version, epoch, restore
                    )
            except TimeoutError:
                raise BusUnavailable(
                    f"no answer from Redis to the node registration within {self.interval:.2g} s "
                    "(as when a server is stalled, or a Sentinel or TLS handshake never completes:"
                    " check the URL's scheme and hosts)"
                ) from None
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
        """Beat every interval after the last beat that reached Redis; retry a failed one at
        once with a backoff bounded well under the interval."""
        self._stopped = False  # a bus that failed to start may start again
        retry = RETRY_FIRST
        due = time.monotonic() + self.interval
        while not self._stopped:
            raise_if_cancelling()  # a cancellation redis-py swallowed ends the loop too
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            renewed = self._last_renewed
            try:
                reached = await self.beat()
            except Exception:  # the heartbeat must outlive any failure
                raise_if_cancelling()
                log.exception("cancel-bus: heartbeat of %s failed", self.node_id)
                reached = False
            if reached:
                retry = RETRY_FIRST
                if self._last_renewed != renewed:
                    due = self._last_renewed + self.interval
                else:  # Redis answered, but not with a renewal (fenced, or forgot us)
                    due = time.monotonic() + self.interval
            else:
                due = time.monotonic() + retry
                retry = min(retry * 2, self.interval * RETRY_SHARE)

    async def beat(self) -> bool:
        """One heartbeat, then reap expired nodes; reports loss or amnesia to the holder.
        -> whether Redis answered."""
        if not self.valid:
            return True  # the holder is rejoining as a new incarnation
        silent = time.monotonic() - self._last_renewed
        if silent > self.self_fence_after and not self.self_fenced:
            self.self_fenced = True
            why = f"no answer from Redis for {silent:.0f} s"
            await self._tell().lease_lost(StopCause.REDIS_UNREACHABLE, why)
        sent, local_sent = time.monotonic(), time.time()
        try:
            async with asyncio.timeout(self.interval):
                code, server_now, recorded = await self._store.heartbeat(
                    self.node_id, self.epoch, self.lease_ttl, self.probe()
                )
        except (BusUnavailable, TimeoutError) as exc:
            if sent - self._last_warning >= WARN_EVERY:
                self._last_warning = sent
                runs = (
                    "its runs were stopped (redis_unreachable)"
                    if self.self_fenced
                    else f"runs go on; stopped at {self.self_fence_after:g} s"
                )
                log.warning(
                    "cancel-bus: heartbeat of %s failed (%.1f s since the last renewal; %s): %s",
                    self.node_id,
                    silent,
                    runs,
                    str(exc) or f"no answer within {self.interval:.2g} s",
                )
            return False
        if code == "fenced":
            self.valid = False
            await self._tell().lease_lost(StopCause.LEASE_LOST, "Redis says the lease is gone")
        elif code == "missing":
            await self._tell().lease_missing()
        else:
            self._renewed(sent, local_sent, server_now)
            self.self_fenced = False
            await self._tell().lease_renewed(recorded)
            await self.reap()
        return True

    async def reap(self) -> None:
        """Resolve the runs of expired nodes (any live node may do it; idempotent) for at most
        half a heartbeat interval: the rest waits for the next beat, so a dead node with many
        runs never holds up this node's own heartbeat until its lease runs out."""
        until = time.monotonic() + self.interval / 2
        try:
            while True:
                runs, nodes, more = await self._store.reap(REAP_BUDGET)
                if runs or nodes:
                    self._tell().count_reaped(runs, nodes)
                if not more or time.monotonic() > until:
                    return
        except BusUnavailable as exc:
            log.warning("cancel-bus: reaping failed: %s", exc)

    async def leave(self) -> None:
        """Release the lease (a closing node): runs still recorded for it are resolved."""
        while self.valid:
            code, done = await self._store.leave_node(self.node_id, self.epoch)
            if code != "ok" or done:
                return

    def _tell(self) -> LeaseHolder:
        if self.holder is None:
            raise RuntimeError("the lease has no holder")
        return self.holder

    def _renewed(self, sent: float, local_sent: float, server_now: float) -> None:
        self._last_renewed = sent
        self.offset = server_now - (local_sent + time.time()) / 2
