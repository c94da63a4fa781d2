"""Security on real servers: replayed and stale bus messages, a namespace-scoped ACL user, TLS."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from cancel_bus import BusUnavailable, CancelBus, CancelMode, Outcome, RunStatus
from cancel_bus._keys import KeySpace
from cancel_bus._messages import MessageSigner, cancel_purpose
from node.embedded import EmbeddedServer, free_port

from .conftest import BusFactory
from .helpers import WAIT, LoopingRun, eventually

KEY = "signing-key-" + "k" * 20


async def _capture(pubsub: aioredis.client.PubSub) -> str:
    async with asyncio.timeout(WAIT):
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                return str(message["data"])


async def test_a_replayed_cancel_is_dropped_and_counted(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(signing_key=KEY)
    b = await make_bus(signing_key=KEY)
    first = await LoopingRun(a).start()
    pubsub = raw_redis.pubsub()
    await pubsub.subscribe(a.keys.channel(a.node_id))
    await b.cancel(first.run_id, wait=False)
    genuine = await _capture(pubsub)
    await first.done()
    assert a.stats.messages_rejected == 0

    second = await LoopingRun(a).start()
    replay = json.loads(genuine) | {"r": second.run_id}  # aimed at another run
    await raw_redis.publish(a.keys.channel(a.node_id), genuine)
    await raw_redis.publish(a.keys.channel(a.node_id), json.dumps(replay))
    await eventually(lambda: _rejected(a, 2))
    assert second.handle is not None and second.handle.cancel_requested is None
    second.finish.set()
    await second.done()
    await pubsub.aclose()


async def test_a_stale_signed_cancel_is_dropped(
    make_bus: BusFactory, raw_redis: aioredis.Redis
) -> None:
    a = await make_bus(signing_key=KEY)
    run = await LoopingRun(a).start()
    target = f"run:{run.run_id}"
    old_clock = MessageSigner(a.keys.namespace, KEY.encode(), lambda: a.clock() - 120)
    message = {
        "k": "cancel",
        "r": run.run_id,
        "tg": target,
        "m": "immediate",
        "em": "immediate",
        "at": f"{a.clock():.6f}",
        "a": old_clock.auth(cancel_purpose(target, CancelMode.IMMEDIATE)),
    }
    await raw_redis.publish(a.keys.channel(a.node_id), json.dumps(message))
    await eventually(lambda: _rejected(a, 1))
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
            assert len(await b.events(run.run_id)) == 4 and len(await b.list_nodes()) == 2
            queued = await b.enqueue()
            async with a.run(queued.run_id, relay=True) as claimed:
                await claimed.pause()
                await claimed.resume()
                claimed.emit("relayed")
            followed = [event.type async for event in b.follow(claimed.run_id, from_start=True)]
            assert followed == ["output", "run.finished"]
            final = await b.wait(claimed.run_id, timeout=WAIT)
            assert final is not None and final.status is RunStatus.SUCCEEDED

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
    clients = await a.redis.client_list()
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
