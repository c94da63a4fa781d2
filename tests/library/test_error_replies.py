"""Every class of Redis error reply, injected for real, shorter than the lease rides out: a run
whose code ends meanwhile gets no error from its exit and is recorded as it ended; the calls
meanwhile raise the class's typed error (never a plain CancelBusError); nothing is stopped,
nothing stays running. Real faults: out of memory (``maxmemory``), a busy script, a failed
snapshot (``MISCONF``), a server loading its data, a user whose rights were taken (``NOPERM``);
and, through a proxy that answers them, every reply code of the classification table.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
import redis
import redis.asyncio as aioredis

from cancel_bus import (
    BusMisconfigured,
    BusUnavailable,
    CancelBus,
    CancelBusError,
    Outcome,
    RunInfo,
    RunStatus,
)
from cancel_bus._keys import acl_rules
from cancel_bus._redis import REPLY_CODES, Failure
from node.embedded import EmbeddedServer

from ..faultproxy import FaultProxy
from ..helpers import WAIT, LoopingRun, eventually

pytestmark = pytest.mark.slow  # not in the fast tier

LEASE = 6.0
SPELL = 0.35 * LEASE  # the fault lasts this long: less than the lease rides out (0.75)
USER, PASSWORD = "cb-user", "cb-password"
Action = Callable[["Bench"], Awaitable[None]]


@dataclass
class Bench:
    """Two buses on a server of the test's own: ``a`` (the owner) and ``b``, as ``USER``."""

    server: EmbeddedServer
    admin: aioredis.Redis
    a: CancelBus
    b: CancelBus
    busy: threading.Thread | None = None
    restart: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Action
    heal: Action
    error: type[CancelBusError]  # what a call that Redis refuses raises meanwhile
    cancels: bool = False  # a cancel still goes through (the scripts that may run out of memory)
    owner_only: bool = False  # only the owner meets the fault; the caller's cancel is recorded
    server_args: tuple[str, ...] = ()


async def _oom(bench: Bench) -> None:
    await bench.admin.config_set("maxmemory-policy", "noeviction")
    await bench.admin.config_set("maxmemory", "1")  # over the limit at once


async def _oom_over(bench: Bench) -> None:
    await bench.admin.config_set("maxmemory", "0")


async def _busy(bench: Bench) -> None:
    """A script of someone else's that loops: past the threshold Redis answers BUSY."""
    await bench.admin.config_set("busy-reply-threshold", "20")
    client = redis.Redis(port=bench.server.port)

    def loop() -> None:
        with contextlib.suppress(redis.ResponseError):
            client.eval("while true do end", 0)
        client.close()

    bench.busy = threading.Thread(target=loop, daemon=True)
    bench.busy.start()
    await asyncio.sleep(0.1)  # past the threshold


async def _busy_over(bench: Bench) -> None:
    killer = aioredis.Redis(port=bench.server.port)
    await killer.script_kill()
    await killer.aclose()
    assert bench.busy is not None
    await asyncio.to_thread(bench.busy.join, WAIT)


async def _misconf(bench: Bench) -> None:
    """A snapshot that cannot be written: with save points, Redis refuses every write."""
    await bench.admin.config_set("dir", "/proc")
    await bench.admin.bgsave()
    await eventually(lambda: _bgsave_status(bench, "err"))


async def _misconf_over(bench: Bench) -> None:
    await bench.admin.config_set("dir", str(bench.server.data_dir))
    await bench.admin.bgsave()
    await eventually(lambda: _bgsave_status(bench, "ok"))


async def _bgsave_status(bench: Bench, status: str) -> bool:
    info = await bench.admin.info("persistence")
    return not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == status


async def _loading(bench: Bench) -> None:
    """Redis restarts and loads its data slowly (22,000 keys, some 140 µs each), answering
    LOADING meanwhile: for longer than redis-py's own retries."""
    await bench.admin.execute_command("DEBUG", "POPULATE", "22000", "filler", "10")
    await bench.admin.save()
    await bench.admin.aclose()
    bench.server.extra_args += [
        *("--key-load-delay", "60"),
        *("--loading-process-events-interval-bytes", "1024"),  # answer while loading
    ]
    bench.restart = asyncio.create_task(asyncio.to_thread(bench.server.restart))  # until loaded
    bench.admin = aioredis.Redis(port=bench.server.port, decode_responses=True)
    await eventually(lambda: _answers_loading(bench))


async def _answers_loading(bench: Bench) -> bool:
    """A raw GET answers LOADING (redis-py would retry it away)."""

    def ask() -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", bench.server.port), timeout=0.5) as sock,
        ):
            sock.sendall(b"GET x\r\n")
            return sock.recv(64).startswith(b"-LOADING")
        return False

    return await asyncio.to_thread(ask)


async def _loading_over(bench: Bench) -> None:
    assert bench.restart is not None
    await asyncio.wait_for(bench.restart, WAIT)


async def _noperm(bench: Bench) -> None:
    await bench.admin.acl_setuser(USER, commands=["-evalsha", "-eval"])


async def _noperm_over(bench: Bench) -> None:
    await bench.admin.acl_setuser(USER, commands=["+evalsha", "+eval"])


