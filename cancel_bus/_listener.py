"""The node's pub/sub loop: one subscription to its own channel, a sweep after every (re)subscribe.

Pub/sub replays nothing after a reconnect, so each subscribe confirmation (the first and every
later one) triggers a sweep of the stored state. A connection that stops answering our pings is
dropped and re-made: a silently dead subscriber must not look healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ._errors import CancelBusError
from ._redis import is_closed_transport, raise_if_cancelling

log = logging.getLogger("cancel_bus")

_SUBSCRIBED = frozenset({"subscribe", "ssubscribe"})
_UNSUBSCRIBED = frozenset({"unsubscribe", "sunsubscribe"})
_MESSAGES = frozenset({"message", "smessage"})
_PING = "cancel-bus-ping"


class Listener:
    def __init__(
        self,
        subscriber: Callable[[], Awaitable[tuple[Redis, bool]]],
        channel: str,
        *,
        sharded: bool,
        on_message: Callable[[str], None],
        on_subscribed: Callable[[], Coroutine[Any, Any, None]],
        ping_interval: float,
    ) -> None:
        self._subscriber = subscriber
        self._channel = channel
        self._sharded = sharded
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._ping_interval = ping_interval
        self._subscribed = asyncio.Event()
        self._sweeps: set[asyncio.Task[None]] = set()
        self.connected = False
        self.reconnects = 0
        self._stopped = False

    def stop(self) -> None:
        """End :meth:`run_forever` at its next turn (even if a cancellation was swallowed)."""
        self._stopped = True

    async def wait_subscribed(self, timeout: float) -> None:
        await asyncio.wait_for(self._subscribed.wait(), timeout)

    async def run_forever(self) -> None:
        """Subscribe, listen until the subscription breaks, start again: a fresh connection
        each time (on a cluster, to whichever primary serves the channel's slot now)."""
        backoff = 0.05
        try:
            while not self._stopped:
                try:
                    await self._subscription()
                except Exception as exc:  # the listener must outlive any failure
                    raise_if_cancelling()
                    known = isinstance(exc, RedisError | OSError | CancelBusError)
                    if not known and not is_closed_transport(exc):
                        log.exception("cancel-bus: unexpected error in the subscriber loop")
                    elif self.connected:
                        log.warning("cancel-bus: subscriber connection lost: %s", exc)
                # a subscription that worked is retried at once; failing attempts back off
                backoff = 0.05 if self.connected else min(backoff * 2, 2.0)
                self.connected = False
                self.reconnects += 1
                await asyncio.sleep(backoff)
        finally:
            for sweep in self._sweeps:
                sweep.cancel()
            self.connected = False

    async def _subscription(self) -> None:
        client, dedicated = await self._subscriber()
        pubsub = client.pubsub()
        try:
            if self._sharded:
                await pubsub.ssubscribe(self._channel)
            else:
                await pubsub.subscribe(self._channel)
            await self._listen(pubsub)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            if dedicated:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def _listen(self, pubsub: Any) -> None:
        """Read until the subscription breaks. Anything the server sends (a message, a pong)
        proves the connection alive; a ping goes out every interval whatever else arrives, so
        silence after a busy spell is still answered before the watchdog judges it."""
        last_heard = last_ping = time.monotonic()
        while True:
            message = await pubsub.get_message(timeout=self._ping_interval / 2)
            now = time.monotonic()
            if message is not None:
                last_heard = now
                kind = message["type"]
                if kind in _MESSAGES:
                    self._dispatch(message["data"])
                elif kind in _SUBSCRIBED:
                    self.connected = True
                    self._subscribed.set()
                    self._sweep()
                elif kind in _UNSUBSCRIBED:  # the server dropped us (the slot moved)
                    raise RedisError("the subscription was dropped by the server")
            if now - last_heard > 2 * self._ping_interval:
                raise RedisError("no answer to ping on the subscriber connection")
            if now - last_ping >= self._ping_interval:
                last_ping = now
                await pubsub.ping(_PING)

    def _dispatch(self, data: str) -> None:
        try:
            self._on_message(data)
        except Exception:
            log.exception("cancel-bus: failed to handle a bus message")

    def _sweep(self) -> None:
        task: asyncio.Task[None] = asyncio.create_task(self._on_subscribed())
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)
