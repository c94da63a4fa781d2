"""A close never hangs and leaves nothing behind: every background task of a node is owned by its
``Duties`` and stopped within a bound — 200 nodes in a row, and nodes closed while Redis is
silent (a half-open connection) or refusing them, mid-reconnect."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from cancel_bus import CancelBus
from node.embedded import EmbeddedServer

from ..faultproxy import FaultProxy
from ..helpers import LoopingRun

pytestmark = pytest.mark.slow  # not in the fast tier

CLOSE_BOUND = 6.0  # the drain's cancel_timeout (1 s) thrice, the duties' stop (3 s): the worst


def _ours() -> list[asyncio.Task[object]]:
    """The tasks running cancel-bus's code (whatever their names)."""
    return [t for t in asyncio.all_tasks() if "/cancel_bus/" in _code_of(t)]


def _code_of(task: asyncio.Task[object]) -> str:
    code = getattr(task.get_coro(), "cr_code", None)
    return code.co_filename if code is not None else ""


async def test_two_hundred_nodes_close_in_a_row_without_a_task_left(
    redis_server: EmbeddedServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cancel_bus")
    for _ in range(200):
        bus = CancelBus(redis_server.url, namespace=namespace, lease_ttl=2)
        await bus.start()
        await bus.close()
        assert _ours() == []
    assert not [r for r in caplog.records if "did not stop" in r.getMessage()]


@pytest.mark.parametrize("fault", ["blackhole", "refuse", "cut"])
async def test_a_node_closed_while_redis_fails_it_stops_everything_in_time(
    redis_server: EmbeddedServer, namespace: str, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cancel_bus")
    for _ in range(5):
        proxy = await FaultProxy(redis_server.port).start()
        bus = CancelBus(proxy.url, namespace=namespace, lease_ttl=2)
        await bus.start()
        run = await LoopingRun(bus).start()
        getattr(proxy, fault)()  # silent, refusing, or every connection reset (reconnecting)
        began = time.monotonic()
        await bus.close(cancel_timeout=1)
        assert time.monotonic() - began < CLOSE_BOUND
        await run.done()
        assert _ours() == [], _ours()
        proxy.heal()
        await proxy.close()
    assert not [r for r in caplog.records if "did not stop" in r.getMessage()]
