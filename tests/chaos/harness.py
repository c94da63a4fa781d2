"""The chaos cluster: N node processes on one of two Redis topologies, with the settings that
change a code path (``Settings``: signing, auth, an ACL user), and the faults the suite injects
into them (which fault, on which topology: ``faults.py``).

* ``proxied``: one real Redis (no persistence); each node talks to it through its own fault
  proxy (``tests/faultproxy.py``), so network faults can strike one node at a time.
* ``sentinel``: a real Sentinel group (primary, replica, 3 sentinels: ``tests/topology.py``);
  the nodes connect with ``redis+sentinel://``, as a deployment on Sentinel does.

Why a second topology for the failover, rather than re-pointing each node's proxy at the new
primary: a proxy the harness re-points is a managed endpoint; the nodes would see one stable
address and never meet what a Sentinel client meets in a failover — the dead primary refusing
connections, sentinels still naming it until they agree, the promoted replica's arrival — so the
suite would test the harness's failover, not the library's. The faults that need a proxy
(partition, latency, RST) keep the proxied topology; each topology is its own profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import redis
import redis.asyncio as aioredis

from cancel_bus._keys import KeySpace
from cancel_bus._lease import FENCE_MARGIN, HEARTBEATS_PER_LEASE
from node.embedded import EmbeddedServer, free_port

from ..faultproxy import FaultProxy
from ..topology import SentinelGroup

Topology = Literal["proxied", "sentinel"]
TOPOLOGIES: tuple[Topology, ...] = ("proxied", "sentinel")
LEASE_TTL = 2.0
SWEEP = 2.0  # the bus default sweep interval
RETENTION = 600.0
# The longest Redis-wide outage the nodes ride out without stopping their runs: past it, each
# stops them itself before its lease could run out (``redis_unreachable``, DESIGN §9).
RIDE_OUT = (1 - 1 / HEARTBEATS_PER_LEASE - FENCE_MARGIN) * LEASE_TTL  # 0.85 of a lease
# Sentinel: the primary is declared down once a PING has waited this long for its reply. The
# stalls the sentinel topology injects (at most 0.65 lease = 1.3 s) must not become failovers:
# on a loaded machine the primary answers up to ~0.7 s after a stall ends (the backlog first).
SENTINEL_DOWN_AFTER_MS = 3000
REDIS = "redis"  # the target of a fault that strikes Redis, not one node
SERVER_ARGS = (
    *("--enable-debug-command", "local"),  # DEBUG SLEEP is refused unless enabled (Redis >= 7)
    *("--repl-diskless-sync-delay", "0"),  # a replica syncs at once, not 5 s later
    # MISCONF on demand: with a save point, a snapshot that cannot be written stops every write;
    # protected configs let the harness point the snapshot where it cannot be written
    *("--save", "3600 1", "--enable-protected-configs", "yes"),
)
TOKEN = "chaos-ops-" + "t" * 24  # the workload's bearer token when auth is on
SIGNING_KEY = "chaos-signing-" + "k" * 24
ACL_USER, ACL_PASSWORD = "chaos", "chaos-password"


@dataclass(frozen=True)
class Settings:
    """The node settings that change a code path, as a matrix cell sets them."""

    signing: bool = False  # CANCEL_BUS_SIGNING_KEY: every bus message sealed
    auth: bool = False  # CANCEL_BUS_API_TOKENS: every request with a bearer token
    acl: bool = False  # the nodes connect as an ACL user confined to the namespace

    def name(self) -> str:
        on = [field for field in ("signing", "auth", "acl") if getattr(self, field)]
        return "+".join(on) or "plain"


@dataclass
class Fault:
    """One injected fault, logged before it strikes."""

    at: float  # time.time() when it struck
    kind: str
    target: str  # a node's name, or REDIS
    length: float  # as planned, in seconds (0: a single blow)
    ended: float | None = None  # when it was over (set afterwards)

    @property
    def node_level(self) -> bool:
        return self.target != REDIS

    @property
    def end(self) -> float:
        return self.ended if self.ended is not None else self.at + self.length


@dataclass
class Worker:
    name: str
    proxy: FaultProxy | None  # None: the node connects to Redis directly
    port: int
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOP
    killed: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.worker"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.killed = False

    async def ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready: {self.log.read_text()[-2000:]}")

    def needs_proxy(self) -> FaultProxy:
        if self.proxy is None:
            raise RuntimeError(f"{self.name} has no fault proxy (proxied topology only)")
        return self.proxy


@dataclass
class Cluster:
    workdir: Path
    size: int
    namespace: str
    topology: Topology = "proxied"
    settings: Settings = field(default_factory=Settings)
    server: EmbeddedServer | None = None  # proxied
    group: SentinelGroup | None = None  # sentinel
    workers: list[Worker] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[Fault] = field(default_factory=list)
    forgotten: dict[str, dict[str, str]] = field(default_factory=dict)  # runs before data loss

    @property
    def audit_dir(self) -> Path:
        return self.workdir / "audit"

    @property
    def primary(self) -> EmbeddedServer:
        """The server that holds the data now."""
        if self.group is not None:
            return self.group.primary
        assert self.server is not None, "the cluster is not started"
        return self.server

    async def start(self) -> None:
        """Start Redis and the nodes; on failure, :meth:`stop` cleans up what was started."""
        self.audit_dir.mkdir(parents=True, exist_ok=True)
        if self.topology == "sentinel":
            self.group = SentinelGroup(
                self.workdir / "sentinel", SENTINEL_DOWN_AFTER_MS, server_args=SERVER_ARGS
            )
            self.group.workdir.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self.group.start)
        else:
            user = ["--user", ACL_USER, "on", f">{ACL_PASSWORD}"]
            user += KeySpace(self.namespace).acl_rules().split()
            args = [*SERVER_ARGS, *(user if self.settings.acl else [])]  # a restart keeps it
            self.server = EmbeddedServer(extra_args=args).start()
        for i in range(self.size):
            name = f"chaos-{i + 1}"
            proxy = None
            if self.group is not None:
                url = self.group.url
            else:
                proxy = await FaultProxy(self.primary.port).start()
                url = proxy.url
                if self.settings.acl:
                    url = url.replace("redis://", f"redis://{ACL_USER}:{ACL_PASSWORD}@")
            port = free_port()
            env = {
                **os.environ,
                "CANCEL_BUS_REDIS_URL": url,
                "CANCEL_BUS_NAMESPACE": self.namespace,
                "CANCEL_BUS_NODE_ID": name,
                "CANCEL_BUS_PORT": str(port),
                "CANCEL_BUS_LEASE_TTL": str(LEASE_TTL),
                "CANCEL_BUS_DRAIN_TIMEOUT": "1",
                "CANCEL_BUS_RETENTION": str(RETENTION),
                "CANCEL_BUS_API_TOKENS": (
                    json.dumps({TOKEN: {"role": "ops"}}) if self.settings.auth else ""
                ),
                "CANCEL_BUS_API_TOKENS_FILE": "",
                "CANCEL_BUS_SIGNING_KEY": SIGNING_KEY if self.settings.signing else "",
                "CANCEL_BUS_LOG_LEVEL": "warning",
                "CHAOS_AUDIT_LOG": str(self.audit_dir / f"{name}.jsonl"),
            }
            worker = Worker(name, proxy, port, env, self.workdir / f"{name}.log")
            self.workers.append(worker)
            worker.spawn()
        await asyncio.gather(*(w.ready() for w in self.workers))

    async def stop(self) -> None:
        """Stop everything that was started, whatever state the faults left it in."""
        with contextlib.suppress(Exception):
            self.primary.resume()  # a node cannot drain against a frozen Redis
        for worker in self.workers:
            if worker.proxy is not None:
                worker.proxy.heal()
            if worker.process is not None and worker.process.poll() is None:
                if worker.stopped:
                    worker.process.send_signal(signal.SIGCONT)
                worker.process.send_signal(signal.SIGTERM)
        try:
            for worker in self.workers:
                if worker.process is not None:
                    try:
                        await asyncio.to_thread(worker.process.wait, 20)
                    except subprocess.TimeoutExpired:
                        worker.process.kill()
                        await asyncio.to_thread(worker.process.wait, 10)
                if worker.proxy is not None:
                    await worker.proxy.close()
        finally:
            if self.group is not None:
                self.group.cleanup()
            if self.server is not None:
                self.server.cleanup()

    def admin(self) -> aioredis.Redis:
        """A client of the current primary."""
        return aioredis.Redis(port=self.primary.port, decode_responses=True)

    def record(self, kind: str, target: str, length: float) -> Fault:
        """Log a fault just before it strikes (also to ``faults.jsonl``, kept with the logs)."""
        fault = Fault(time.time(), kind, target, length)
        self.faults[kind] += 1
        self.fault_log.append(fault)
        self._log_fault(fault)
        return fault

    def fault_over(self, fault: Fault) -> None:
        fault.ended = time.time()
        self._log_fault(fault)

    def _log_fault(self, fault: Fault) -> None:
        with (self.workdir / "faults.jsonl").open("a") as out:
            out.write(json.dumps(asdict(fault)) + "\n")

    # -- node faults ---------------------------------------------------------------------

    async def client_kill(self, worker: Worker) -> None:
        """CLIENT KILL of every connection of the node (its subscriber included)."""
        async with self.admin() as admin:
            for client in await admin.client_list():
                if client.get("name", "").startswith(f"cancel-bus.{worker.name}"):
                    with contextlib.suppress(Exception):
                        await admin.client_kill_filter(_id=client["id"])

    async def proxy_reset(self, worker: Worker) -> None:
        worker.needs_proxy().cut()

    async def latency(self, worker: Worker, seconds: float) -> None:
        """+50 ms on every packet of the node."""
        proxy = worker.needs_proxy()
        proxy.latency = 0.05
        try:
            await asyncio.sleep(seconds)
        finally:
            proxy.latency = 0.0

    async def partition(self, worker: Worker, seconds: float) -> None:
        """No packet in either direction, then healing."""
        proxy = worker.needs_proxy()
        proxy.blackhole()
        try:
            await asyncio.sleep(seconds)
        finally:
            proxy.heal()

    async def sigkill(self, worker: Worker, down: float) -> None:
        assert worker.process is not None
        worker.process.kill()
        await asyncio.to_thread(worker.process.wait, 10)
        worker.killed = True
        await asyncio.sleep(down)
        worker.spawn()  # the same node id: a new incarnation once the old lease is gone
        await worker.ready(timeout=LEASE_TTL * 3 + 30)

    async def sigstop(self, worker: Worker, seconds: float) -> None:
        assert worker.process is not None
        worker.process.send_signal(signal.SIGSTOP)
        worker.stopped = True
        try:
            await asyncio.sleep(seconds)
        finally:
            worker.process.send_signal(signal.SIGCONT)
            worker.stopped = False

    # -- Redis faults --------------------------------------------------------------------

    async def redis_stall(self, how: str, seconds: float) -> None:
        """Redis as a whole answers nobody (or, ``client_pause_write``, no write) for
        ``seconds``: ``redis_sigstop`` (SIGSTOP, then SIGCONT), ``client_pause_all`` /
        ``client_pause_write`` (``CLIENT PAUSE <ms> ALL|WRITE``, lifted by Redis itself),
        ``debug_sleep`` (the server's own thread sleeps). Over when a write goes through."""
        async with asyncio.timeout(seconds + 15):
            await self._stall(how, seconds)
            await self.until_writable()

    async def _stall(self, how: str, seconds: float) -> None:
        if how == "redis_sigstop":
            self.primary.pause()
            try:
                await asyncio.sleep(seconds)
            finally:
                self.primary.resume()
        elif how == "debug_sleep":
            async with self.admin() as admin:
                await admin.execute_command("DEBUG", "SLEEP", f"{seconds:.3f}")
        elif how in ("client_pause_all", "client_pause_write"):
            mode = how.rpartition("_")[2].upper()
            async with self.admin() as admin:
                await admin.execute_command("CLIENT", "PAUSE", str(round(seconds * 1000)), mode)
        else:
            raise ValueError(f"unknown Redis stall {how!r}")

    async def until_writable(self) -> None:
        """Until a write reaches the primary (a paused write waits for the pause to lift)."""
        probe = f"chaos-probe:{self.namespace}"  # outside the namespace's keys
        while True:
            try:
                async with self.admin() as admin:
                    await admin.set(probe, "1", px=1000)
                return
            except (aioredis.ConnectionError, aioredis.TimeoutError):
                await asyncio.sleep(0.05)

    # -- Redis's error replies, and more partitions ------------------------------------

    async def redis_oom(self, seconds: float) -> None:
        """Redis out of memory (``noeviction``): the writes that need memory are refused."""
        async with self.admin() as admin:
            await admin.config_set("maxmemory", "1")
            try:
                await asyncio.sleep(seconds)
            finally:
                await admin.config_set("maxmemory", "0")

    async def redis_busy(self, seconds: float) -> None:
        """Someone's script loops: past a threshold, Redis answers BUSY to everyone."""
        async with self.admin() as admin:
            await admin.config_set("busy-reply-threshold", "20")
        looping = redis.Redis(port=self.primary.port)

        def loop() -> None:
            with contextlib.suppress(redis.ResponseError):
                looping.eval("while true do end", 0)
            looping.close()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            await asyncio.sleep(seconds)
        finally:
            async with self.admin() as admin:
                await admin.script_kill()
            await asyncio.to_thread(thread.join, 10)

    async def redis_misconf(self, seconds: float) -> None:
        """A snapshot that cannot be written: Redis refuses every write (MISCONF)."""
        async with self.admin() as admin:
            directory = (await admin.config_get("dir"))["dir"]
            await admin.config_set("dir", "/proc")
            await admin.bgsave()
            await self._bgsave_ends(admin, "err")
            try:
                await asyncio.sleep(seconds)
            finally:
                await admin.config_set("dir", directory)
                await admin.bgsave()
                await self._bgsave_ends(admin, "ok")

    @staticmethod
    async def _bgsave_ends(admin: aioredis.Redis, status: str) -> None:
        async with asyncio.timeout(10):
            while True:
                info = await admin.info("persistence")
                if not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == status:
                    return
                await asyncio.sleep(0.02)

    async def answer_error(self, worker: Worker, seconds: float, reply: str) -> None:
        """Every command of one node answered with the error ``reply`` (through its proxy)."""
        proxy = worker.needs_proxy()
        proxy.answer(reply)
        try:
            await asyncio.sleep(seconds)
        finally:
            proxy.heal()

    async def all_partitioned(self, seconds: float) -> None:
        """Every node cut off from Redis at once (each behind a silent proxy)."""
        proxies = [worker.needs_proxy() for worker in self.workers]
        for proxy in proxies:
            proxy.blackhole()
        try:
            await asyncio.sleep(seconds)
        finally:
            for proxy in proxies:
                proxy.heal()

    async def loop_blocked(self, worker: Worker, seconds: float) -> None:
        """The node's own event loop blocked (a long turn of CPU work) for ``seconds``."""
        async with httpx.AsyncClient(timeout=seconds + 10) as client:
            with contextlib.suppress(httpx.HTTPError):  # answered once the loop runs again
                await client.post(f"{worker.url}/chaos/block", params={"seconds": seconds})

    async def snapshot_frozen(self) -> None:
        """Pause writes on the primary for good (it is about to be lost) and keep what it holds
        of the runs for the checker: it is part of the history, whatever the loss takes."""
        prefix = f"cb:{{{self.namespace}}}:run:"
        async with asyncio.timeout(30), self.admin() as admin:
            await admin.execute_command("CLIENT", "PAUSE", "30000", "WRITE")  # a still picture
            async for key in admin.scan_iter(match=f"{prefix}*", count=1000):
                fields = await admin.hgetall(key)
                if fields:
                    self.forgotten[key[len(prefix) :]] = fields

    async def redis_restart(self) -> None:
        """Kill Redis and start it again on the same port: every key is gone."""
        assert self.server is not None, "a restart with data loss: proxied topology only"
        await self.snapshot_frozen()
        await asyncio.to_thread(self.server.restart)  # the paused writes die with it

    async def failover(self) -> None:
        """A real Sentinel failover: writes paused on the primary and what it holds kept for
        the checker, the replica caught up, the primary SIGKILLed, the sentinels promote the
        replica; the old primary comes back as the new replica (so failovers can repeat)."""
        group = self.group
        assert group is not None, "a failover: sentinel topology only"
        await self.snapshot_frozen()
        await asyncio.to_thread(group.promote)
        await asyncio.to_thread(group.restore_replica)
