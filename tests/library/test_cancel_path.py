"""The cancel path, measured: one cross-node cancel traced with ``sys.setprofile`` from
``cancel()`` to its answer (both buses in one process, so one profile sees both halves): the
library functions it calls, the modules they live in, and how often the path turns back into a
module it had left (the tasks of both nodes interleave: a switch counts). A coroutine resumed is
counted apart: it is not a call. The bounds are today's measure (DESIGN §13, "The cancel path,
measured"): a guard that the path does not grow, not yet the target of 12 modules and 15
re-entries.

``python -m tests.library.test_cancel_path redis://HOST:PORT/DB`` prints the trace."""

from __future__ import annotations

import asyncio
import dis
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from cancel_bus import CancelBus, CancelMode, Outcome

from ..conftest import BusFactory

LIBRARY = Path(__file__).resolve().parents[2] / "cancel_bus"
MAX_MODULES = 24  # measured 2026-12-06: 24 modules (_tracing: the cancel's span), 163 calls
MAX_REENTRIES = 50  # measured: 45-47 as the two nodes' tasks interleave (59 before)


SUSPENDABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


@functools.cache
def _first_resume(code: CodeType) -> int:
    """Where a new frame of ``code`` stands when the profiler first sees it."""
    return next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")


@dataclass
class Trace:
    """The library's function calls in order, as ``(module, function)``."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    resumptions: int = 0

    def profile(self, frame: FrameType, event: str, _: Any) -> None:
        """``sys.setprofile``'s hook: a call of a function of the core library. A suspended
        coroutine resumed is a "call" to the profiler too (its frame is past its first
        ``RESUME``); it is counted apart, not as a call."""
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if path.parent != LIBRARY:
            return
        if frame.f_code.co_flags & SUSPENDABLE and frame.f_lasti > _first_resume(frame.f_code):
            self.resumptions += 1
            return
        self.calls.append((path.stem, frame.f_code.co_qualname))

    @property
    def modules(self) -> list[str]:
        """The modules in the order first entered."""
        return list(dict.fromkeys(module for module, _ in self.calls))

    @property
    def reentries(self) -> int:
        """Calls into a module the path had left: each turn back is one."""
        seen: set[str] = set()
        count = 0
        previous = ""
        for module, _ in self.calls:
            if module != previous and module in seen:
                count += 1
            seen.add(module)
            previous = module
        return count


async def traced_cancel(make_bus: BusFactory) -> tuple[Trace, Outcome]:
    """A run on the owner waits for its cancel (a callback ends the wait); the caller, another
    node, cancels it and waits for the answer. Warmed up once so the trace is the steady state."""
    owner = await make_bus(lease_ttl=60.0)
    caller = await make_bus(lease_ttl=60.0)
    trace = Trace()

    async def once(traced: bool) -> Outcome:
        started = asyncio.Event()
        stopped = asyncio.Event()

        async def run() -> None:
            async with owner.run() as handle:
                handle.add_cancel_callback(lambda _: stopped.set())
                started.set()
                await stopped.wait()
                handle.checkpoint()

        task = asyncio.create_task(run())
        async with asyncio.timeout(10):
            await started.wait()
            (run_id,) = [handle.run_id for handle in owner.local_runs()]
            answer = await _profiled(
                trace if traced else None,
                lambda: caller.cancel(run_id, mode=CancelMode.CHECKPOINT, wait=True, timeout=5),
            )
            await asyncio.gather(task, return_exceptions=True)
        return answer.outcome

    await once(traced=False)
    return trace, await once(traced=True)


async def _profiled(trace: Trace | None, call: Callable[[], Awaitable[Any]]) -> Any:
    if trace is None:
        return await call()
    sys.setprofile(trace.profile)
    try:
        return await call()
    finally:
        sys.setprofile(None)


async def test_a_cross_node_cancel_passes_few_modules_in_one_direction(
    make_bus: BusFactory,
) -> None:
    trace, outcome = await traced_cancel(make_bus)
    assert outcome is Outcome.CANCELLED
    assert {"_bus", "_calls", "_inbox", "_local"} <= set(trace.modules)  # both halves were seen
    assert len(trace.modules) <= MAX_MODULES, trace.modules
    assert trace.reentries <= MAX_REENTRIES, trace.calls


def main() -> None:
    """Print the trace of one cross-node cancel against a server on ``argv[1]``."""
    url = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/15"

    async def measure() -> None:
        buses: list[CancelBus] = []

        async def make(**options: Any) -> CancelBus:
            bus = CancelBus(url, namespace="trace", **options)
            await bus.start()
            buses.append(bus)
            return bus

        try:
            trace, outcome = await traced_cancel(make)
        finally:
            for bus in buses:
                await bus.close()
        for module, function in trace.calls:
            print(f"{module:16} {function}")
        print(
            f"{outcome}: {len(trace.calls)} calls, {len(trace.modules)} modules, "
            f"{trace.reentries} re-entries, {trace.resumptions} resumptions"
        )

    asyncio.run(measure())


if __name__ == "__main__":
    main()
