"""Redis restarts without persistence: live nodes re-assert their runs, waiters and accepted
cancels within a heartbeat, so cancels work again and no finish is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cancel_bus import BusUnavailable, CancelBus, Outcome, RunHandle, RunStatus
from node.embedded import EmbeddedServer

from ..helpers import WAIT, GatedRun, LoopingRun, eventually

LEASE = 1.5


@pytest.fixture
async def pair(own_server: EmbeddedServer, namespace: str) -> AsyncIterator[tuple[CancelBus, ...]]:
    buses = [CancelBus(own_server.url, namespace=namespace, lease_ttl=LEASE) for _ in range(2)]
    for bus in buses:
        await bus.start()
    yield tuple(buses)
    for bus in buses:
        await bus.close(cancel_timeout=2)


async def test_runs_are_reasserted_and_cancellable_after_data_loss(
    own_server: EmbeddedServer, pair: tuple[CancelBus, ...]
) -> None:
    a, b = pair
    run = await LoopingRun(a, app_name="app", user_id="u", session_id="s").start()
    own_server.restart()  # every key is gone

    async def reasserted() -> bool:
        info = await b.get_run(run.run_id)
        # the record is visible to b a moment before a's reconcile counts it
        return info is not None and info.status is RunStatus.RUNNING and a.stats.runs_reasserted > 0

    await eventually(reasserted, timeout=LEASE + 3)
    assert a.stats.runs_reasserted == 1
    assert a.node_id in {n.node_id for n in await b.list_nodes()}
    result = await b.cancel_session("app", "u", "s", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    await run.done()


async def test_accepted_cancel_and_waiter_survive_data_loss(
    own_server: EmbeddedServer, pair: tuple[CancelBus, ...]
) -> None:
    a, b = pair
    run = await GatedRun(a, then=RunHandle.checkpoint).start()  # no checkpoint yet
    ids = [run.run_id]
    # The cancel is accepted but not yet delivered when Redis forgets everything: make the
    # owner miss the message by stopping its listener first.
    a._node.subscription.unsubscribe()
    waiter = asyncio.create_task(b.cancel(ids[0], timeout=3 * LEASE + 5))
    await eventually(lambda: _is_stopping(b, ids[0]))
    own_server.restart()
    await a._node.subscription.subscribe(timeout=WAIT)  # the owner's subscriber comes back

    async def redelivered() -> bool:
        return run.handle is not None and run.handle.cancel_requested is not None

    await eventually(redelivered, timeout=3 * LEASE + 3)
    run.release()
    result = await asyncio.wait_for(waiter, WAIT)
    assert result.outcome is Outcome.CANCELLED
    await run.done()


async def test_finish_during_outage_is_recorded_after_restart(
    own_server: EmbeddedServer, pair: tuple[CancelBus, ...]
) -> None:
    a, b = pair
    run = await GatedRun(
        a, then=lambda run: run.emit("result"), app_name="app", user_id="u", session_id="s"
    ).start()
    ids = [run.run_id]
    own_server.kill()
    run.release()
    await run.done()
    own_server.start()

    async def recorded() -> bool:
        info = await b.get_run(ids[0])
        return info is not None and info.status is RunStatus.SUCCEEDED

    await eventually(recorded, timeout=LEASE + 5)
    info = await b.get_run(ids[0])
    assert info is not None and info.output == "result" and info.app_name == "app"


async def _is_stopping(bus: CancelBus, run_id: str) -> bool:
    info = await bus.get_run(run_id)
    return info is not None and info.stopping


@pytest.mark.parametrize("by_session", [False, True])
async def test_a_cancel_right_after_data_loss_waits_for_the_owner_not_for_not_found(
    own_server: EmbeddedServer, pair: tuple[CancelBus, ...], by_session: bool
) -> None:
    """Sent before the owner re-asserts its run (its heartbeat is up to an interval away), a
    cancel is not answered ``not_found``: Redis has lost the caller's own record too, so the
    caller asks again until the run is back."""
    a, b = pair
    run = await LoopingRun(a, app_name="app", user_id="u", session_id="s").start()
    await asyncio.to_thread(own_server.restart)  # every key is gone
    if by_session:
        result = await b.cancel_session("app", "u", "s", timeout=WAIT)
    else:
        result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    await run.done()
    assert a.stats.runs_reasserted == 1


async def test_an_unknown_run_after_data_loss_is_not_found_once_the_owners_had_their_lease(
    own_server: EmbeddedServer, pair: tuple[CancelBus, ...]
) -> None:
    _, b = pair
    await asyncio.to_thread(own_server.restart)
    with pytest.raises(BusUnavailable, match="whether it exists is not known yet"):
        await b.cancel("never-was", timeout=0.2)  # too soon to know
    result = await b.cancel("never-was", timeout=2 * LEASE + 2)  # a lease after the rejoins
    assert result.outcome is Outcome.NOT_FOUND
