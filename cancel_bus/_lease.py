"""A node's lease: registration, heartbeat, the server-clock estimate, fencing and reaping.

The lease is renewed every ``lease_ttl / 10`` (a beat); a heartbeat that fails is retried with a
short backoff counted from when it was sent (one that timed out, at once), not a beat later. On
Redis's side leases run on the lease clock (``_scripts.py``): it advances at most at the server
clock's pace, and a stall, a pause or a failover that no heartbeat gets through advances it by
at most the patience (a fifth of the lease: two beats, so a late beat loses no time) — so no
other node may resolve this node's runs before the last renewal Redis acknowledged (dated from
when it was sent) plus the lease. **Fencing is lease-safe**: the node stops its runs
(``redis_unreachable``) by then, a margin earlier (``FENCE_MARGIN``: the clock's rate, the stop
itself), however it lost Redis — a stall, a partition of this node alone, a Redis refusing
writes — and never later; no answer can say a run ended while its code goes on. So the stall a
node rides out without stopping its runs is ``lease - beat - margin`` (0.85 of a lease). It
keeps heartbeating: if Redis answers and still holds its lease (a stall everyone sat out), it
goes on as the same incarnation; if Redis says the lease is gone (``fenced``), it rejoins as a
new one.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Protocol

from ._calls import ScriptCalls
from ._duties import Duty
from ._errors import BusUnavailable, CancelBusError, Fenced, NodeIdInUse
from ._ports import Identity
from ._protocol import Code
from ._redis import backoff
from ._trouble import Trouble, kind_of
from ._types import StopCause

REAP_BUDGET = 500
HEARTBEATS_PER_LEASE = 10
PATIENCE = 0.2  # of a lease: how long a call to Redis is waited for before it counts as silence
FENCE_MARGIN = 0.05  # of a lease: the node stops its runs this much before another may resolve them
RETRY_FIRST = 0.05  # seconds before the first retry of a failed heartbeat; doubles up to...
RETRY_SHARE = 0.5  # ... this share of a beat


class LeaseHolder(Protocol):
    """Who the lease tells what Redis said (the node's recovery)."""

    async def lease_renewed(self, recorded_runs: int) -> None: ...

    def lease_lost(self, cause: StopCause, why: str) -> None: ...

    async def lease_missing(self) -> None: ...

    def count_reaped(self, runs: int, nodes: int) -> None: ...

    def probe_back(self) -> tuple[float, float] | None:
        """When the node's last probe of its own channel came back (server clock), and how long
        it took (s): shown with the heartbeat."""


class Lease:
    """The node's identity and its lease: registration, the heartbeat duty, fencing."""

    def __init__(
        self,
        calls: ScriptCalls,
        *,
        node_id: str,
        lease_ttl: float,
        self_fence_after: float,
        version: str,
    ) -> None:
        self._calls = calls
        self.lease_ttl = lease_ttl
        self.beat_period = lease_ttl / HEARTBEATS_PER_LEASE  # between heartbeats
        # how long a call to Redis is waited for (a heartbeat, a finish, a probe) before it
        # counts as silence; and the most one heartbeat advances the lease clock
        self.patience = lease_ttl * PATIENCE
        self.self_fence_after = self_fence_after
        self._version = version
        self.holder: LeaseHolder | None = None  # told of renewals, losses, amnesia, reaps
        self.identity = Identity(node_id)
        self.offset = 0.0
        self.valid = False  # Redis has not said this incarnation's lease is gone
        self.self_fenced = False  # runs stopped: the lease may have run out unrenewed
        self.draining = False  # said with each heartbeat: the node takes no new runs
        self._last_renewed = 0.0  # monotonic send time of the last heartbeat that answered
        self._reaping = Trouble("reaping expired nodes")
        self._fence: asyncio.TimerHandle | None = None
        self._stopped = False

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    @property
    def epoch(self) -> str:
        return self.identity.epoch

    @property
    def renewed_at(self) -> float:
        """When (monotonic) the last heartbeat Redis acknowledged was sent."""
        return self._last_renewed

    @property
    def fence_after(self) -> float:
        """Seconds after the last acknowledged renewal was sent at which the node stops its runs:
        the lease less the margin (or ``self_fence_after``, if sooner)."""
        return min(self.self_fence_after, self.lease_ttl * (1 - FENCE_MARGIN))

    @property
    def may_run(self) -> bool:
        """Redis has not said the lease is gone, and the fence has not stopped the runs."""
        return self.valid and not self.self_fenced

    @property
    def fresh(self) -> bool:
        """Valid, and within the fence deadline of its last renewal: what readiness asks."""
        return self.valid and time.monotonic() - self._last_renewed < self.fence_after

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
                async with asyncio.timeout(self.lease_ttl / 3):
                    code, server_now = await self._calls.register_node(
                        node_id, self.lease_ttl, self.patience, self._version, epoch, restore
                    )
            except TimeoutError:
                raise BusUnavailable(
                    "no answer from Redis to the node registration within "
                    f"{self.lease_ttl / 3:.2g} s "
                    "(as when a server is stalled, or a Sentinel or TLS handshake never completes:"
                    " check the URL's scheme and hosts)"
                ) from None
            if code is Code.OK:
                self.identity, self.valid = Identity(node_id, epoch), True
                self.self_fenced = False  # a lease just taken: its runs may run
                self._renewed(sent, local_sent, server_now)
                return
            if code is Code.FENCED:
                raise Fenced(f"node {node_id} was fenced while Redis forgot it")
            if code is Code.IN_USE:
                if time.monotonic() > give_up:
                    raise NodeIdInUse(node_id)
                await asyncio.sleep(min(1.0, self.patience))

    def stop(self) -> None:
        """No more fencing: the node is closing (its duties are stopped by their owner)."""
        self._stopped = True
        if self._fence is not None:
            self._fence.cancel()

    def duty(self) -> Duty:
        """The heartbeat: a beat after the last renewal; a failed beat again with a backoff of
        at most half a beat from when it was sent (one that timed out: at once)."""
        return Duty(
            "heartbeat",
            self.turn,
            period=lambda: self.beat_period,
            backoff=backoff(RETRY_FIRST, self.beat_period * RETRY_SHARE),
            at_once=False,
        )

    async def turn(self) -> float:
        """One heartbeat and the reaping after it; -> seconds until the next beat. Raises
        (:class:`BusUnavailable`, saying how long since the last renewal and what happens to
        the runs) when Redis did not answer."""
        self._stopped = False
        renewed = self._last_renewed
        await self.beat()
        if self._last_renewed == renewed:  # answered, but not with a renewal (fenced, forgot us)
            return self.beat_period
        return max(0.0, self._last_renewed + self.beat_period - time.monotonic())

    async def beat(self) -> None:
        """One heartbeat, then reap expired nodes; reports loss or amnesia to the holder."""
        if not self.valid:
            return  # the holder is rejoining as a new incarnation
        silent = time.monotonic() - self._last_renewed
        sent, local_sent = time.monotonic(), time.time()
        me, probe = self.identity, self._tell().probe_back()
        try:
            async with asyncio.timeout(self.patience):
                code, server_now, recorded = await self._calls.heartbeat(
                    me.node_id, me.epoch, self.lease_ttl, self.patience, probe, self.draining
                )
        except (CancelBusError, TimeoutError) as exc:  # unavailable, refused, or a defect
            left = self.fence_after - silent
            runs = (
                "its runs were stopped (redis_unreachable)"
                if self.self_fenced
                else f"its runs go on for {left:.2f} s more unless Redis renews the lease"
            )
            reason = str(exc) or f"no answer within {self.patience:.2g} s"
            raise BusUnavailable(
                f"{me.node_id}, {silent:.1f} s since the last renewal; {runs}: {reason}",
                getattr(exc, "code", None),
            ) from exc
        if code is Code.FENCED:
            self.valid = False
            self._tell().lease_lost(StopCause.LEASE_LOST, "Redis says the lease is gone")
        elif code is Code.MISSING:
            await self._tell().lease_missing()
        else:
            self._renewed(sent, local_sent, server_now)
            self.self_fenced = False
            await self._tell().lease_renewed(recorded)
            await self.reap()

    async def reap(self) -> None:
        """Resolve the runs of expired nodes (any live node may do it; idempotent) for at most
        half a beat: the rest waits for the next beat, so a dead node with many runs never
        holds up this node's own heartbeat until its lease runs out."""
        until = time.monotonic() + self.beat_period / 2
        try:
            while True:
                runs, nodes, more = await self._calls.reap(REAP_BUDGET)
                if runs or nodes:
                    self._tell().count_reaped(runs, nodes)
                if not more or time.monotonic() > until:
                    break
        except CancelBusError as exc:
            self._reaping.failing(kind_of(exc), str(exc))
            return
        self._reaping.over()

    async def leave(self) -> None:
        """Release the lease (a closing node): runs still recorded for it are resolved."""
        while self.valid:
            me = self.identity
            code, done = await self._calls.leave_node(me.node_id, me.epoch)
            if code is not Code.OK or done:
                return

    def _tell(self) -> LeaseHolder:
        if self.holder is None:
            raise RuntimeError("the lease has no holder")
        return self.holder

    def _renewed(self, sent: float, local_sent: float, server_now: float) -> None:
        """Redis renewed the lease (the heartbeat sent at ``sent`` answered): the fence deadline
        moves on to ``sent`` plus :attr:`fence_after`."""
        self._last_renewed = sent
        self.offset = server_now - (local_sent + time.time()) / 2
        if self._fence is not None:
            self._fence.cancel()
        delay = sent + self.fence_after - time.monotonic()
        self._fence = asyncio.get_running_loop().call_later(max(0.0, delay), self._fence_due)

    def _fence_due(self) -> None:
        """The lease may run out before another renewal can reach Redis: stop the runs now (a
        timer, not the heartbeat loop: nothing that waits for Redis can delay it)."""
        self._fence = None
        if self.self_fenced or not self.valid or self._stopped:
            return
        self.self_fenced = True
        silent = time.monotonic() - self._last_renewed
        why = (
            f"no renewal acknowledged for {silent:.2f} s; the lease ({self.lease_ttl:g} s) may "
            "run out before another can reach Redis"
        )
        self._tell().lease_lost(StopCause.REDIS_UNREACHABLE, why)
