"""Work that arrives in bursts, done in chunks of bounded size and number.

100,000 runs may end in one event-loop turn (their tasks all woken by one event). If each did
its finish on the spot, that turn would last seconds (and the cyclic GC, seeing a million new
objects, would walk the whole heap several times): the heartbeat and the cancels would wait
behind it. Instead each end is a queued item and a future; at most ``max_chunks`` chunks of at
most ``chunk_size`` items are worked on at once, so no turn does more than that much of the work
and the rest waits its turn in a deque.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from ._duties import Spawn
from ._errors import BusClosed

Item = TypeVar("Item")


Outcomes = Sequence[BaseException | None]


class Settling(asyncio.Future[None]):
    """The future of a queued item, which a cancellation of its waiter does not cancel: the
    waiting task wakes when the item is done, and only then gets its ``CancelledError`` (the
    work was handed over; the waiter sees it through)."""

    def cancel(self, msg: object = None) -> bool:
        return False

    def abandon(self) -> None:
        """Cancel it after all: its work will not be done."""
        super().cancel()


class ChunkedQueue(Generic[Item]):
    """``do(chunk)`` for the items put, ``chunk_size`` at a time, at most ``max_chunks`` chunks
    at once; ``do`` answers each item's outcome (an error or None), which settles the future
    :meth:`put` gave for it."""

    def __init__(
        self,
        do: Callable[[list[Item]], Awaitable[Outcomes]],
        spawn: Spawn,
        *,
        chunk_size: int = 128,
        max_chunks: int = 8,
    ) -> None:
        self._do = do
        self._spawn = spawn
        self._chunk_size = chunk_size
        self._max_chunks = max_chunks
        self._queue: deque[tuple[Item, Settling]] = deque()
        self._chunks: set[asyncio.Task[None]] = set()
        self._scheduled = False

    def __len__(self) -> int:
        """Items not taken yet."""
        return len(self._queue)

    def put(self, item: Item) -> Settling:
        """Queue ``item``; chunks are taken once the current event-loop turn ends, so what one
        turn puts is taken together."""
        loop = asyncio.get_running_loop()
        done = Settling(loop=loop)
        self._queue.append((item, done))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._take)
        return done

    def _take(self) -> None:
        self._scheduled = False
        while self._queue and len(self._chunks) < self._max_chunks:
            count = min(self._chunk_size, len(self._queue))
            chunk = [self._queue.popleft() for _ in range(count)]
            try:
                task = self._spawn("a chunk of run ends", self._work(chunk))
            except BusClosed:  # the node is closed: these ends are not written
                for _, done in chunk:
                    done.abandon()
                continue
            self._chunks.add(task)
            task.add_done_callback(self._chunk_done)

    def _chunk_done(self, task: asyncio.Task[None]) -> None:
        self._chunks.discard(task)
        self._take()

    async def _work(self, chunk: list[tuple[Item, Settling]]) -> None:
        try:
            outcomes = await self._do([item for item, _ in chunk])
        except BaseException as exc:  # the chunk failed as a whole
            outcomes = [exc] * len(chunk)
            if not isinstance(exc, Exception):
                for _, done in chunk:
                    done.abandon()
                raise
        for (_, done), result in zip(chunk, outcomes, strict=True):
            if done.done():
                continue
            if isinstance(result, asyncio.CancelledError):
                done.abandon()
            elif isinstance(result, BaseException):
                done.set_exception(result)
            else:
                done.set_result(None)
