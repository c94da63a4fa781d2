"""The node checks its Redis server (``INFO``): an eviction policy that would drop live runs is
refused at start unless accepted (then a warning), evictions and a policy changed at run time make
the node unready, a server that hides INFO is said once, a server too old is refused — on real
servers, but for the version (no old binary here)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from cancel_bus import BusMisconfigured, CancelBus
from cancel_bus._keys import acl_rules
from cancel_bus._server import ServerCheck
from cancel_bus._types import BusStats
from node.embedded import EmbeddedServer

from ..helpers import WAIT, eventually, keys_of


@pytest.fixture
async def admin(own_server: EmbeddedServer) -> Any:
    client = aioredis.Redis(port=own_server.port, decode_responses=True)
    yield client
    await client.config_set("maxmemory", "0")
    await client.config_set("maxmemory-policy", "noeviction")
    await client.aclose()


async def test_an_evicting_policy_is_refused_unless_accepted(
    own_server: EmbeddedServer, admin: aioredis.Redis, namespace: str
) -> None:
    await admin.config_set("maxmemory-policy", "allkeys-lru")
    bus = CancelBus(own_server.url, namespace=namespace, lease_ttl=1)
    with pytest.raises(BusMisconfigured, match="maxmemory-policy is allkeys-lru: it would evict"):
        await bus.start()
    assert await admin.zcard(keys_of(bus).nodes) == 0  # the refused start left no node behind
    async with CancelBus(
        own_server.url, namespace=namespace, lease_ttl=1, accept_eviction=True
    ) as accepted:
        assert accepted.ready, accepted.problems
        (warning,) = accepted.warnings
        assert "maxmemory-policy is allkeys-lru (accepted)" in warning


async def test_evictions_and_a_policy_changed_at_run_time_make_the_node_unready(
    own_server: EmbeddedServer, admin: aioredis.Redis, namespace: str
) -> None:
    async with CancelBus(own_server.url, namespace=namespace, lease_ttl=0.5) as bus:
        assert bus.ready and not bus.warnings
        await admin.config_set("maxmemory-policy", "volatile-lru")  # an operator's change
        await eventually(lambda: _unready(bus, "maxmemory-policy is volatile-lru"))
        await admin.config_set("maxmemory-policy", "allkeys-random")
        for i in range(200):
            await admin.set(f"filler:{i}", "x" * 1000)
        await admin.config_set("maxmemory", "1")  # everything must go: evictions
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):  # still over, emptied
            await admin.set("trigger", "1")
        await eventually(lambda: _unready(bus, "Redis evicted"))
        assert bus.stats.redis_keys_evicted > 0
        await admin.config_set("maxmemory", "0")
        await admin.config_set("maxmemory-policy", "noeviction")
        await eventually(lambda: _ready(bus), timeout=WAIT)  # no new evictions: ready again


async def _unready(bus: CancelBus, words: str) -> bool:
    return any(words in problem for problem in bus.problems)


async def _ready(bus: CancelBus) -> bool:
    return bus.ready


async def test_a_server_that_hides_info_is_said_once_and_not_refused(
    own_server: EmbeddedServer,
    admin: aioredis.Redis,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules = [rule for rule in acl_rules(namespace).split() if rule != "+info"]
    await admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", *rules)
    url = f"redis://noinfo:pw@127.0.0.1:{own_server.port}/0"
    with caplog.at_level(logging.WARNING, logger="cancel_bus"):
        async with CancelBus(url, namespace=namespace, lease_ttl=0.5) as bus:
            await eventually(lambda: _looked(bus, 2))
            assert bus.ready, bus.problems
    said = [r.getMessage() for r in caplog.records if "cannot be checked" in r.getMessage()]
    assert len(said) == 1 and "NOPERM" in said[0], said


async def _looked(bus: CancelBus, times: int) -> bool:
    return bus._node.server.looks >= times


class _Store:
    """What a server of another version answers (no old binary to run here)."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info

    async def server_info(self) -> dict[str, Any]:
        return self.info


@pytest.mark.parametrize(
    ("version", "refused"), [("6.2.14", True), ("7.0.0", False), ("7.2.4", False), ("", False)]
)
async def test_a_server_too_old_for_script_flags_is_refused(version: str, refused: bool) -> None:
    info = {"redis_version": version, "maxmemory_policy": "noeviction", "evicted_keys": 0}
    check = ServerCheck(_Store(info), BusStats(), accept_eviction=False)  # type: ignore[arg-type]
    if refused:
        with pytest.raises(BusMisconfigured, match=f"Redis {version} is too old"):
            await check.at_start()
    else:
        await check.at_start()
