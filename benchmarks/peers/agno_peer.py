"""agno's own cancellation across processes: its ``RedisRunCancellationManager`` against the
cancel-bus adapter (``cancel_bus.integrations.agno``), the manager chosen by
``BENCH_AGNO_MANAGER`` (``redis`` or ``bus``), both on the same server, with the same agent loop:
an agno agent whose model streams a chunk and yields, forever (each streamed event is one of
agno's checks, ``araise_if_cancelled``).

``worker`` runs the agent on the runs the client queues; ``client N OUT`` measures N cancels in
the peers' protocol (``_peer``): ``Agent.acancel_run(run_id)`` from the client's process (agno's
own call, through the client's manager), observed where the run's stream yields agno's
``RunCancelledEvent``; "confirmed" is when ``acancel_run`` answered (agno has no call that waits
for the run's end). Then the client queues one more run, SIGKILLs the worker and asks
``acancel_run`` again: right after the kill and a lease later (OUT's ``killed``).
``hot OUT``: one process, one registered run: ns per check, and Redis commands per check.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import timeit
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from agno.agent import Agent
from agno.models.base import Model
from agno.models.response import ModelResponse
from agno.run import cancel
from agno.run.agent import RunCancelledEvent
from agno.run.cancellation_management import RedisRunCancellationManager
from redis.asyncio import Redis

from cancel_bus import CancelBus
from cancel_bus.integrations import agno as agno_bus

from ._peer import URL, ExitWatcher, Sample, Signals, tokens, write_samples

MANAGER = os.environ.get("BENCH_AGNO_MANAGER", "bus")
JOBS = "bench:agno:jobs"
NAMESPACE = "agno-peer"
LEASE = 3.0  # the bus nodes' lease: a killed worker's runs are resolved within it
HOT_CALLS = 20_000  # checks per timing (a tenth of that through Redis: each is a round trip)
HOT_REPEATS = 5


@dataclass
class Loop(Model):
    """Streams a chunk, yields to the loop, forever: a model at full speed."""

    id: str = "loop"

    async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ModelResponse]:
        while True:
            yield ModelResponse(role="assistant", content=".")
            await asyncio.sleep(0)

    def invoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise NotImplementedError

    async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise NotImplementedError

    def invoke_stream(self, *args: Any, **kwargs: Any) -> Iterator[ModelResponse]:
        raise NotImplementedError

    def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]

    def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
        return response  # type: ignore[no-any-return]


async def _install() -> CancelBus | None:
    """Install the manager under test in this process (the bus's: on a started bus)."""
    if MANAGER == "redis":
        manager = RedisRunCancellationManager(
            redis_client=redis.Redis.from_url(URL), async_redis_client=Redis.from_url(URL)
        )
        cancel.set_cancellation_manager(manager)
        return None
    bus = CancelBus(URL, namespace=NAMESPACE, lease_ttl=LEASE)
    await bus.start()
    agno_bus.install(bus)
    return bus


async def _job(agent: Agent, signals: Signals, run_id: str) -> None:
    signals.started(run_id)
    async for event in agent.arun("go", stream=True, stream_events=True, run_id=run_id):
        if isinstance(event, RunCancelledEvent):
            signals.observed(run_id)


def worker() -> None:
    async def serve() -> None:
        await _install()
        queue = Redis.from_url(URL, decode_responses=True)
        signals = Signals()
        agent = Agent(model=Loop(), telemetry=False)
        jobs: set[asyncio.Task[None]] = set()
        while True:
            popped = await queue.blpop([JOBS])
            assert popped is not None
            task = asyncio.create_task(_job(agent, signals, str(popped[1])))
            jobs.add(task)
            task.add_done_callback(jobs.discard)

    asyncio.run(serve())


def client(n: int, out: Path) -> None:
    async def measure() -> dict[str, Any]:
        bus = await _install()
        signals = Signals()

        async def sample(run_id: str) -> Sample:
            signals.client.rpush(JOBS, run_id)
            await asyncio.to_thread(signals.wait_started, run_id)
            started = time.time_ns()
            assert await Agent.acancel_run(run_id), "the cancel did not reach the run"
            answered = time.time_ns() - started
            return signals.wait_observed(run_id) - started, answered

        samples = [await sample(run_id) for run_id in tokens(n)]
        killed = await _killed(signals, bus)
        if bus is not None:
            await bus.close()
        return {"samples": samples, "killed": killed}

    measured = asyncio.run(measure())
    write_samples(measured["samples"], out)
    out.write_text(json.dumps({**json.loads(out.read_text()), "killed": measured["killed"]}))


async def _killed(signals: Signals, bus: CancelBus | None) -> dict[str, Any]:
    """Queue a run, SIGKILL the worker running it; what ``acancel_run`` answers at once and a
    lease (plus a sweep) later, and how the bus recorded the run."""
    run_id = f"killed-{os.getpid()}"
    signals.client.rpush(JOBS, run_id)
    pid = await asyncio.to_thread(signals.wait_started, run_id)
    exited = ExitWatcher(pid)
    os.kill(pid, signal.SIGKILL)
    await asyncio.to_thread(exited.wait)
    at_once = await Agent.acancel_run(run_id)
    await asyncio.sleep(LEASE + 3.0)
    later = await Agent.acancel_run(run_id)
    record = await bus.get_run(run_id) if bus is not None else None
    return {
        "at_once": at_once,
        "after_lease": later,
        "record": None if record is None else f"{record.status.value}, {record.end_reason}",
    }


def hot(out: Path) -> None:
    """ns per ``araise_if_cancelled`` of a registered run (best of ``HOT_REPEATS``), an empty
    coroutine's await as its floor; Redis commands per check (``INFO`` around a batch)."""

    async def measure() -> dict[str, float]:
        bus = await _install()
        run_id = f"hot-{os.getpid()}"
        await cancel.aregister_run(run_id)
        calls = HOT_CALLS // 10 if MANAGER == "redis" else HOT_CALLS
        server = Redis.from_url(URL)

        async def noop(run_id: str) -> None:
            return None

        async def timing(check: Any) -> float:
            best = float("inf")
            for _ in range(HOT_REPEATS):
                began = time.perf_counter_ns()
                for _ in range(calls):
                    await check(run_id)
                best = min(best, (time.perf_counter_ns() - began) / calls)
            return best

        before = (await server.info("stats"))["total_commands_processed"]
        for _ in range(calls):
            await cancel.araise_if_cancelled(run_id)
        after = (await server.info("stats"))["total_commands_processed"]
        figures = {
            "check_ns": await timing(cancel.araise_if_cancelled),
            "floor_ns": await timing(noop),
            "sync_check_ns": min(
                timeit.repeat(lambda: cancel.raise_if_cancelled(run_id), number=calls, repeat=5)
            )
            * 1e9
            / calls,
            "commands_per_check": (after - before - 1) / calls,  # less the first INFO
        }
        await cancel.acleanup_run(run_id)
        await server.aclose()
        if bus is not None:
            agno_bus.uninstall()
            await bus.close()
        return figures

    out.write_text(json.dumps(asyncio.run(measure())))


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    elif sys.argv[1] == "hot":
        hot(Path(sys.argv[2]))
    else:
        client(int(sys.argv[2]), Path(sys.argv[3]))
