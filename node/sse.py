"""Server-sent events through sse-starlette: our wire format, keep-alives, and a run's relay.

A stream ends in one of four ways: the run ends, the node drains, the client goes away, or the
client takes nothing for ``send_timeout`` seconds (it is dropped and counted: a client that
never reads would hold its buffers for good); in each, sse-starlette cancels what serves it,
and everything a stream starts runs in a task group that is awaited, so a dropped stream leaves
no task, connection or subscription behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from prometheus_client import Counter, Gauge
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from cancel_bus import CancelBus, CancelBusError, RunInfo

log = logging.getLogger("cancel_bus.node")

KEEPALIVE_SECONDS = 15.0
SSE_OK: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}
}


@dataclass(frozen=True)
class Streams:
    """What every stream of the node shares: the gauge of those open, the counter of clients
    dropped for taking nothing, and how long a send may wait for the client."""

    open: Gauge
    dropped: Counter
    send_timeout: float


def event(name: str, data: Any, event_id: str | None = None) -> ServerSentEvent:
    """``event: <name>``, ``id: <id>`` (a relay entry's), ``data: <json>``."""
    text = json.dumps(data, separators=(",", ":"), default=str)
    return ServerSentEvent(text, event=name, id=event_id, sep="\n")


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep="\n")


class EventStream(EventSourceResponse):
    """sse-starlette's response with our separator, keep-alive comment and send timeout, counted
    in the ``open_streams`` gauge for as long as it is served. ``producer`` (optional) runs
    beside the stream and is cancelled with it."""

    def __init__(
        self,
        content: AsyncIterable[ServerSentEvent],
        streams: Streams,
        producer: Callable[[], Coroutine[None, None, None]] | None = None,
    ) -> None:
        super().__init__(
            content,
            ping=KEEPALIVE_SECONDS,
            sep="\n",
            ping_message_factory=_keepalive,
            data_sender_callable=producer,
            send_timeout=streams.send_timeout,
        )
        self._streams = streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._streams.open.track_inprogress():
            try:
                await super().__call__(scope, receive, send)
            except SendTimeoutError:  # it took nothing for send_timeout: dropped
                self._streams.dropped.inc()


def run_stream(
    bus: CancelBus,
    run: RunInfo,
    streams: Streams,
    *,
    from_start: bool,
    closing: asyncio.Event | None = None,
    on_disconnect: Callable[[], None] | None = None,
) -> EventStream:
    """``run`` (the record as the stream starts), the run's events, then its final record. If
    the stream ends before the run does (the client went away), ``on_disconnect`` is called
    (AG-UI style: a closed stream cancels its run). When ``closing`` is set (the node drains)
    the stream ends with a ``node.draining`` event: the client follows the run elsewhere."""
    send, receive = anyio.create_memory_object_stream[ServerSentEvent](max_buffer_size=100)
    relay = _RunRelay(bus, run, from_start, send)

    async def produce() -> None:
        try:
            await relay.feed(closing)
        finally:
            if not relay.ended and on_disconnect is not None:
                on_disconnect()

    return EventStream(_received(receive), streams, produce)


async def _received(
    receive: MemoryObjectReceiveStream[ServerSentEvent],
) -> AsyncIterable[ServerSentEvent]:
    """What the producer sent; the receiving end is closed when the response is done with it."""
    with receive:
        async for item in receive:
            yield item


class _RunRelay:
    """Feeds one client's stream with a run's record, events and final record."""

    def __init__(
        self,
        bus: CancelBus,
        run: RunInfo,
        from_start: bool,
        send: MemoryObjectSendStream[ServerSentEvent],
    ) -> None:
        self.bus = bus
        self.run = run
        self.from_start = from_start
        self.send = send
        self.ended = False  # the client was told the run ended, or where to follow it

    async def feed(self, closing: asyncio.Event | None) -> None:
        async with self.send:
            await self.send.send(event("run", self.run.model_dump(mode="json")))
            relayed = False
            async with anyio.create_task_group() as group:
                if closing is not None:
                    group.start_soon(_cancel_when_set, closing, group.cancel_scope)
                await self._relay()
                relayed = True
                group.cancel_scope.cancel()
            if not relayed:  # the drain cut it short
                await self.send.send(event("node.draining", {"run_id": self.run.run_id}))
                self.ended = True  # the run goes on; this node only stops streaming it

    async def _relay(self) -> None:
        run_id = self.run.run_id
        try:
            async for item in self.bus.follow(run_id, from_start=self.from_start):
                await self.send.send(event(item.type, item.data, item.id))
                self.ended = self.ended or item.type == "run.finished"
            final = await self.bus.get_run(run_id)
        except CancelBusError as exc:  # Redis went away, or the run's records expired
            log.warning("stream of run %s ends early: %s", run_id, exc)
            await self.send.send(event("unavailable", {"detail": str(exc)}))
            return
        self.ended = True
        if final is not None:
            await self.send.send(event("run", final.model_dump(mode="json")))


async def _cancel_when_set(flag: asyncio.Event, scope: anyio.CancelScope) -> None:
    await flag.wait()
    scope.cancel()
