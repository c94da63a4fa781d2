"""Shared fixtures: one real Redis server per test session (started here, on a free loopback
port), a fresh namespace per test, and a factory of started buses that are closed afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from cancel_bus import CancelBus
from node.embedded import EmbeddedServer

from .faultproxy import FaultProxy

BusFactory = Callable[..., Awaitable[CancelBus]]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of the test's own, for faults that hit everyone on it (restart, SIGSTOP)."""
    server = EmbeddedServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server: EmbeddedServer) -> str:
    return redis_server.url


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def raw_redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
async def make_bus(redis_url: str, namespace: str) -> AsyncIterator[BusFactory]:
    buses: list[CancelBus] = []

    async def factory(**options: Any) -> CancelBus:
        options.setdefault("namespace", namespace)
        options.setdefault("lease_ttl", 3.0)
        bus = CancelBus(options.pop("url", redis_url), **options)
        await bus.start()
        buses.append(bus)
        return bus

    yield factory
    for bus in buses:
        await bus.close(cancel_timeout=2.0)


@pytest.fixture
async def proxy(redis_server: EmbeddedServer) -> AsyncIterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's server."""
    fault_proxy = await FaultProxy(redis_server.port).start()
    yield fault_proxy
    await fault_proxy.close()
