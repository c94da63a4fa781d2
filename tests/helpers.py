"""Test helpers: runs driven step by step from the test, and abrupt node death."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from cancel_bus import CancelBus, RunHandle
from cancel_bus._batcher import ScriptBatcher
from cancel_bus._calls import ScriptCalls
from cancel_bus._keys import KeySpace
from cancel_bus._messages import MessageSigner
from cancel_bus._notices import Notices
from cancel_bus._redis import Client
from cancel_bus._scripts import ALL_SCRIPTS

from .faultproxy import FaultProxy

T = TypeVar("T")
WAIT = 10.0  # the bound of every wait in the tests


def spawn(name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """A node's ``Duties.spawn`` for a room built alone in a test: a plain task."""
    return asyncio.create_task(work, name=name)


def calls_on(redis: Client, namespace: str, retention: float = 3600) -> ScriptCalls:
    """The script calls of a node of ``namespace`` (unsigned), built alone for a test."""
    keys = KeySpace(namespace)
    signer = MessageSigner(namespace, [], time.time)
    notices = Notices(redis, keys, pub_command="PUBLISH", signer=signer)
    batches = ScriptBatcher(redis, ALL_SCRIPTS, spawn)
    return ScriptCalls(batches, keys, retention=retention, notices=notices)


class LoopingRun:
    """A run in a loop: emit a chunk, checkpoint, yield — until cancelled or told to finish."""

    def __init__(self, bus: CancelBus, step: float = 0.002, **run_options: Any) -> None:
        self.bus = bus
        self.step = step
        self.options = run_options
        self.started = asyncio.Event()
        self.finish = asyncio.Event()
        self.handle: RunHandle | None = None
        self.stopped_at: float | None = None  # monotonic: when its code stopped going on
        self.chunks_after_observed = 0
        self.task: asyncio.Task[None] | None = None

    @property
    def run_id(self) -> str:
        assert self.handle is not None
        return self.handle.run_id

    async def start(self) -> LoopingRun:
        self.task = asyncio.create_task(self._body())
        await asyncio.wait_for(self.started.wait(), WAIT)
        return self

    async def _body(self) -> None:
        async with self.bus.run(**self.options) as run:
            self.handle = run
            self.started.set()
            i = 0
            try:
                while not self.finish.is_set():
                    run.emit(f"c{i} ")
                    i += 1
                    run.checkpoint()
                    await asyncio.sleep(self.step)
            finally:
                self.stopped_at = time.monotonic()

    async def done(self) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, WAIT)


class GatedRun:
    """A run that starts, emits ``before`` if given, then waits at a gate with no checkpoint:
    the long step a cancel may meet. :meth:`release` lets it go on to ``then(run)`` (a
    checkpoint, more output...) and end."""

    def __init__(
        self,
        bus: CancelBus,
        then: Callable[[RunHandle], None] | None = None,
        before: str | None = None,
        **run_options: Any,
    ) -> None:
        self.bus = bus
        self.then = then
        self.before = before
        self.options = run_options
        self.started = asyncio.Event()
        self.gate = asyncio.Event()
        self.handle: RunHandle | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def run_id(self) -> str:
        assert self.handle is not None
        return self.handle.run_id

    async def start(self) -> GatedRun:
        self.task = asyncio.create_task(self._body())
        await asyncio.wait_for(self.started.wait(), WAIT)
        return self

    def release(self) -> None:
        self.gate.set()

    async def done(self) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, WAIT)

    async def _body(self) -> None:
        async with self.bus.run(**self.options) as run:
            self.handle = run
            if self.before is not None:
                run.emit(self.before)
            self.started.set()
            await self.gate.wait()
            if self.then is not None:
                self.then(run)


async def crash(bus: CancelBus, proxy: FaultProxy) -> None:
    """Make a node vanish without a word: its Redis link (through ``proxy``) goes dead and its
    background tasks stop, so it neither heartbeats, nor listens, nor leaves. Its runs' code
    goes on, as in a process that hangs; the test stops them."""
    proxy.refuse()
    bus._node.lease.stop()  # no fence either: the node is as good as gone
    await bus._node.duties.stop()
    bus._lifecycle.phase = "closed"


async def eventually(
    check: Callable[[], Awaitable[T | None]], timeout: float = WAIT, interval: float = 0.02
) -> T:
    """Poll an observable condition of a real system until true (never used as a sync point
    between our own tasks); -> the check's first true answer."""
    async with asyncio.timeout(timeout):
        while not (found := await check()):
            await asyncio.sleep(interval)
        return found


def redis_of(bus: CancelBus) -> Client:
    """The bus's command client: for tests that look at (or break) what it stores."""
    return bus._node.topology.client


def keys_of(bus: CancelBus) -> KeySpace:
    """The key names of the bus's namespace."""
    return bus._keys
