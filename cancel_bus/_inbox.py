"""What reaches this node on its channel, and the sweep that re-reads it from Redis.

* The subscription: one connection to the node's own channel (on a cluster, to whichever primary
  serves its slot now), a fresh one at every (re)subscribe. Anything the server sends proves the
  connection alive; a ping goes out every interval whatever else arrives, and a connection that
  stops answering is dropped and re-made: a silently dead subscriber must not look healthy.
* Each message is acted on only if it is sealed (on a signed bus), fresh, unseen, and addressed
  to this incarnation; every one dropped is counted by why. A cancel sets its run's token (or
  waits for the run's start); a finish notice answers the local callers waiting for the run.
* Pub/sub replays nothing after a reconnect: the sweep — after every subscribe confirmation and
  every ``sweep_interval`` — delivers every cancel pending on this node's runs and answers the
  waiters whose run has ended, from the stored state.
* The path proves itself: every probe interval the node sends a probe to its own channel,
  through Redis. One that has not come back by the next is a failure: the node is not ready
  (``problem``), whatever its connection looks like — a subscriber on the wrong server, a
  subscription silently gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

from redis.exceptions import RedisError

from ._errors import BusUnavailable, CancelBusError
from ._lease import Lease
from ._local import Delivery, LocalRuns
from ._messages import (
    CancelMessage,
    MessageSigner,
    ProbeMessage,
    Rejection,
    addressed_to,
    decode,
    parse_message,
)
from ._redis import Topology, is_closed_transport, raise_if_cancelling
from ._state import Lifecycle
from ._store import RunStore
from ._types import BusStats
from ._waiters import Waiters

log = logging.getLogger("cancel_bus")

_SUBSCRIBED = frozenset({"subscribe", "ssubscribe"})
_UNSUBSCRIBED = frozenset({"unsubscribe", "sunsubscribe"})
_MESSAGES = frozenset({"message", "smessage"})
_PING = "cancel-bus-ping"


class Inbox:
    def __init__(
        self,
        *,
        topology: Topology,
        store: RunStore,
        lease: Lease,
        signer: MessageSigner,
        local: LocalRuns,
        waiters: Waiters,
        lifecycle: Lifecycle,
        stats: BusStats,
        sweep_interval: float,
    ) -> None:
        self._topology = topology
        self._store = store
        self._lease = lease
        self._signer = signer
        self._local = local
        self._waiters = waiters
        self._lifecycle = lifecycle
        self._stats = stats
        self._sweep_interval = sweep_interval
        self._ping_interval = min(5.0, lease.interval)
        self.probe_interval = self._ping_interval
        self._probe: tuple[str, float] | None = None  # (nonce, sent at: monotonic) on its way
        self.probe_back: tuple[float, float] | None = None  # (server time, latency s) of the last
        self._probe_failed_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._sweeps: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._stop = asyncio.Event()  # set with _stopped: it ends the loops' rests at once
        self.connected = False
        self.reconnects = 0

    # -- the subscription ---------------------------------------------------------------------

    async def subscribe(self, timeout: float) -> None:
        """(Re)subscribe to this node's channel (after a new node id, afresh) and wait until
        the subscription is confirmed."""
        await self.unsubscribe()
        self._stopped = False
        self._stop.clear()
        self._subscribed = asyncio.Event()
        channel = self._store.keys.channel(self._lease.node_id)
        self._task = asyncio.create_task(self._subscribe_forever(channel))
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        except TimeoutError as exc:
            raise BusUnavailable("could not subscribe to the node channel") from exc

    def stop(self) -> None:
        """End the loops at their next turn (even if a cancellation was swallowed): a loop at
        rest ends at once."""
        self._stopped = True
        self._stop.set()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The subscription's loop and the sweeps it started (the bus awaits them at close)."""
        return [*([self._task] if self._task is not None else []), *self._sweeps]

    async def unsubscribe(self) -> None:
        """End the subscription (and its loop); :meth:`subscribe` starts a new one."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _subscribe_forever(self, channel: str) -> None:
        """Subscribe, listen until the subscription breaks, start again: a fresh connection
        each time. A subscription that worked is retried at once; failing attempts back off."""
        backoff = 0.05
        try:
            while not self._stopped:
                raise_if_cancelling()  # a cancellation redis-py swallowed ends the loop too
                try:
                    await self._subscription(channel)
                except Exception as exc:  # the subscriber must outlive any failure
                    raise_if_cancelling()
                    known = isinstance(exc, RedisError | OSError | CancelBusError)
                    if not known and not is_closed_transport(exc):
                        log.exception("cancel-bus: unexpected error in the subscriber loop")
                    elif self.connected:
                        log.warning("cancel-bus: subscriber connection lost: %s", exc)
                backoff = 0.05 if self.connected else min(backoff * 2, 2.0)
                self.connected = False
                self.reconnects += 1
                await asyncio.sleep(backoff)
        finally:
            for sweep in self._sweeps:
                sweep.cancel()
            self.connected = False

    async def _subscription(self, channel: str) -> None:
        client, dedicated = await self._topology.subscriber(channel)
        pubsub = client.pubsub()
        try:
            if self._topology.cluster:
                await pubsub.ssubscribe(channel)
            else:
                await pubsub.subscribe(channel)
            await self._listen(pubsub)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            if dedicated:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _listen(self, pubsub: Any) -> None:
        last_heard = last_ping = time.monotonic()
        while True:
            message = await pubsub.get_message(timeout=self._ping_interval / 2)
            now = time.monotonic()
            if message is not None:
                last_heard = now
                kind = message["type"]
                if kind in _MESSAGES:
                    self._receive(message["data"])
                elif kind in _SUBSCRIBED:
                    self.connected = True
                    self._subscribed.set()
                    self._sweep_soon()
                elif kind in _UNSUBSCRIBED:  # the server dropped us (the slot moved)
                    raise RedisError("the subscription was dropped by the server")
            if now - last_heard > 2 * self._ping_interval:
                raise RedisError("no answer to ping on the subscriber connection")
            if now - last_ping >= self._ping_interval:
                last_ping = now
                await pubsub.ping(_PING)

    # -- messages -----------------------------------------------------------------------------

    def _receive(self, data: str) -> None:
        try:
            self._on_message(data)
        except Exception:
            log.exception("cancel-bus: failed to handle a bus message")

    def _on_message(self, data: str) -> None:
        body = decode(data)
        rejection = Rejection.MALFORMED if body is None else self._signer.check(body)
        message = parse_message(body) if body is not None and rejection is None else None
        if rejection is None and message is None:
            rejection = Rejection.MALFORMED
        if message is not None and not addressed_to(
            message, self._lease.node_id, self._lease.epoch
        ):
            rejection = Rejection.MISADDRESSED
        if rejection is not None or message is None:
            self._reject(rejection or Rejection.MALFORMED)
        elif isinstance(message, ProbeMessage):
            self._probe_came_back(message.nonce)
        elif isinstance(message, CancelMessage):
            delivery = self._local.deliver(message.run_id, message.request, message.target)
            if delivery is Delivery.MISADDRESSED:
                self._reject(Rejection.MISADDRESSED)
            elif delivery is Delivery.DELIVERED:
                self._stats.cancels_delivered += 1
        else:
            self._waiters.resolve(message.run_id, message.run)

    def _reject(self, why: Rejection) -> None:
        self._stats.messages_rejected += 1
        field = f"messages_{why.value}"
        setattr(self._stats, field, getattr(self._stats, field) + 1)

    # -- the probe ----------------------------------------------------------------------------

    @property
    def problem(self) -> str | None:
        """Why this node's channel cannot be trusted now, or None."""
        if not self.connected:
            return "the subscriber is not connected"
        if self._probe_failed_at is not None:
            return (
                "its own channel is silent: a probe sent through Redis did not come back "
                f"within {self.probe_interval:.1f} s"
            )
        return None

    async def probe_forever(self) -> None:
        while self._lifecycle.active and not self._stopped:
            try:
                await self.probe()
            except Exception:  # the probe must outlive any failure
                raise_if_cancelling()
                log.exception("cancel-bus: probe failed")
            await self._rest(self.probe_interval)

    async def _rest(self, seconds: float) -> None:
        """Sleep ``seconds``, or until the inbox is stopped."""
        raise_if_cancelling()  # a cancellation redis-py swallowed in the work ends the loop here
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def probe(self) -> None:
        """Judge the previous probe (back, or failed), send the next."""
        if self._probe is not None:  # not back within an interval
            self._stats.probes_failed += 1
            first = self._probe_failed_at is None
            self._probe_failed_at = time.monotonic()
            if first:
                log.error("cancel-bus: node %s: %s", self._lease.node_id, self.problem)
        nonce = os.urandom(8).hex()
        self._probe = (nonce, time.monotonic())
        try:
            receivers = await self._store.publish_probe(
                self._lease.node_id, self._lease.epoch, nonce
            )
        except BusUnavailable as exc:
            log.debug("cancel-bus: probe not sent: %s", exc)
            self._probe = None  # Redis is away: the lease says so; this proves nothing
            return
        if receivers == 0:
            log.warning("cancel-bus: node %s: nobody subscribes its channel", self._lease.node_id)

    def _probe_came_back(self, nonce: str) -> None:
        probe = self._probe
        if probe is None or probe[0] != nonce:
            return
        latency = time.monotonic() - probe[1]
        self._probe = None
        self._probe_failed_at = None
        self.probe_back = (self._lease.clock(), latency)

    # -- the sweep ----------------------------------------------------------------------------

    async def sweep_forever(self) -> None:
        while self._lifecycle.active and not self._stopped:
            await self._rest(self._sweep_interval)
            if self._stopped:
                return
            try:
                await self.sweep()
            except Exception:  # the safety net must outlive any failure
                raise_if_cancelling()
                log.exception("cancel-bus: sweep failed")

    async def sweep(self) -> None:
        """Deliver every cancel pending on this node's runs; answer local waiters whose run has
        ended — from the stored state."""
        try:
            pending = await self._store.pending_cancels(self._lease.node_id)
            for run_id, mode in pending.items():
                state = self._local.get(run_id)
                current = state.request if state is not None else None
                if state is None or (current and current.mode.strength >= mode.strength):
                    continue
                run = await self._store.get_run(run_id)
                request = run.cancel_request if run is not None else None
                delivered = request is not None and self._local.deliver(run_id, request)
                if delivered is Delivery.DELIVERED:
                    self._stats.cancels_recovered_by_sweep += 1
            for run in await self._store.get_runs(self._waiters.run_ids()):
                if not run.is_active:
                    self._waiters.resolve(run.run_id, run)
        except BusUnavailable as exc:
            log.debug("cancel-bus: sweep skipped: %s", exc)

    def _sweep_soon(self) -> None:
        task: asyncio.Task[None] = asyncio.create_task(self.sweep())
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)
