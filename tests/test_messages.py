"""Bus messages: parsing and HMAC signing (pure logic), and forged messages on a real channel."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from cancel_bus import CancelBus, Outcome, RunStatus
from cancel_bus._messages import MessageSigner, parse_message

from .conftest import BusFactory
from .helpers import WAIT, LoopingRun, eventually


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_signature_round_trip_and_rejections() -> None:
    clock = FakeClock()
    signer = MessageSigner("ns", b"secret", clock, window=30)
    verifier = MessageSigner("ns", b"secret", clock, window=30)
    auth = signer.auth("cancel|run:r1|checkpoint")
    assert verifier.verify("cancel|run:r1|checkpoint", auth)
    assert not verifier.verify("cancel|run:r1|checkpoint", auth)  # replayed
    assert not verifier.verify("cancel|run:r2|checkpoint", signer.auth("cancel|run:r1|checkpoint"))
    assert not MessageSigner("other-ns", b"secret", clock).verify(
        "cancel|run:r1|checkpoint", signer.auth("cancel|run:r1|checkpoint")
    )
    assert not MessageSigner("ns", b"wrong", clock).verify("p", signer.auth("p"))
    old = signer.auth("p")
    clock.now += 31
    assert not verifier.verify("p", old)  # too old
    for junk in ("", "a:b", "1:2:3:4", None, 5, "x:y:z"):
        assert not verifier.verify("p", junk)


def test_without_a_key_everything_passes_and_auth_is_empty() -> None:
    signer = MessageSigner("ns", None, FakeClock())
    assert signer.auth("p") == "" and signer.verify("p", "anything")


def test_parse_rejects_garbage() -> None:
    for junk in (
        "",
        "{",
        "[]",
        '{"k":"cancel"}',
        '{"k":"other"}',
        '{"k":"cancel","r":"x","tg":"run:x","m":"bogus","em":"checkpoint","at":"1"}',
    ):
        assert parse_message(junk) is None
    message = parse_message(
        json.dumps(
            {
                "k": "cancel",
                "r": "x",
                "tg": "run:x",
                "m": "checkpoint",
                "em": "immediate",
                "at": "12.5",
                "reason": "why",
            }
        )
    )
    assert message is not None


async def test_forged_publish_cannot_cancel_a_signed_bus(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(signing_key="k" * 32)
    b = await make_bus(signing_key="k" * 32)
    run = await LoopingRun(a).start()
    channel = a.keys.channel(a.node_id)
    forged = {
        "k": "cancel",
        "r": run.run_id,
        "tg": f"run:{run.run_id}",
        "m": "checkpoint",
        "em": "checkpoint",
        "at": "1.0",
        "a": "1.0:abcd:" + "0" * 64,
    }
    assert await raw_redis.publish(channel, json.dumps(forged)) == 1
    assert await raw_redis.publish(channel, "not json") == 1
    await raw_redis.publish(channel, json.dumps({**forged, "a": ""}))
    await eventually(lambda: _rejected(a, 3))
    assert run.handle is not None and run.handle.cancel_requested is None
    result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert a.stats.messages_rejected == 3
    assert result.run is not None and result.run.status is RunStatus.CANCELLED
    assert result.run.requested_by is None  # the genuine request, not a forged one
    await run.done()


async def test_unsigned_bus_ignores_garbage_and_still_works(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()
    await raw_redis.publish(a.keys.channel(a.node_id), "\x00garbage")
    result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED and a.stats.messages_rejected == 1
    await run.done()


async def _rejected(bus: CancelBus, count: int) -> bool:
    return bus.stats.messages_rejected >= count
