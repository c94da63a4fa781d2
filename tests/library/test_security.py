"""Security on real servers: captured bus messages replayed, re-aimed and sent elsewhere; key
rotation; a namespace-scoped ACL user; TLS."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from cancel_bus import BusUnavailable, CancelBus, Outcome, RunStatus
from cancel_bus._keys import KeySpace
from cancel_bus._messages import SEAL_FIELDS, Field, MessageKind, MessageSigner
from node.embedded import EmbeddedServer, free_port

from ..conftest import BusFactory
from ..helpers import WAIT, LoopingRun, eventually, keys_of, redis_of

KEY = "signing-key-" + "k" * 20


async def _capture(pubsub: aioredis.client.PubSub) -> str:
    async with asyncio.timeout(WAIT):
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                return str(message["data"])


async def _listen(redis: aioredis.Redis, bus: CancelBus) -> aioredis.client.PubSub:
    """An eavesdropper on the bus node's channel."""
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys_of(bus).channel(bus.node_id))
    return pubsub


async def _publish_to(redis: aioredis.Redis, bus: CancelBus, body: dict[str, object]) -> None:
    await redis.publish(keys_of(bus).channel(bus.node_id), json.dumps(body))


async def test_a_captured_cancel_is_useless_replayed_re_aimed_or_elsewhere(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a, b, c = [await make_bus(signing_key=KEY) for _ in range(3)]
    x, y, z = [await LoopingRun(bus).start() for bus in (a, a, c)]
    pubsub = await _listen(raw_redis, a)
    await b.cancel(x.run_id, wait=False)
    genuine = json.loads(await _capture(pubsub))
    await x.done()
    assert genuine["to"] == a.node_id and genuine["r"] == x.run_id
    await _publish_to(raw_redis, a, genuine)  # replayed to its recipient
    aimed = {"r": y.run_id, "tg": f"run:{y.run_id}", "m": "immediate", "em": "immediate"}
    await _publish_to(raw_redis, a, genuine | aimed)  # at another run of the recipient
    elsewhere = aimed | {"r": z.run_id, "tg": f"run:{z.run_id}", "to": c.node_id, "ep": c.epoch}
    await _publish_to(raw_redis, c, genuine | elsewhere)  # at a run of another node
    await _publish_to(raw_redis, c, genuine)  # unchanged, on another node's channel
    await eventually(lambda: _rejected(a, 2))
    await eventually(lambda: _rejected(c, 2))
    assert (a.stats.messages_replayed, a.stats.messages_forged) == (1, 1)
    assert (c.stats.messages_forged, c.stats.messages_misaddressed) == (1, 1)
    for run in (y, z):
        assert run.handle is not None and run.handle.cancel_requested is None
        record = await b.get_run(run.run_id)
        assert record is not None and record.cancel_requested_at is None
        run.finish.set()
        await run.done()
    await pubsub.aclose()


async def test_a_replayed_session_cancel_cannot_reach_a_later_run(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a, b, c = [await make_bus(signing_key=KEY) for _ in range(3)]
    session = {"app_name": "app", "user_id": "u", "session_id": "s"}
    first = await LoopingRun(a, **session).start()
    pubsub = await _listen(raw_redis, a)
    result = await b.cancel_session("app", "u", "s", timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    genuine = json.loads(await _capture(pubsub))
    assert genuine["tg"] == "session:app:u:s" and genuine["r"] == first.run_id
    later_here = await LoopingRun(a, **session).start()
    await _publish_to(raw_redis, a, genuine)  # the same node: seen before
    await eventually(lambda: _rejected(a, 1))
    later_here.finish.set()
    await later_here.done()
    later_there = await LoopingRun(c, **session).start()
    await _publish_to(raw_redis, c, genuine)  # sealed for the first run's owner only
    await eventually(lambda: _rejected(c, 1))
    assert a.stats.messages_replayed == 1 and c.stats.messages_misaddressed == 1
    assert later_there.handle is not None and later_there.handle.cancel_requested is None
    later_there.finish.set()
    await later_there.done()
    for run in (later_here, later_there):
        record = await b.get_run(run.run_id)
        assert record is not None and record.status is RunStatus.SUCCEEDED
    await pubsub.aclose()


@pytest.mark.parametrize("signed", [True, False])
async def test_a_re_aimed_finish_notice_does_not_end_a_wait_early(
    make_bus: BusFactory, raw_redis: aioredis.Redis, signed: bool
) -> None:
    key = KEY if signed else None
    a, b = await make_bus(signing_key=key), await make_bus(signing_key=key)
    stubborn = asyncio.Event()

    async def never_checkpoints() -> None:
        async with a.run(run_id="stubborn"):
            await stubborn.wait()

    task = asyncio.create_task(never_checkpoints())
    await eventually(lambda: _active(b, "stubborn"))
    waiting = asyncio.create_task(b.cancel("stubborn", timeout=2.0))
    other = await LoopingRun(a).start()
    pubsub = await _listen(raw_redis, b)
    assert (await b.cancel(other.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
    notice = json.loads(await _capture(pubsub))
    assert notice["k"] == "finished" and notice["to"] == b.node_id
    await _publish_to(raw_redis, b, notice | {"r": "stubborn"})
    await eventually(lambda: _rejected(b, 1))
    assert (b.stats.messages_forged if signed else b.stats.messages_misaddressed) == 1
    result = await waiting  # answered at its timeout, not by the re-aimed notice
    assert result.outcome is Outcome.STOPPING
    stubborn.set()
    await task
    await pubsub.aclose()


@pytest.mark.parametrize("signing_key", [None, KEY])
async def test_every_message_a_node_sends_passes_its_own_checks(
    make_bus: BusFactory, signing_key: str | None
) -> None:
    """Each kind of message (a cancel, a finish notice, a probe), made by its real producer,
    is taken by its recipient, signed or not: a probe that never comes back leaves a node
    unready for good (the probe's nonce once used the seal's field)."""
    a = await make_bus(signing_key=signing_key, lease_ttl=1.5)
    b = await make_bus(signing_key=signing_key, lease_ttl=1.5)
    run = await LoopingRun(a).start()
    result = await b.cancel(run.run_id, timeout=WAIT)  # a cancel, then a finish notice
    assert result.outcome is Outcome.CANCELLED
    await run.done()
    for bus in (a, b):  # probes every 0.3 s: three came back
        await eventually(lambda bus=bus: _probed(bus, 3))  # type: ignore[misc]
        assert bus.ready and bus.stats.probes_failed == 0, bus.problems
        assert bus.stats.messages_rejected == 0
    assert a.stats.cancels_delivered == 1


async def _probed(bus: CancelBus, times: int) -> bool:
    node = next(n for n in await bus.list_nodes() if n.node_id == bus.node_id)
    return node.probe_at is not None and bus._node.probe.probes_back >= times


def test_a_message_may_not_use_the_seal_fields() -> None:
    signer = MessageSigner("ns", [KEY.encode()], time.time)
    for field in SEAL_FIELDS:
        with pytest.raises(ValueError, match="seal's fields"):
            signer.seal({Field.KIND: MessageKind.PROBE, field: "x"})
    assert len({f.value for f in Field}) == len(Field)  # no two names for one field


async def test_signing_keys_rotate_without_dropping_messages(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    old, new = "old-" + KEY, "new-" + KEY
    a = await make_bus(signing_key=old, verification_keys=[new])
    b = await make_bus(signing_key=new, verification_keys=[old])
    outsider = await make_bus(signing_key="another-" + KEY)
    for owner, canceller in ((a, b), (b, a)):
        run = await LoopingRun(owner).start()
        assert (await canceller.cancel(run.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        await run.done()
    assert a.stats.messages_rejected == b.stats.messages_rejected == 0
    run = await LoopingRun(a).start()
    result = await outsider.cancel(run.run_id, timeout=WAIT)  # recorded; its doorbell is not
    assert a.stats.messages_forged == 1
    assert result.outcome is Outcome.CANCELLED  # Redis is the truth: the sweep delivered it
    assert a.stats.cancels_recovered_by_sweep == 1
    await run.done()


async def test_a_stale_signed_cancel_is_dropped(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(signing_key=KEY)
    run = await LoopingRun(a).start()
    old_clock = MessageSigner(keys_of(a).namespace, [KEY.encode()], lambda: a.clock() - 120)
    message = {
        "k": "cancel",
        "r": run.run_id,
        "tg": f"run:{run.run_id}",
        "m": "immediate",
        "em": "immediate",
        "at": f"{a.clock():.6f}",
        "to": a.node_id,
        "ep": a.epoch,
    }
    await raw_redis.publish(keys_of(a).channel(a.node_id), old_clock.seal(message))
    await eventually(lambda: _rejected(a, 1))
    assert a.stats.messages_stale == 1
    assert run.handle is not None and run.handle.cancel_requested is None
    run.finish.set()
    await run.done()


async def test_acl_user_of_one_namespace_runs_the_library_and_nothing_else(
    raw_redis: aioredis.Redis, redis_server: EmbeddedServer
) -> None:
    ns1, ns2 = (f"acl-{secrets.token_hex(4)}" for _ in range(2))
    users = {ns: (f"u-{ns}", secrets.token_hex(16)) for ns in (ns1, ns2)}
    for ns, (user, password) in users.items():
        await raw_redis.execute_command(
            "ACL", "SETUSER", user, "on", f">{password}", *KeySpace(ns).acl_rules().split()
        )
    try:
        url1, url2 = (
            f"redis://{users[ns][0]}:{users[ns][1]}@127.0.0.1:{redis_server.port}/0"
            for ns in (ns1, ns2)
        )
        async with (
            CancelBus(url1, namespace=ns1, lease_ttl=3) as a,
            CancelBus(url1, namespace=ns1, lease_ttl=3) as b,
        ):
            run = await LoopingRun(a, app_name="app", user_id="u", session_id="s").start()
            assert [r.run_id for r in await b.list_runs()] == [run.run_id]
            result = await b.cancel_session("app", "u", "s", timeout=WAIT)
            assert result.outcome is Outcome.CANCELLED
            await run.done()
            assert len(await b.events(run.run_id)) == 5 and len(await b.list_nodes()) == 2
            queued = await b.enqueue()
            async with a.run(queued.run_id, relay=True) as claimed:
                await claimed.pause()
                await claimed.resume()
                claimed.emit("relayed")
            followed = [event.type async for event in b.follow(claimed.run_id, from_start=True)]
            assert followed == ["output", "run.finished"]
            final = await b.wait(claimed.run_id, timeout=WAIT)
            assert final is not None and final.status is RunStatus.SUCCEEDED
            child = await b.enqueue(parent=claimed.run_id)
            assert [r.run_id for r in await a.children(claimed.run_id)] == [child.run_id]
            held = await b.cancel_where(user_id="u", ttl=60)  # lays and lifts tombstones
            assert held.tombstone is not None
            assert [t.tombstone_id for t in await a.tombstones()] == [held.tombstone.tombstone_id]
            assert await a.remove_tombstone(held.tombstone.tombstone_id)

            intruder = CancelBus(url2, namespace=ns1, lease_ttl=3)  # ns2's user, ns1's runs
            with pytest.raises(BusUnavailable, match="refused access"):
                await intruder.start()
            await intruder.close()
            async with aioredis.Redis.from_url(url2, decode_responses=True) as other:
                with pytest.raises(NoPermissionError):
                    await other.hgetall(KeySpace(ns1).run(run.run_id))
                with pytest.raises(NoPermissionError):
                    await other.publish(KeySpace(ns1).channel(a.node_id), "{}")
                with pytest.raises(NoPermissionError):
                    await other.keys("*")
    finally:
        for user, _ in users.values():
            await raw_redis.execute_command("ACL", "DELUSER", user)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "cert.pem"),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return folder


@pytest.fixture
def tls_server(tls_files: Path) -> Iterator[tuple[EmbeddedServer, int]]:
    tls_port = free_port()
    server = EmbeddedServer(
        extra_args=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(tls_files / "cert.pem"),
            "--tls-key-file",
            str(tls_files / "key.pem"),
            "--tls-ca-cert-file",
            str(tls_files / "cert.pem"),
            "--tls-auth-clients",
            "no",
        ]
    )
    try:
        server.start()
    except Exception as exc:  # a server built without TLS
        pytest.skip(f"{server.binary} has no TLS support: {exc}")
    yield server, tls_port
    server.cleanup()


@pytest.fixture
async def tls_buses(
    tls_server: tuple[EmbeddedServer, int], tls_files: Path, namespace: str
) -> AsyncIterator[tuple[CancelBus, CancelBus]]:
    _, port = tls_server
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tls_files / 'cert.pem'}"
    buses = (CancelBus(url, namespace=namespace), CancelBus(url, namespace=namespace))
    for bus in buses:
        await bus.start()
    yield buses
    for bus in buses:
        await bus.close()


async def test_tls_to_redis(
    tls_buses: tuple[CancelBus, CancelBus], tls_server: tuple[EmbeddedServer, int]
) -> None:
    a, b = tls_buses
    run = await LoopingRun(a).start()
    result = await b.cancel(run.run_id, timeout=WAIT)
    assert result.outcome is Outcome.CANCELLED
    await run.done()
    final = await a.get_run(run.run_id)
    assert final is not None and final.status is RunStatus.CANCELLED
    clients = await redis_of(a).client_list()
    assert clients and all(c.get("flags") is not None for c in clients)
    untrusted = CancelBus(f"rediss://127.0.0.1:{tls_server[1]}/0", namespace="x", lease_ttl=1)
    with pytest.raises(BusUnavailable):  # a server certificate nobody vouches for
        await untrusted.start()
    await untrusted.close()
    plain = CancelBus(f"redis://127.0.0.1:{tls_server[1]}/0", namespace="x", lease_ttl=1)
    with pytest.raises(BusUnavailable):
        await plain.start()
    await plain.close()


async def _rejected(bus: CancelBus, count: int) -> bool:
    return bus.stats.messages_rejected >= count


async def _active(bus: CancelBus, run_id: str) -> bool:
    run = await bus.get_run(run_id)
    return run is not None and run.is_active


async def test_a_user_who_may_not_subscribe_cannot_start_and_leaves_no_node(
    raw_redis: aioredis.Redis, redis_server: EmbeddedServer
) -> None:
    namespace = f"deaf-{secrets.token_hex(4)}"
    user, password = f"u-{namespace}", secrets.token_hex(16)
    rules = [rule for rule in KeySpace(namespace).acl_rules().split() if rule[0] != "&"]
    await raw_redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)
    try:
        url = f"redis://{user}:{password}@127.0.0.1:{redis_server.port}/0"
        bus = CancelBus(url, namespace=namespace, lease_ttl=1)
        with pytest.raises(BusUnavailable, match="could not subscribe"):
            await bus.start()  # registered, then its channel was refused
        await bus.close()
        async with CancelBus(redis_server.url, namespace=namespace) as observer:
            nodes = await observer.list_nodes()
        assert [node.node_id for node in nodes] == [observer.node_id]  # no ghost left alive
    finally:
        await raw_redis.execute_command("ACL", "DELUSER", user)
