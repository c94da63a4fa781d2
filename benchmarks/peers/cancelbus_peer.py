"""cancel-bus itself, measured exactly as its peers are (it runs in the benchmark's own venv).

cancel-bus has no job queue, so this script adds the smallest one: the client records a queued
run (``bus.enqueue``) and pushes its id on a Redis list; the worker node pops it and claims the
run (``bus.run(run_id=...)``), which checkpoints in a tight loop. The client's node cancels it
with ``bus.cancel(wait=True)``, which returns once the worker confirmed: that is "confirmed";
the run raising at its checkpoint is "observed"."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from redis.asyncio import Redis

from cancel_bus import CancelBus, Outcome, RunCancelled

from ._peer import URL, WAIT, Sample, Signals, main, tokens, write_samples

NAMESPACE = "peers"
JOBS = "bench:jobs"


async def _job(bus: CancelBus, lists: Signals, run_id: str) -> None:
    async with bus.run(run_id) as run:
        lists.started(run_id)
        try:
            while True:
                run.checkpoint()
                await asyncio.sleep(0)
        except RunCancelled:
            lists.observed(run_id)
            raise


def worker() -> None:
    async def serve() -> None:
        queue = Redis.from_url(URL, decode_responses=True)
        lists = Signals()
        async with CancelBus(URL, namespace=NAMESPACE, node_id="worker") as bus:
            jobs: set[asyncio.Task[None]] = set()
            while True:
                popped = await queue.blpop([JOBS])
                assert popped is not None  # no timeout: it waits for the next job
                task = asyncio.create_task(_job(bus, lists, str(popped[1])))
                jobs.add(task)
                task.add_done_callback(jobs.discard)

    asyncio.run(serve())


def client(n: int, out: Path) -> None:
    async def measure() -> list[Sample]:
        lists = Signals()
        async with CancelBus(URL, namespace=NAMESPACE, node_id="client") as bus:

            async def sample(run_id: str) -> Sample:
                await bus.enqueue(run_id)
                lists.client.rpush(JOBS, run_id)
                await asyncio.to_thread(lists.wait_started, run_id)
                started = time.time_ns()
                result = await bus.cancel(run_id, wait=True, timeout=WAIT)
                confirmed = time.time_ns() - started
                assert result.outcome is Outcome.CANCELLED, result.outcome
                return lists.wait_observed(run_id) - started, confirmed

            return [await sample(run_id) for run_id in tokens(n)]

    write_samples(asyncio.run(measure()), out)


if __name__ == "__main__":
    main(worker, client)
