"""Bus messages: parsing, addressing and the HMAC seal (pure logic), and forged messages on a
real channel."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from cancel_bus import CancelBus, Outcome, RunStatus
from cancel_bus._messages import (
    CancelMessage,
    MessageSigner,
    Rejection,
    addressed_to,
    decode,
    parse_message,
)

from ..conftest import BusFactory
from ..helpers import WAIT, LoopingRun, eventually, keys_of


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


CANCEL = {
    "k": "cancel",
    "r": "r1",
    "tg": "run:r1",
    "m": "checkpoint",
    "em": "checkpoint",
    "at": "999.5",
    "to": "n1",
    "ep": "e1",
}


def test_a_seal_covers_every_field_and_is_single_use() -> None:
    clock = FakeClock()
    signer = MessageSigner("ns", [b"secret"], clock, window=30)
    verifier = MessageSigner("ns", [b"secret"], clock, window=30)
    sealed = json.loads(signer.seal(CANCEL))
    assert verifier.check(sealed) is None
    assert verifier.check(sealed) is Rejection.REPLAYED
    for field, value in [*CANCEL.items(), ("ts", "1000.000"), ("n", "0" * 24)]:
        changed = json.loads(signer.seal(CANCEL)) | {field: value + "x"}
        assert verifier.check(changed) is Rejection.FORGED, field
    extra = json.loads(signer.seal(CANCEL)) | {"reason": "added"}
    assert verifier.check(extra) is Rejection.FORGED
    other_namespace = MessageSigner("other", [b"secret"], clock)
    assert other_namespace.check(json.loads(signer.seal(CANCEL))) is Rejection.FORGED
    wrong_key = MessageSigner("ns", [b"wrong"], clock)
    assert wrong_key.check(json.loads(signer.seal(CANCEL))) is Rejection.FORGED
    old = json.loads(signer.seal(CANCEL))
    clock.now += 31
    assert verifier.check(old) is Rejection.STALE
    for junk in ({}, {"a": 5}, {**old, "a": None}):
        assert verifier.check(junk) is Rejection.FORGED


def test_every_key_verifies_and_the_first_signs() -> None:
    clock = FakeClock()
    old, new = b"old-key", b"new-key"
    during = MessageSigner("ns", [new, old], clock)
    for sender in (MessageSigner("ns", [old], clock), MessageSigner("ns", [new], clock)):
        assert during.check(json.loads(sender.seal(CANCEL))) is None
    assert MessageSigner("ns", [old], clock).check(json.loads(during.seal(CANCEL))) is (
        Rejection.FORGED
    )


def test_without_a_key_nothing_is_sealed_and_everything_passes() -> None:
    signer = MessageSigner("ns", [], FakeClock())
    assert json.loads(signer.seal(CANCEL)) == CANCEL
    assert signer.check({"anything": 1}) is None


def test_parse_rejects_garbage_and_addressing_is_checked() -> None:
    for junk in ("", "{", "[]", "5"):
        assert decode(junk) is None
    for body in (
        {"k": "cancel"},
        {"k": "other"},
        CANCEL | {"m": "bogus"},
        CANCEL | {"to": 5},
        {k: v for k, v in CANCEL.items() if k != "ep"},
        {"k": "finished", "r": "r1"},
    ):
        assert parse_message(body) is None, body
    message = parse_message(CANCEL | {"reason": "why"})
    assert isinstance(message, CancelMessage) and message.request.reason == "why"
    assert addressed_to(message, "n1", "e1")
    assert not addressed_to(message, "n2", "e1")
    assert not addressed_to(message, "n1", "e2")  # another incarnation of the node
    re_aimed = parse_message(CANCEL | {"r": "r2"})  # the target names r1
    assert re_aimed is not None and not addressed_to(re_aimed, "n1", "e1")
    session = parse_message(CANCEL | {"tg": "session:a:u:s", "r": "r2"})
    assert session is not None and addressed_to(session, "n1", "e1")
    finished = parse_message({"k": "finished", "r": "r1", "to": "n1"})
    assert finished is not None and addressed_to(finished, "n1", "whatever")


async def test_forged_publish_cannot_cancel_a_signed_bus(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(signing_key="k" * 32)
    b = await make_bus(signing_key="k" * 32)
    run = await LoopingRun(a).start()
    channel = keys_of(a).channel(a.node_id)
    forged = {
        "k": "cancel",
        "r": run.run_id,
        "tg": f"run:{run.run_id}",
        "m": "checkpoint",
        "em": "checkpoint",
        "at": "1.0",
        "to": a.node_id,
        "ep": a.epoch,
        "ts": f"{a.clock():.3f}",
        "n": "abcd",
        "a": "0" * 64,
    }
    assert await raw_redis.publish(channel, json.dumps(forged)) == 1
    assert await raw_redis.publish(channel, "not json") == 1
    await raw_redis.publish(channel, json.dumps({**forged, "a": ""}))
    await eventually(lambda: _rejected(a, 3))
    assert run.handle is not None and run.handle.cancel_requested is None
    result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    assert a.stats.messages_rejected == 3
    assert (a.stats.messages_forged, a.stats.messages_malformed) == (2, 1)
    assert result.run is not None and result.run.status is RunStatus.CANCELLED
    assert result.run.requested_by is None  # the genuine request, not a forged one
    await run.done()


async def test_unsigned_bus_ignores_garbage_and_still_works(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a, b = await make_bus(), await make_bus()
    run = await LoopingRun(a).start()
    await raw_redis.publish(keys_of(a).channel(a.node_id), "\x00garbage")
    result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED and a.stats.messages_rejected == 1
    assert a.stats.messages_malformed == 1
    await run.done()


async def _rejected(bus: CancelBus, count: int) -> bool:
    return bus.stats.messages_rejected >= count
