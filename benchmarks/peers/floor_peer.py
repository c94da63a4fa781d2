"""The floor, measured by the peers' own protocol (same random delay, same signalling): the
client PUBLISHes a token; the worker's subscriber task sets an ``asyncio.Event``, and the task
awaiting it records the time it woke ("observed"). Raw redis-py asyncio; nothing is confirmed.

A machine that idled for the random delay wakes up slower than one that is busy (on this VM a
hop after 0.3 s idle takes several times a hop right after another), so the peers are divided
by this floor, not by the one measured back to back."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

from redis.asyncio import Redis

from ._peer import MAX_DELAY, URL, WAIT, Sample, Signals, main, tokens, write_samples

CHANNEL = "bench:floor"


def worker() -> None:
    async def serve() -> None:
        lists = Signals()
        pubsub = Redis.from_url(URL, decode_responses=True).pubsub()
        await pubsub.subscribe(CHANNEL)
        woken = asyncio.Event()
        tokens: list[str] = []

        async def wake() -> None:
            while True:
                await woken.wait()
                woken.clear()
                for token in tokens:
                    lists.observed(token)
                tokens.clear()

        waker = asyncio.create_task(wake())
        while not waker.done():
            message = await pubsub.get_message(timeout=1.0)
            if message is not None and message["type"] == "message":
                tokens.append(message["data"])
                woken.set()

    asyncio.run(serve())


def client(n: int, out: Path) -> None:
    async def measure() -> list[Sample]:
        lists = Signals()
        redis = Redis.from_url(URL, decode_responses=True)
        for _ in range(int(WAIT / 0.05)):  # until the worker has subscribed
            if (await redis.pubsub_numsub(CHANNEL))[0][1]:
                break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"no subscriber on {CHANNEL} within {WAIT}s")

        async def sample(token: str) -> Sample:
            await asyncio.sleep(random.uniform(0, MAX_DELAY))
            started = time.time_ns()
            await redis.publish(CHANNEL, token)
            hop = lists.wait_observed(token) - started
            return hop, hop

        return [await sample(token) for token in tokens(n)]

    write_samples(asyncio.run(measure()), out)


if __name__ == "__main__":
    main(worker, client)
