"""Selector cancels on a real server: a dry run counts, a cancel stops every matching run and
nothing else, and a tombstone catches matching runs started (or queued) after it."""

from __future__ import annotations

import asyncio
import time

import pytest

from cancel_bus import InvalidArgument, Outcome, RunCancelled, RunStatus

from ..conftest import BusFactory
from ..helpers import WAIT, LoopingRun


async def test_a_dry_run_counts_and_a_cancel_stops_only_the_matching_runs(
    make_bus: BusFactory,
) -> None:
    a, b = await make_bus(), await make_bus()
    alice = [
        await LoopingRun(a, app_name="app", user_id="alice", session_id=f"s{i}").start()
        for i in range(3)
    ]
    tagged = await LoopingRun(
        b, app_name="app", user_id="bob", session_id="s1", metadata={"tier": "free", "n": 1}
    ).start()
    bystander = await LoopingRun(b, app_name="app", user_id="bob", session_id="s2").start()

    preview = await b.cancel_where(user_id="alice", dry_run=True)
    assert preview.dry_run and preview.matched == 3
    assert set(preview.run_ids) == {run.run_id for run in alice}
    assert all(run.handle and run.handle.cancel_requested is None for run in alice)
    by_metadata = await a.cancel_where(metadata={"tier": "free"}, dry_run=True)
    assert by_metadata.run_ids == [tagged.run_id]
    assert (await a.cancel_where(metadata={"tier": "paid"}, dry_run=True)).matched == 0
    assert (await a.cancel_where(node_id=b.node_id, dry_run=True)).matched == 2

    done = await b.cancel_where(user_id="alice", reason="ops: stop alice", wait=True)
    assert done.matched == 3 and not done.dry_run and done.tombstone is None
    assert [r.outcome for r in done.results] == [Outcome.CANCELLED] * 3
    for run in alice:
        await run.done()
    for run in (tagged, bystander):
        assert run.handle is not None and run.handle.cancel_requested is None
        run.finish.set()
        await run.done()
    assert await b.tombstones() == []  # no hold asked: the operation's own is gone


async def test_a_tombstone_catches_a_run_started_after_the_cancel(make_bus: BusFactory) -> None:
    a, b = await make_bus(), await make_bus()
    result = await a.cancel_where(user_id="carol", ttl=30, reason="carol is blocked")
    assert result.matched == 0 and result.tombstone is not None
    await asyncio.sleep(0.1)  # a run started 100 ms after the cancel...
    with pytest.raises(RunCancelled) as caught:
        async with b.run(app_name="app", user_id="carol", session_id="s"):
            pass  # ... never starts
    assert caught.value.request is not None and caught.value.request.reason == "carol is blocked"
    (recorded,) = await b.list_runs(status=RunStatus.CANCELLED, user_id="carol")
    assert recorded.started_at is None and recorded.cancel_reason == "carol is blocked"
    queued = await b.enqueue(app_name="app", user_id="carol", session_id="q")
    assert queued.status is RunStatus.CANCELLED
    async with b.run(app_name="app", user_id="dave", session_id="s"):  # not matched: runs
        pass

    (tombstone,) = await b.tombstones()
    assert tombstone.tombstone_id == result.tombstone.tombstone_id
    assert tombstone.selector == {"user_id": "carol"}
    assert tombstone.expires_at - time.time() > 20
    assert await b.remove_tombstone(tombstone.tombstone_id)
    assert not await b.remove_tombstone(tombstone.tombstone_id)
    async with b.run(app_name="app", user_id="carol", session_id="after") as lifted:
        lifted.emit("runs again")


async def test_a_tombstone_expires(make_bus: BusFactory) -> None:
    a = await make_bus()
    await a.cancel_where(app_name="briefly", ttl=0.3)
    with pytest.raises(RunCancelled):
        async with a.run(app_name="briefly", user_id="u", session_id="s1"):
            pass
    deadline = time.monotonic() + WAIT
    while await a.tombstones():  # expiry is the server's: poll what it says
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    async with a.run(app_name="briefly", user_id="u", session_id="s2"):
        pass


async def test_bad_selectors_are_refused_before_anything_is_cancelled(
    make_bus: BusFactory,
) -> None:
    a = await make_bus()
    run = await LoopingRun(a, app_name="app", user_id="u", session_id="s").start()
    for bad in (
        {},
        {"user_id": "bad id"},
        {"metadata": {"nested": {"x": 1}}},
        {"metadata": ["not", "a", "dict"]},
        {"app_name": "app", "ttl": 30, "until": time.time() + 60},
        {"app_name": "app", "ttl": -1},
        {"app_name": "app", "ttl": 8 * 86400},
        {"app_name": "app", "started_before": "yesterday"},
        {"app_name": "app", "mode": "now"},
    ):
        with pytest.raises(InvalidArgument):
            await a.cancel_where(**bad)  # type: ignore[arg-type]
    assert run.handle is not None and run.handle.cancel_requested is None
    assert await a.tombstones() == []
    run.finish.set()
    await run.done()
