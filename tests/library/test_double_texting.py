"""Double texting across processes: a second run of a busy session, on another node, rejects,
interrupts or rolls back the active run (``multitask_strategy``). Each node is a process of its
own (``session_runner.py``) on one server; the records are read from a bus here."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from cancel_bus import CancelBus, InvalidArgument, RunStatus, SessionBusy

from ..conftest import BusFactory
from ..helpers import WAIT
from .session_runner import APP, USER

Step = dict[str, Any]


class Runner:
    """One node process running one run of the session; its steps as it says them."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def step(self) -> Step:
        """The next thing it says (within the test's wait)."""
        assert self.process.stdout is not None
        async with asyncio.timeout(WAIT + 10):
            line = await self.process.stdout.readline()
        assert line, "the runner ended without a word"
        step: Step = json.loads(line)
        return step

    async def ended(self) -> int:
        """Its exit code, once it exits."""
        async with asyncio.timeout(WAIT + 10):
            return await self.process.wait()


Start = Callable[[str, str], Awaitable[Runner]]


@pytest.fixture
async def start(redis_url: str, namespace: str) -> AsyncIterator[Start]:
    """Start a runner process: ``await start(strategy, run_id)``, all on one session."""
    session = f"s-{uuid.uuid4().hex[:8]}"
    runners: list[Runner] = []

    async def launch(strategy: str, run_id: str) -> Runner:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.library.session_runner",
            redis_url,
            namespace,
            session,
            strategy,
            run_id,
            stdout=asyncio.subprocess.PIPE,
        )
        runners.append(Runner(process))
        return runners[-1]

    launch.session = session  # type: ignore[attr-defined]
    yield launch
    for runner in runners:
        if runner.process.returncode is None:
            runner.process.kill()
            await runner.process.wait()


def session_of(start: Start) -> str:
    return str(start.session)  # type: ignore[attr-defined]


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_a_second_run_on_another_node_interrupts_the_active_one(
    start: Start, make_bus: BusFactory, strategy: str
) -> None:
    ops = await make_bus()
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    await _ticked(ops, "first")

    second = await start(strategy, "second")
    assert await first.step() == {"cancelled": strategy}  # its code saw why
    begun = await second.step()
    assert begun["started"] == "second" and begun["interrupted"] == "first"
    assert await first.ended() == 0

    ended = await ops.get_run("first")
    assert ended is not None and ended.status is RunStatus.CANCELLED
    assert ended.cancel_cause is not None and ended.cancel_cause.value == strategy
    assert ended.requested_by == "second"  # who interrupted it
    if strategy == "interrupt":  # the new run reads what the old one had done
        assert ended.end_reason == "interrupted"
        assert ended.output.startswith("tick 0 ") and begun["interrupted_output"] == ended.output
    else:  # rolled back: nothing of it is kept
        assert ended.end_reason == "rolled_back"
        assert ended.output == "" and begun["interrupted_output"] == ""
    active = await ops.session_run(APP, USER, session_of(start))
    assert active is not None and active.run_id == "second"


async def test_reject_leaves_the_active_run_alone(start: Start, make_bus: BusFactory) -> None:
    ops = await make_bus()
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    second = await start("reject", "second")
    assert await second.step() == {"busy": "first"}
    await _ticked(ops, "first")
    run = await ops.get_run("first")
    assert run is not None and run.status is RunStatus.RUNNING and run.cancel_requested_at is None


