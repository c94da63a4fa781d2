"""A batch's timeout measures Redis's silence, not this node's own queue or its event loop's stall
— on a real server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from cancel_bus import BusUnavailable
from cancel_bus._batcher import ScriptBatcher
from node.embedded import EmbeddedServer

from ..helpers import spawn

ANSWER = """
local calls = cjson.decode(ARGV[1])
local answers = {}
for i = 1, #calls do answers[i] = 'ok' end
return answers
"""


def spinning(ms: int) -> str:
    """A script that keeps Redis busy for ``ms`` milliseconds, then answers."""
    return f"""
local function now() local t = redis.call('TIME') return t[1] * 1e6 + t[2] end
local start = now()
repeat until now() - start >= {ms * 1000}
{ANSWER}"""


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_a_batch_queued_behind_this_nodes_own_batches_is_not_timed_out(
    client: aioredis.Redis,
) -> None:
    names = [f"spin{i}" for i in range(5)]  # scripts take turns: one batch each
    batcher = ScriptBatcher(client, {name: spinning(150) for name in names}, spawn)
    # Redis runs them one after another, 150 ms each, and may hold the replies of those it read
    # together until the last has run: 750 ms of silence, none of it idle
    answers = await asyncio.gather(*(batcher.call(name, ["k"], [], timeout=0.3) for name in names))
    assert answers == ["ok"] * len(names)


async def test_an_answer_left_unread_while_the_loop_stalled_is_not_a_timeout(
    client: aioredis.Redis,
) -> None:
    batcher = ScriptBatcher(client, {"answer": spinning(50)}, spawn)
    assert await batcher.call("answer", ["k"], []) == "ok"  # a connection is ready
    asyncio.get_running_loop().call_later(0.01, time.sleep, 0.5)  # a GC pass, a long turn
    # Redis answers after 50 ms; the loop reads it only after its timeout would have fired
    assert await batcher.call("answer", ["k"], [], timeout=0.2) == "ok"


async def test_a_silent_redis_still_fails_the_call_within_its_timeout(
    own_server: EmbeddedServer,
) -> None:
    client = aioredis.Redis.from_url(own_server.url, decode_responses=True)
    try:
        batcher = ScriptBatcher(client, {"answer": ANSWER}, spawn)
        assert await batcher.call("answer", ["k"], []) == "ok"
        own_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(BusUnavailable):
                await batcher.call("answer", ["k"], [], timeout=0.2)
            assert time.monotonic() - started < 1.0  # not the cap of nine timeouts
        finally:
            own_server.resume()
    finally:
        await client.aclose()
