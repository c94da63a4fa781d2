"""What reaches this node on its channel, and the sweep that re-reads it from Redis.

* The subscription: one connection to the node's own channel (on a cluster, to whichever primary
  serves its slot now), a fresh one at every (re)subscribe. Anything the server sends proves the
  connection alive; a ping goes out every interval whatever else arrives, and a connection that
  stops answering is dropped and re-made: a silently dead subscriber must not look healthy. A
  turn of this node's own event loop that came late (the loop was blocked) proves nothing about
  Redis: the silence is counted from then, and a ping goes out at once.
* Each message is acted on only if it is sealed (on a signed bus), fresh, unseen, and addressed
  to this incarnation; every one dropped is counted by why. A cancel sets its run's token (or
  waits for the run's start); a finish notice answers the local callers waiting for the run.
* Pub/sub replays nothing after a reconnect: the sweep — after every subscribe confirmation,
  before the next message is awaited, and every ``sweep_interval`` — delivers every cancel
  pending on this node's runs and answers the waiters whose run has ended, from the stored
  state. Every confirmation after the first (ours, or redis-py's own resubscribe after it
  reconnected) counts as a reconnect.
* The path proves itself: every probe interval the node sends a probe to its own channel,
  through Redis. One that has not come back by the next is a failure: the node is not ready
  (``problem``), whatever its connection looks like — a subscriber on the wrong server, a
  subscription silently gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from typing import Any

from ._duties import Duty
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
from ._notices import Notices
from ._reads import Reads
from ._redis import Topology, backoff, is_closed_transport, raise_if_cancelling, translated
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
        reads: Reads,
        notices: Notices,
        lease: Lease,
        signer: MessageSigner,
        local: LocalRuns,
        waiters: Waiters,
        stats: BusStats,
        sweep_interval: float,
    ) -> None:
        self._topology = topology
        self._reads = reads
        self._notices = notices
        self._lease = lease
        self._signer = signer
        self._local = local
        self._waiters = waiters
        self._stats = stats
        self._sweep_interval = sweep_interval
        self._ping_interval = min(5.0, lease.interval)
        self.probe_interval = self._ping_interval
        self._probe: tuple[str, float] | None = None  # (nonce, sent at: monotonic) on its way
        self.probe_back: tuple[float, float] | None = None  # (server time, latency s) of the last
        self.probes_back = 0
        self._probe_failed_at: float | None = None
        self._channel: str | None = None  # the channel to listen on (None: none)
        self._moved = asyncio.Event()  # the channel changed: the subscription ends
        self._wake = asyncio.Event()  # there is a channel to subscribe to
        self._subscribed = asyncio.Event()
        self._confirmed = False  # a subscription of this node was confirmed once
        self.connected = False
        self.reconnects = 0

    def subscription_duty(self) -> Duty:
        """Subscribe and listen: again at once after a subscription that worked, else after a
        backoff; resting while there is no channel to listen on."""
        return Duty(
            "subscription", self.subscription, lambda: math.inf, backoff(0.05, 2.0), self._wake
        )

    def duties(self) -> list[Duty]:
        """The probe of the node's own channel, and the sweep."""
        return [
            Duty("probe", self.probe, lambda: self.probe_interval, backoff(0.1, 5.0)),
            Duty(
                "sweep",
                self.sweep,
                lambda: self._sweep_interval,
                backoff(0.1, self._sweep_interval),
                at_once=False,
            ),
        ]

    # -- the subscription ---------------------------------------------------------------------

    async def subscribe(self, timeout: float) -> None:
        """(Re)subscribe to this node's channel (after a new node id, afresh) and wait until
        the subscription is confirmed."""
        self._subscribed = asyncio.Event()
        self._channel = self._reads.keys.channel(self._lease.node_id)
        self._moved.set()  # a subscription to another channel ends
        self._wake.set()
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        except TimeoutError as exc:
            raise BusUnavailable("could not subscribe to the node channel") from exc

    def unsubscribe(self) -> None:
        """Stop listening (until :meth:`subscribe`)."""
        self._channel = None
        self._moved.set()

    async def subscription(self) -> float:
        """The subscription duty's turn: subscribe and listen until the subscription breaks or
        the channel changes (a fresh connection each time); -> 0: again at once when it had
        worked, ``inf`` without a channel. Raises when it could not subscribe (backoff)."""
        channel = self._channel
        if channel is None:
            return math.inf
        self._moved.clear()
        try:
            with translated("subscription"):
                await self._subscription(channel)
        except Exception as exc:
            raise_if_cancelling()
            known = isinstance(exc, OSError | CancelBusError)
            if not known and not is_closed_transport(exc):
                log.exception("cancel-bus: unexpected error in the subscriber loop")
            elif not self.connected:
                raise  # never confirmed: again after a backoff
            else:
                log.warning("cancel-bus: subscriber connection lost: %s", exc)
        finally:
            self.connected = False
        return 0.0

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
        wait = self._ping_interval / 2
        last_heard = last_ping = last_turn = time.monotonic()
        while not self._moved.is_set():
            raise_if_cancelling()  # a cancellation redis-py swallowed ends the loop too
            message = await pubsub.get_message(timeout=wait)
            now = time.monotonic()
            if now - last_turn > 2 * wait:  # our loop was blocked: Redis's silence unproven
                last_heard, last_ping = now, 0.0
            last_turn = now
            if message is not None:
                last_heard = now
                kind = message["type"]
                if kind in _MESSAGES:
                    self._receive(message["data"])
                elif kind in _SUBSCRIBED:
                    await self._confirmed_now()
                elif kind in _UNSUBSCRIBED:  # the server dropped us (the slot moved)
                    raise BusUnavailable("the subscription was dropped by the server")
            if now - last_heard > 2 * self._ping_interval:
                raise BusUnavailable("no answer to ping on the subscriber connection")
            if now - last_ping >= self._ping_interval:
                last_ping = now
                await pubsub.ping(_PING)

    async def _confirmed_now(self) -> None:
        """A subscription confirmed (ours, or redis-py's own after it reconnected): sweep what
        was missed before the next message is read."""
        if self._confirmed:
            self.reconnects += 1
        self._confirmed = self.connected = True
        self._subscribed.set()
        await self.sweep()

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
        me = self._lease.identity
        if message is not None and not addressed_to(message, me.node_id, me.epoch):
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
            me = self._lease.identity
            receivers = await self._notices.probe(me.node_id, me.epoch, nonce)
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
        self.probes_back += 1
        self._probe = None
        self._probe_failed_at = None
        self.probe_back = (self._lease.clock(), latency)

    # -- the sweep ----------------------------------------------------------------------------

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