async def test_two_follow_ups_racing_end_with_one_active_run_and_true_answers(
    start: Start, make_bus: BusFactory
) -> None:
    """Two nodes interrupt the same run at once: one run of the three is active at the end; the
    others ended interrupted, each by a run that started, and each process said so."""
    ops = await make_bus()
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    racers = {name: await start("interrupt", name) for name in ("b", "c")}
    said: dict[str, list[Step]] = {"first": [await first.step()], "b": [], "c": []}
    for name, runner in racers.items():
        said[name].append(await runner.step())
    assert said["first"] == [{"cancelled": "interrupt"}]
    started = [name for name in racers if "started" in said[name][0]]
    assert started, said  # at least one of them started; one that did not was told busy
    for name in set(racers) - set(started):
        assert said[name] == [{"busy": said[name][0]["busy"]}]
    if len(started) == 2:  # both started: the later one interrupted the earlier one (which
        # may have found the session free once the other's interrupt had ended "first")
        earlier = next(n for n in started if any(said[m][0]["interrupted"] == n for m in started))
        said[earlier].append(await racers[earlier].step())
        assert said[earlier][-1] == {"cancelled": "interrupt"}
    active = await ops.session_run(APP, USER, session_of(start))
    assert active is not None and active.status is RunStatus.RUNNING
    for run_id in ("first", "b", "c"):
        run = await ops.get_run(run_id)
        if run is None or run_id == active.run_id:
            continue
        assert run.status is RunStatus.CANCELLED and run.end_reason == "interrupted", run
        assert run.requested_by in started  # interrupted by a run that started


async def test_follow_ups_enqueued_on_other_nodes_run_one_at_a_time_in_arrival_order(
    start: Start, make_bus: BusFactory
) -> None:
    """Two follow-ups, each on a node of its own, wait queued (visible, in order) while the
    session's run goes on; each starts, on the node that asked, when the one before it ends."""
    ops = await make_bus()
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    queued = await _queue(start, "b", "c")
    for name in ("b", "c"):
        run = await ops.get_run(name)
        assert run is not None and run.status is RunStatus.QUEUED and run.started_at is None
    await _ticked(ops, "first")  # the session's run was left alone
    assert (await ops.session_run(APP, USER, session_of(start))).run_id == "first"  # type: ignore[union-attr]

    await ops.cancel("first", timeout=WAIT)
    assert await first.step() == {"cancelled": "user"}
    assert (await queued["b"].step())["started"] == "b"
    c = await ops.get_run("c")
    assert c is not None and c.status is RunStatus.QUEUED  # still behind b
    await ops.cancel("b", timeout=WAIT)
    assert (await queued["c"].step())["started"] == "c"
    runs = {name: await ops.get_run(name) for name in ("first", "b", "c")}
    b, c = runs["b"], runs["c"]
    assert b is not None and c is not None and c.started_at is not None
    assert b.finished_at is not None and b.finished_at <= c.started_at  # one at a time
    assert b.owner != c.owner  # each on the node that asked
    await ops.cancel("c", timeout=WAIT)


async def test_follow_ups_enqueued_at_once_start_in_the_order_redis_received_them(
    start: Start, make_bus: BusFactory
) -> None:
    ops = await make_bus()
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    racers = {name: await start("enqueue", name) for name in ("b", "c")}  # asked at once
    for name, runner in racers.items():
        assert await runner.step() == {"queued": name}
    records = {name: await ops.get_run(name) for name in racers}
    order = sorted(racers, key=lambda name: records[name].created_at)  # type: ignore[union-attr]
    await ops.cancel("first", timeout=WAIT)
    assert (await racers[order[0]].step())["started"] == order[0]
    later = await ops.get_run(order[1])
    assert later is not None and later.status is RunStatus.QUEUED
    await ops.cancel(order[0], timeout=WAIT)
    assert (await racers[order[1]].step())["started"] == order[1]
    await ops.cancel(order[1], timeout=WAIT)


async def test_a_session_cancel_stops_the_active_run_and_the_queued_ones(
    start: Start, make_bus: BusFactory
) -> None:
    ops = await make_bus()
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    queued = await _queue(start, "b", "c")
    result = await ops.cancel_session(APP, USER, session_of(start), timeout=WAIT)
    assert result.outcome.value == "cancelled" and result.run is not None
    assert result.run.run_id == "first"
    assert {r.run.run_id: r.outcome.value for r in result.descendants if r.run} == {
        "b": "cancelled",
        "c": "cancelled",
    }
    assert await first.step() == {"cancelled": "user"}
    for name in ("b", "c"):  # their callers were told: they never started
        assert await queued[name].step() == {"never_started": "user"}
        assert await queued[name].ended() == 0
        run = await ops.get_run(name)
        assert run is not None and run.status is RunStatus.CANCELLED and run.started_at is None
    assert await ops.session_run(APP, USER, session_of(start)) is None


