"""Replica processes shared by the integration tests; and as a2a-sdk 0.3 and 1.x cannot be
installed together, only the A2A tests of the one that is are collected."""

import uuid
from collections.abc import AsyncIterator, Iterator
from importlib.metadata import PackageNotFoundError, version

import httpx
import pytest

from cancel_bus import CancelBus
from node.embedded import EmbeddedServer

from ..conftest import BusFactory
from ..helpers import WAIT
from .replica import Replica, running

TRPC_REPLICA = "tests.integrations.trpc_replica"
A2A_V1_REPLICA = "tests.integrations.a2a_v1_replica"
AGENTS_REPLICA = "tests.integrations.agents_replica"
FRAMEWORKS_REPLICA = "tests.integrations.frameworks_replica"

_A2A_TESTS = {
    "0": ["test_a2a.py", "test_a2a_differential.py"],
    "1": ["test_a2a_v1.py", "test_a2a_v1_differential.py"],
}

try:
    _MAJOR = version("a2a-sdk").split(".")[0]
except PackageNotFoundError:
    _MAJOR = ""

collect_ignore = [name for major, names in _A2A_TESTS.items() if major != _MAJOR for name in names]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """A client of the replicas' HTTP routes."""
    async with httpx.AsyncClient(timeout=WAIT * 2) as client:
        yield client


@pytest.fixture
async def ops(make_bus: BusFactory) -> CancelBus:
    """A bus of the test's own, to look at the records."""
    return await make_bus()


@pytest.fixture(scope="session")
def replica_namespace() -> str:
    """The namespace of the replica processes shared by the tests of a session."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def trpc_replicas(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[list[Replica]]:
    """Replicas A and B of trpc-agent (and its A2A service), as OS processes."""
    with running(TRPC_REPLICA, 2, redis_server.url, replica_namespace) as replicas:
        yield replicas


@pytest.fixture(scope="session")
def a2a_v1_replicas(
    redis_server: EmbeddedServer, replica_namespace: str
) -> Iterator[list[Replica]]:
    """Replicas A and B of trpc-agent's a2a-sdk 1.x service, as OS processes."""
    with running(A2A_V1_REPLICA, 2, redis_server.url, replica_namespace) as replicas:
        yield replicas


@pytest.fixture(scope="session")
def agents_replicas(
    redis_server: EmbeddedServer, replica_namespace: str
) -> Iterator[list[Replica]]:
    """Replicas A and B of the openai-agents and LangGraph integrations, as OS processes."""
    with running(AGENTS_REPLICA, 2, redis_server.url, replica_namespace) as replicas:
        yield replicas


@pytest.fixture(scope="session")
def frameworks_replicas(
    redis_server: EmbeddedServer, replica_namespace: str
) -> Iterator[list[Replica]]:
    """Replicas A and B of the agno, google-adk and pydantic-ai integrations, as OS processes."""
    with running(FRAMEWORKS_REPLICA, 2, redis_server.url, replica_namespace) as replicas:
        yield replicas


@pytest.fixture
def frameworks_victim(redis_server: EmbeddedServer, replica_namespace: str) -> Iterator[Replica]:
    """A third replica of those integrations, to be killed (a short lease: found dead soon)."""
    with running(FRAMEWORKS_REPLICA, 1, redis_server.url, replica_namespace, lease_ttl=2.0) as [
        victim
    ]:
        yield victim