REAL_FAULTS = [
    Fault("out_of_memory", _oom, _oom_over, BusUnavailable, cancels=True),
    Fault("busy_script", _busy, _busy_over, BusUnavailable),
    Fault(
        "misconf",
        _misconf,
        _misconf_over,
        BusUnavailable,
        server_args=("--save", "3600 1", "--enable-protected-configs", "yes"),
    ),
    Fault(
        "loading",
        _loading,
        _loading_over,
        BusUnavailable,
        server_args=("--enable-debug-command", "yes"),
    ),
    Fault("noperm", _noperm, _noperm_over, BusMisconfigured),
]


@contextlib.asynccontextmanager
async def _bench(namespace: str, server_args: tuple[str, ...] = ()) -> AsyncIterator[Bench]:
    user = ["--user", USER, "on", f">{PASSWORD}", *acl_rules(namespace).split()]
    server = EmbeddedServer(extra_args=[*user, *server_args]).start()  # a restart keeps it
    admin = aioredis.Redis(port=server.port, decode_responses=True)
    bench: Bench | None = None
    try:
        url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{server.port}/0"
        a = CancelBus(url, namespace=namespace, lease_ttl=LEASE)
        b = CancelBus(url, namespace=namespace, lease_ttl=LEASE)
        bench = Bench(server, admin, a, b)
        await a.start()
        await b.start()
        yield bench
    finally:
        if bench is not None:
            for bus in (bench.a, bench.b):
                await bus.close(cancel_timeout=2)
            admin = bench.admin
        await admin.aclose()
        server.cleanup()


async def _lives_through(bench: Bench, fault: Fault) -> None:
    """The scenario every fault class must pass (see the module's docstring)."""
    a, b = bench.a, bench.b
    running = await LoopingRun(a).start()
    ending = await LoopingRun(a).start()
    await fault.inject(bench)
    spell = asyncio.get_running_loop().time()
    with pytest.raises(CancelBusError) as refused:
        async with a.run():
            pass
    assert type(refused.value) is fault.error, refused.value  # typed: never a plain error
    ending.finish.set()
    await ending.done()  # its exit raised nothing: the end waits for Redis in the outbox
    if fault.cancels:
        assert (await b.cancel(running.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        await running.done()
    elif fault.owner_only:  # recorded; the owner's sweep delivers it once Redis is back
        assert (await b.cancel(running.run_id, timeout=0.5)).outcome is Outcome.STOPPING
    else:
        with pytest.raises(CancelBusError) as caught:
            await b.cancel(running.run_id, timeout=1)
        assert isinstance(caught.value, BusUnavailable), caught.value
    left = SPELL - (asyncio.get_running_loop().time() - spell)
    await asyncio.sleep(max(0.0, left))  # the fault's length
    await fault.heal(bench)
    record = await eventually(lambda: _ended(b, ending.run_id), timeout=WAIT)
    assert record.status is RunStatus.SUCCEEDED and record.end_reason == "completed"
    for bus in (a, b):
        assert bus.stats.self_fences == bus.stats.leases_lost == bus.stats.runs_reaped == 0
    if fault.owner_only:
        await running.done()
        record = await eventually(lambda: _ended(b, running.run_id), timeout=WAIT)
        assert record.status is RunStatus.CANCELLED and record.end_reason == "cancelled"
    elif not fault.cancels:  # stopped by nobody: it still runs, and a cancel reaches it now
        assert running.task is not None and not running.task.done()
        assert (await b.cancel(running.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED
        await running.done()
    again = await LoopingRun(a).start()  # and new work is taken again
    assert (await b.cancel(again.run_id, timeout=WAIT)).outcome is Outcome.CANCELLED


async def _ended(bus: CancelBus, run_id: str) -> RunInfo | None:
    record = await bus.get_run(run_id)
    return record if record is not None and not record.is_active else None


@pytest.mark.parametrize("fault", REAL_FAULTS, ids=lambda f: f.name)
async def test_a_real_error_class_loses_nothing_and_is_typed(namespace: str, fault: Fault) -> None:
    async with _bench(namespace, fault.server_args) as bench:
        await _lives_through(bench, fault)


CODES = sorted(REPLY_CODES)
TEXT = {"MOVED": "3999 127.0.0.1:1", "ASK": "3999 127.0.0.1:1"}


@pytest.mark.parametrize("code", CODES)
async def test_every_reply_code_from_a_proxy_is_typed_and_loses_nothing(
    namespace: str, code: str
) -> None:
    """A server that answers ``code`` to every command, for a spell: through a proxy."""
    expected = BusUnavailable if REPLY_CODES[code] is Failure.UNAVAILABLE else BusMisconfigured
    async with _bench(namespace) as bench:
        proxy = await FaultProxy(bench.server.port).start()
        url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{proxy.port}/0"
        owner = CancelBus(url, namespace=namespace, lease_ttl=LEASE)
        await owner.start()
        bench.a, spare = owner, bench.a

        async def inject(_: Bench) -> None:
            proxy.answer(f"{code} {TEXT.get(code, 'the server says no')}")

        async def heal(_: Bench) -> None:
            proxy.heal()

        try:
            await _lives_through(bench, Fault(code, inject, heal, expected, owner_only=True))
        finally:
            bench.a = spare
            await owner.close(cancel_timeout=2)
            await proxy.close()