async def test_a_queued_run_cancelled_or_lost_gives_its_turn_to_the_next(
    start: Start, make_bus: BusFactory
) -> None:
    """A queued run cancelled by id, and one whose node dies while it waits, leave the queue;
    the run behind them gets the turn."""
    ops = await make_bus(lease_ttl=2.0)
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    queued = await _queue(start, "b", "c", "d")
    assert (await ops.cancel("b", timeout=WAIT)).outcome.value == "cancelled"
    assert await queued["b"].step() == {"never_started": "user"}
    queued["c"].process.kill()  # its node dies while c waits: reaped once its lease is out
    await queued["c"].process.wait()
    await ops.cancel("first", timeout=WAIT)
    assert (await queued["d"].step())["started"] == "d"  # after c was resolved
    c = await ops.get_run("c")
    assert c is not None and c.status is RunStatus.FAILED and c.end_reason == "owner_lost"
    assert c.started_at is None
    await ops.cancel("d", timeout=WAIT)


async def test_a_queued_wait_abandoned_withdraws_the_run(make_bus: BusFactory) -> None:
    """The task waiting for its turn is cancelled (a client gone): the queued run is recorded
    cancelled, and nothing of it starts later."""
    owner, other = await make_bus(), await make_bus()
    session = {"app_name": "a", "user_id": "u", "session_id": "s"}
    queued = asyncio.Event()
    async with owner.run("active", **session):

        async def follow_up() -> None:
            async with other.run(
                "later", **session, multitask_strategy="enqueue", on_queued=lambda _: queued.set()
            ):
                raise AssertionError("it must never start")

        task = asyncio.create_task(follow_up())
        async with asyncio.timeout(WAIT):
            await queued.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        later = await owner.get_run("later")
        assert later is not None and later.status is RunStatus.CANCELLED
        assert later.cancel_cause is not None and later.cancel_cause.value == "client_disconnect"
    assert await owner.session_run("a", "u", "s") is None  # the turn went to nobody


async def test_an_on_queued_that_raises_withdraws_the_run(make_bus: BusFactory) -> None:
    owner, other = await make_bus(), await make_bus()
    session = {"app_name": "a", "user_id": "u", "session_id": "s"}

    def refuse(_: object) -> None:
        raise LookupError("the caller's own bug")

    async with owner.run("active", **session):
        with pytest.raises(LookupError):
            async with other.run(
                "later", **session, multitask_strategy="enqueue", on_queued=refuse
            ):
                raise AssertionError("it must never start")
        later = await owner.get_run("later")
        assert later is not None and later.status is RunStatus.CANCELLED
    assert await owner.session_run("a", "u", "s") is None  # nobody holds the session


async def test_a_strategy_needs_a_session_and_a_known_name(make_bus: BusFactory) -> None:
    bus: CancelBus = await make_bus()
    with pytest.raises(InvalidArgument, match="needs a session key"):
        bus.run(multitask_strategy="interrupt")
    with pytest.raises(InvalidArgument, match="invalid multitask_strategy"):
        bus.run(app_name="a", user_id="u", session_id="s", multitask_strategy="enqueue-ish")


async def test_an_interrupt_that_outlasts_its_timeout_is_session_busy(
    make_bus: BusFactory,
) -> None:
    """The active run ignores its cancel (no checkpoint): the new run does not start, and says
    the session is still busy; the cancel stands."""
    owner, other = await make_bus(), await make_bus()
    hold = asyncio.Event()
    entered = asyncio.Event()

    async def stubborn() -> None:
        async with owner.run("old", app_name="a", user_id="u", session_id="s"):
            entered.set()
            await hold.wait()

    task = asyncio.create_task(stubborn())
    async with asyncio.timeout(WAIT):
        await entered.wait()
    with pytest.raises(SessionBusy):
        async with other.run(
            app_name="a",
            user_id="u",
            session_id="s",
            multitask_strategy="interrupt",
            interrupt_timeout=0.3,
        ):
            pytest.fail("it started on a busy session")
    run = await other.get_run("old")
    assert run is not None and run.cancel_requested_at is not None and run.is_active
    hold.set()
    await task
    final = await other.wait("old", timeout=WAIT)
    assert final is not None and final.status is RunStatus.CANCELLED


