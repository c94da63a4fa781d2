"""Server-sent events: the wire format, keep-alives, and streaming a run's relay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from cancel_bus import CancelBus, RunEvent, RunInfo

KEEPALIVE_SECONDS = 15.0
KEEPALIVE = b": keepalive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_OK: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "server-sent events"}
}


def encode(event: str, data: Any, event_id: str | None = None) -> bytes:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(data, separators=(",", ":"), default=str))
    return ("\n".join(lines) + "\n\n").encode()


async def run_stream(
    bus: CancelBus,
    run: RunInfo,
    *,
    from_start: bool,
    closing: asyncio.Event | None = None,
    on_disconnect: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """``run`` (the record as the stream starts), the run's events, then its final record. If
    the client goes away before the run ends, ``on_disconnect`` is called (AG-UI style: a closed
    stream cancels its run). When ``closing`` is set (the node drains) the stream ends with a
    ``node.draining`` event: the client follows the run from another node."""
    closing = closing or asyncio.Event()
    run_id = run.run_id
    queue: asyncio.Queue[RunEvent | None] = asyncio.Queue(maxsize=1000)

    async def pump() -> None:
        async for event in bus.follow(run_id, from_start=from_start):
            await queue.put(event)
        await queue.put(None)

    pumping = asyncio.create_task(pump())
    finished = False
    try:
        yield encode("run", run.model_dump(mode="json"))
        async for event in _until_closing(queue, closing):
            if event is None:
                break
            if isinstance(event, bytes):
                yield event
                continue
            yield encode(event.type, event.data, event.id)
            finished = finished or event.type == "run.finished"
        else:
            yield encode("node.draining", {"run_id": run_id})
            finished = True  # the run goes on; this node only stops streaming it
            return
        await pumping  # re-raises what the pump met
        final = await bus.get_run(run_id)
        finished = True
        if final is not None:
            yield encode("run", final.model_dump(mode="json"))
    finally:
        pumping.cancel()  # ends on its own; awaiting it here could swallow our cancellation
        if not finished and on_disconnect is not None:
            on_disconnect()


async def _until_closing(
    queue: asyncio.Queue[RunEvent | None], closing: asyncio.Event
) -> AsyncIterator[RunEvent | bytes | None]:
    """The queue's items until ``closing`` is set; a keep-alive comment when idle."""
    closed = asyncio.create_task(closing.wait())
    try:
        while not closing.is_set():
            item = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait(
                {item, closed}, timeout=KEEPALIVE_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            if item in done:
                yield item.result()
                continue
            item.cancel()
            if not done:
                yield KEEPALIVE
    finally:
        closed.cancel()
