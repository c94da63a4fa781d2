"""The node's subscription to its own channel.

One connection to the channel (on a cluster, to whichever primary serves its slot now), a fresh
one at every (re)subscribe. Anything the server sends proves the connection alive; a ping goes
out every interval whatever else arrives, and a connection that stops answering is dropped and
re-made: a silently dead subscriber must not look healthy. A turn of this node's own event loop
that came late (the loop was blocked) proves nothing about Redis: the silence is counted from
then, and a ping goes out at once. Pub/sub replays nothing after a reconnect: every subscribe
confirmation (ours, or redis-py's own resubscribe after it reconnected) is handed on before the
next message is read (the sweep), and every one after the first counts as a reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ._duties import Duty, raise_if_cancelling
from ._errors import BusUnavailable, CancelBusError
from ._keys import KeySpace
from ._ports import Identified
from ._redis import Topology, backoff, is_closed_transport, translated

log = logging.getLogger("cancel_bus")

_SUBSCRIBED = frozenset({"subscribe", "ssubscribe"})
_UNSUBSCRIBED = frozenset({"unsubscribe", "sunsubscribe"})
_MESSAGES = frozenset({"message", "smessage"})
_PING = "cancel-bus-ping"


class Subscription:
    """``receive``: what each message's body is handed to; ``confirmed``: what runs after each
    subscribe confirmation, before the next message is read."""

    def __init__(
        self,
        topology: Topology,
        keys: KeySpace,
        lease: Identified,
        *,
        receive: Callable[[str], None],
        confirmed: Callable[[], Awaitable[None]],
    ) -> None:
        self._topology = topology
        self._keys = keys
        self._lease = lease
        self._receive = receive
        self._on_confirmed = confirmed
        self._ping_interval = min(5.0, lease.patience)
        self._channel: str | None = None  # the channel to listen on (None: none)
        self._moved = asyncio.Event()  # the channel changed: the subscription ends
        self._wake = asyncio.Event()  # there is a channel to subscribe to
        self._subscribed = asyncio.Event()
        self._confirmed = False  # a subscription of this node was confirmed once
        self.connected = False
        self.reconnects = 0

    @property
    def problem(self) -> str | None:
        return None if self.connected else "the subscriber is not connected"

    def duty(self) -> Duty:
        """Subscribe and listen: again at once after a subscription that worked, else after a
        backoff; resting while there is no channel to listen on."""
        return Duty(
            "subscription", self.subscription, lambda: math.inf, backoff(0.05, 2.0), self._wake
        )

    async def subscribe(self, timeout: float) -> None:
        """(Re)subscribe to this node's channel (after a new node id, afresh) and wait until
        the subscription is confirmed."""
        self._subscribed = asyncio.Event()
        self._channel = self._keys.channel(self._lease.node_id)
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
        if self._confirmed:
            self.reconnects += 1
        self._confirmed = self.connected = True
        self._subscribed.set()
        await self._on_confirmed()