@pytest.mark.parametrize("strategy", ["reject", "enqueue", "interrupt", "rollback"])
async def test_enqueue_deals_with_the_active_run_as_its_strategy_says(
    start: Start, make_bus: BusFactory, strategy: str
) -> None:
    """``bus.enqueue`` on a busy session, the active run on another node: refused, queued
    behind it (a claim before its turn waits for it), or the active run stopped at once and
    the queued run holding the session (its claim reads the run it interrupted)."""
    ops = await make_bus()
    session = {"app_name": APP, "user_id": USER, "session_id": session_of(start)}
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    if strategy == "reject":
        with pytest.raises(SessionBusy):
            await ops.enqueue("second", **session, multitask_strategy=strategy)
        assert await ops.get_run("second") is None
        await _ticked(ops, "first")
        return
    queued = await ops.enqueue("second", **session, multitask_strategy=strategy)
    assert queued.status is RunStatus.QUEUED and queued.owner is None
    if strategy == "enqueue":
        assert queued.interrupted is None
        assert (await ops.session_run(**session)).run_id == "first"  # type: ignore[union-attr]
        claim = await start("reject", "second")  # claimed before its turn: it waits for it
        assert await claim.step() == {"queued": "second"}
        await _ticked(ops, "first")
        await ops.cancel("first", timeout=WAIT)
        assert await first.step() == {"cancelled": "user"}
        assert (await claim.step())["started"] == "second"
    else:
        assert await first.step() == {"cancelled": strategy}  # stopped before enqueue answered
        assert queued.interrupted == "first"
        assert (await ops.session_run(**session)).run_id == "second"  # type: ignore[union-attr]
        claim = await start("reject", "second")
        begun = await claim.step()
        ended = await ops.get_run("first")
        assert ended is not None and ended.requested_by == "second"
        assert begun["started"] == "second" and begun["interrupted"] == "first"
        assert begun["interrupted_output"] == ended.output
        assert (ended.output != "") is (strategy == "interrupt")
    await ops.cancel("second", timeout=WAIT)
    assert await claim.ended() == 0


async def test_an_enqueued_run_takes_its_turn_unclaimed_and_goes_with_its_session(
    start: Start, make_bus: BusFactory
) -> None:
    """Queued by ``enqueue``: when the active run ends, it holds the session until a node
    claims it (then it starts at once); one behind it is cancelled with the session."""
    ops = await make_bus()
    session = {"app_name": APP, "user_id": USER, "session_id": session_of(start)}
    first = await start("reject", "first")
    assert (await first.step())["started"] == "first"
    for run_id in ("b", "c"):
        await ops.enqueue(run_id, **session, multitask_strategy="enqueue")
    await ops.cancel("first", timeout=WAIT)
    assert (await ops.session_run(**session)).run_id == "b"  # type: ignore[union-attr]
    b = await start("reject", "b")
    assert (await b.step())["started"] == "b"  # its turn had come: no wait
    result = await ops.cancel_session(**session, timeout=WAIT)
    assert result.run is not None and result.run.run_id == "b"
    assert [(r.run.run_id, r.outcome.value) for r in result.descendants if r.run] == [
        ("c", "cancelled")
    ]
    c = await ops.get_run("c")
    assert c is not None and c.status is RunStatus.CANCELLED and c.started_at is None
    assert await ops.session_run(**session) is None


async def _queue(start: Start, *names: str) -> dict[str, Runner]:
    """Follow-ups with strategy ``enqueue``, each on a node of its own, one after the other
    (each has said it is queued before the next asks): their arrival order is ``names``."""
    queued = {}
    for name in names:
        queued[name] = await start("enqueue", name)
        assert await queued[name].step() == {"queued": name}
    return queued


async def _ticked(bus: CancelBus, run_id: str) -> None:
    """Until the run's code has emitted (its relay-less output lands with its end, so: its
    phase of life, read from the record, is running and a checkpoint passed)."""
    async with asyncio.timeout(WAIT):
        while (run := await bus.get_run(run_id)) is None or run.status is not RunStatus.RUNNING:
            await asyncio.sleep(0.01)
