"""arq: ``Job.abort()`` (the worker runs with ``allow_abort_jobs=True``, defaults otherwise: it
looks for abort requests every ``poll_delay`` = 0.5 s, and ``abort()`` polls for the job's
result every 0.5 s). The job's task is cancelled: it observes a ``CancelledError``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker

from ._peer import URL, WAIT, Sample, Signals, main, tokens, write_samples


async def job(ctx: dict[str, Any], token: str) -> None:
    ctx["signals"].started(token)
    try:
        while True:  # noqa: ASYNC110 (a tight loop that yields, as a run between checkpoints)
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        ctx["signals"].observed(token)
        raise


async def _startup(ctx: dict[str, Any]) -> None:
    ctx["signals"] = Signals()


def worker() -> None:
    Worker(
        functions=[job],
        redis_settings=RedisSettings.from_dsn(URL),
        allow_abort_jobs=True,
        on_startup=_startup,
    ).run()


def client(n: int, out: Path) -> None:
    async def measure() -> list[Sample]:
        lists = Signals()
        pool = await create_pool(RedisSettings.from_dsn(URL))

        async def sample(token: str) -> Sample:
            arq_job = await pool.enqueue_job("job", token)
            assert arq_job is not None
            await asyncio.to_thread(lists.wait_started, token)
            started = time.time_ns()
            aborted = await arq_job.abort(timeout=WAIT)
            confirmed = time.time_ns() - started
            assert aborted, "arq did not confirm the abort"
            return lists.wait_observed(token) - started, confirmed

        samples = [await sample(token) for token in tokens(n)]
        await pool.aclose()
        return samples

    write_samples(asyncio.run(measure()), out)


if __name__ == "__main__":
    main(worker, client)
