"""The node's pub/sub loop: one subscription to its own channel, a sweep after every (re)subscribe.

redis-py re-subscribes after a reconnect but replays nothing, so each subscribe confirmation
(the first and every later one) triggers a sweep of the stored state. A connection that stops
answering our pings is dropped and re-made: a silently dead subscriber must not look healthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ._redis import is_closed_transport

log = logging.getLogger("cancel_bus")

_SUBSCRIBED = frozenset({"subscribe", "ssubscribe"})
_MESSAGES = frozenset({"message", "smessage"})
_PING = "cancel-bus-ping"


class Listener:
    def __init__(
        self,
        redis: Redis,
        channel: str,
        *,
        sharded: bool,
        on_message: Callable[[str], None],
        on_subscribed: Callable[[], Coroutine[Any, Any, None]],
        ping_interval: float,
    ) -> None:
        self._redis = redis
        self._channel = channel
        self._sharded = sharded
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._ping_interval = ping_interval
        self._subscribed = asyncio.Event()
        self._sweeps: set[asyncio.Task[None]] = set()
        self.connected = False
        self.reconnects = 0

    async def wait_subscribed(self, timeout: float) -> None:
        await asyncio.wait_for(self._subscribed.wait(), timeout)

    async def run_forever(self) -> None:
        pubsub = self._redis.pubsub()
        backoff = 0.05
        try:
            while True:
                try:
                    await self._listen(pubsub)
                except Exception as exc:  # the listener must outlive any failure
                    if not isinstance(exc, RedisError | OSError) and not is_closed_transport(exc):
                        log.exception("cancel-bus: unexpected error in the subscriber loop")
                    elif self.connected:
                        log.warning("cancel-bus: subscriber connection lost: %s", exc)
                    self.connected = False
                    self.reconnects += 1
                    await _drop_connection(pubsub)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                else:
                    backoff = 0.05
        finally:
            for sweep in self._sweeps:
                sweep.cancel()
            self.connected = False
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _listen(self, pubsub: Any) -> None:
        if not pubsub.subscribed:
            if self._sharded:
                await pubsub.ssubscribe(self._channel)
            else:
                await pubsub.subscribe(self._channel)
        last_pong = time.monotonic()
        last_ping = 0.0
        while True:
            message = await pubsub.get_message(timeout=self._ping_interval / 2)
            now = time.monotonic()
            if message is not None:
                kind = message["type"]
                if kind in _MESSAGES:
                    self._dispatch(message["data"])
                    continue
                if kind in _SUBSCRIBED:
                    self.connected = True
                    self._subscribed.set()
                    self._sweep()
                last_pong = now
            if now - last_pong > 2 * self._ping_interval:
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


async def _drop_connection(pubsub: Any) -> None:
    """Close the socket so the next read reconnects (and re-subscribes)."""
    connection = pubsub.connection
    if connection is not None:
        with contextlib.suppress(Exception):
            await connection.disconnect()
