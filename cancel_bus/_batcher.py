"""Batched script calls: the calls of one script made while Redis is busy leave as one call.

A start, a finish, a cancel is one call of a script; concurrent runs make many at once. They are
sent together, as one batch of that script (``_scripts.py``: the body runs once per call,
inside one atomic script), so they share one round trip, one pass through the connection pool
and one command to pack and parse, instead of one each. A call into a quiet batcher leaves at
once; others leave as a batch as soon as the event-loop turn that made them ends, unless
``MAX_IN_FLIGHT`` batches are already on their way: then calls wait (and gather) until one
comes back. So a burst of 100,000 ends is a queue, not 100,000 requests racing for connections,
and a batch holds at most ``MAX_CALLS`` calls and about ``MAX_BYTES`` of arguments: one node
never holds a Redis shard for long.

Calls of different scripts take turns: a burst of finishes does not hold up a cancel. (The lease
has calls, a batcher and connections of its own.) A call whose caller gave up before its batch
left is not sent. A call may carry a timeout: that much silence from Redis after its batch left
fails the call with :class:`BusUnavailable` — its script may still run, so only calls that are
safe to repeat use it. Silence is measured, not assumed (:class:`_Patience`): time queued behind
a burst, Redis working through this node's own batches ahead, or the event loop's own stall is
not Redis's fault. A batch that fails gives its error to each of its calls.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ._duties import Spawn
from ._errors import BusClosed, BusUnavailable
from ._redis import Client, Script

MAX_CALLS = 128
MAX_BYTES = 256 * 1024
MAX_IN_FLIGHT = 8


def _future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


@dataclass
class _Call:
    """One call: ``[keys, args]`` as JSON (encoded once, when queued), and its answer to be."""

    encoded: str
    timeout: float | None
    key: str  # the first key: it routes the batch (every key of a call shares the hash tag)
    answer: asyncio.Future[Any] = field(default_factory=_future)

    @classmethod
    def of(cls, keys: list[str], args: dict[str, Any], timeout: float | None) -> _Call:
        return cls(json.dumps([keys, args], separators=(",", ":")), timeout, keys[0])

    @property
    def size(self) -> int:
        return len(self.encoded)


class ScriptBatcher:
    """``spawn`` starts a batch's send as the node's background work (its owner stops them)."""

    def __init__(self, redis: Client, scripts: dict[str, str], spawn: Spawn) -> None:
        self._scripts: dict[str, Script] = {
            name: redis.register_script(text) for name, text in scripts.items()
        }
        self._spawn = spawn
        self._pending: dict[str, deque[_Call]] = {}
        self._in_flight = 0
        self._flush_scheduled = False
        self.heard = 0.0  # loop time Redis last answered a batch

    @property
    def in_flight(self) -> int:
        """Batches sent and not answered yet."""
        return self._in_flight

    async def call(
        self, name: str, keys: list[str], args: dict[str, Any], timeout: float | None = None
    ) -> Any:
        """The answer of one call of script ``name``; raises what redis-py raises. A call into
        a quiet batcher leaves at once, from the caller's own task: no wait for a batch."""
        if not self._in_flight and not self._pending:
            call = _Call.of(keys, args, timeout)
            self._in_flight += 1
            try:
                await self._send(self._scripts[name], [call])
            finally:
                self._in_flight -= 1
                self._schedule_flush()
            return call.answer.result()
        return await self.submit(name, keys, args, timeout)

    def submit(
        self, name: str, keys: list[str], args: dict[str, Any], timeout: float | None = None
    ) -> asyncio.Future[Any]:
        """Queue one call of script ``name`` for the next batch; -> the future of its answer
        (or of what redis-py raised)."""
        call = _Call.of(keys, args, timeout)
        self._pending.setdefault(name, deque()).append(call)
        self._schedule_flush()
        return call.answer

    def _schedule_flush(self) -> None:
        if self._pending and not self._flush_scheduled and self._in_flight < MAX_IN_FLIGHT:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send batches while fewer than ``MAX_IN_FLIGHT`` are on their way, the scripts taking
        turns (a burst of finishes does not hold up a cancel)."""
        self._flush_scheduled = False
        while self._pending and self._in_flight < MAX_IN_FLIGHT:
            name = next(iter(self._pending))
            calls = self._pending.pop(name)
            batch = _take_batch(calls)
            if calls:
                self._pending[name] = calls  # to the back of the line
            if batch:
                self._send_soon(self._scripts[name], batch)

    def _send_soon(self, script: Script, batch: list[_Call]) -> None:
        try:
            task = self._spawn("a batch of script calls", self._send(script, batch))
        except BusClosed as exc:  # the node's background work is stopped: nothing leaves
            _fail(batch, exc)
            return
        self._in_flight += 1
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._in_flight -= 1
        self._schedule_flush()

    async def _send(self, script: Script, batch: list[_Call]) -> None:
        payload = f"[{','.join(c.encoded for c in batch)}]"
        timeouts = [c.timeout for c in batch if c.timeout is not None]
        try:  # redis-py loads the script and calls again if the server lacks it
            async with _Patience(self, min(timeouts) if timeouts else None):
                answers = await script(keys=[batch[0].key], args=[payload])
            self.heard = asyncio.get_running_loop().time()
        except TimeoutError:
            _fail(batch, BusUnavailable("no answer from Redis within the call's timeout"))
            return
        except BaseException as exc:  # the batch failed as a whole (connection, cancellation)
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for call, answer in zip(batch, answers, strict=True):
            if not call.answer.done():
                call.answer.set_result(answer)


class _Patience:
    """How long a batch waits for Redis: until Redis has been silent for ``timeout`` per batch it
    owes this batcher. Redis runs the scripts of every connection it read in one turn before it
    writes any reply, so a batch's answer may wait for all of this node's batches in flight; the
    clock starts when the batch leaves and again whenever Redis answers one of them, and allows
    one ``timeout`` per batch still owed, ``MAX_IN_FLIGHT + 1`` timeouts at most in all. A check
    that runs late means the event loop itself stalled (a GC pass, a long turn) and an answer may
    be waiting unread, so it looks again a quarter timeout later instead of blaming Redis. Past
    it, the wait raises ``TimeoutError`` (an ``asyncio.timeout`` that this class moves)."""

    def __init__(self, batcher: ScriptBatcher, timeout: float | None) -> None:
        self._batcher = batcher
        self._timeout = timeout
        self._scope = asyncio.timeout(None)
        self._check_handle: asyncio.TimerHandle | None = None
        self._sent = self._limit = 0.0

    async def __aenter__(self) -> None:
        await self._scope.__aenter__()
        if self._timeout is not None:
            loop = asyncio.get_running_loop()
            self._sent = loop.time()
            self._limit = self._sent + self._timeout * (MAX_IN_FLIGHT + 1)
            self._check_at(self._sent + self._timeout)

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._check_handle is not None:
            self._check_handle.cancel()
        await self._scope.__aexit__(*exc_info)

    def _check_at(self, due: float) -> None:
        self._check_handle = asyncio.get_running_loop().call_at(due, self._check, due)

    def _check(self, due: float) -> None:
        assert self._timeout is not None
        now = asyncio.get_running_loop().time()
        if now - due > self._timeout / 4:  # the loop was stalled: not Redis's silence
            again = now + self._timeout / 4
        else:
            owed = max(1, self._batcher.in_flight)
            again = max(self._sent, self._batcher.heard) + self._timeout * owed
        again = min(again, self._limit)
        if again <= now:
            self._scope.reschedule(now)
        else:
            self._check_at(again)


def _take_batch(calls: deque[_Call]) -> list[_Call]:
    """Take the next batch off the front of ``calls`` (skipping those given up)."""
    batch: list[_Call] = []
    size = 0
    while calls and len(batch) < MAX_CALLS:
        call = calls[0]
        if call.answer.done():  # its caller gave up (a timeout, a cancellation)
            calls.popleft()
            continue
        if batch and size + call.size > MAX_BYTES:
            break
        batch.append(calls.popleft())
        size += call.size
    return batch


def _fail(batch: list[_Call], exc: BaseException) -> None:
    """Give the batch's error to each of its calls still waiting (a cancellation cancels them)."""
    for call in batch:
        if call.answer.done():
            continue
        if isinstance(exc, Exception):
            call.answer.set_exception(exc)
        else:
            call.answer.cancel()
