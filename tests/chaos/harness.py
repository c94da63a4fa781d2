"""The chaos cluster: one real Redis (no persistence), N node processes, each talking to Redis
through its own fault proxy, and the faults the suite injects into them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from node.embedded import EmbeddedServer, free_port

from ..faultproxy import FaultProxy

LEASE_TTL = 2.0
SWEEP = 2.0  # the bus default sweep interval
RETENTION = 600.0


@dataclass
class Worker:
    name: str
    proxy: FaultProxy
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


@dataclass
class Cluster:
    workdir: Path
    size: int
    namespace: str
    server: EmbeddedServer = field(init=False)
    workers: list[Worker] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    fault_log: list[tuple[float, str, str]] = field(default_factory=list)
    forgotten: dict[str, dict[str, str]] = field(default_factory=dict)  # runs before a restart

    @property
    def audit_dir(self) -> Path:
        return self.workdir / "audit"

    async def start(self) -> None:
        self.audit_dir.mkdir(parents=True, exist_ok=True)
        self.server = EmbeddedServer().start()
        for i in range(self.size):
            name = f"chaos-{i + 1}"
            proxy = await FaultProxy(self.server.port).start()
            port = free_port()
            env = {
                **os.environ,
                "CANCEL_BUS_REDIS_URL": proxy.url,
                "CANCEL_BUS_NAMESPACE": self.namespace,
                "CANCEL_BUS_NODE_ID": name,
                "CANCEL_BUS_PORT": str(port),
                "CANCEL_BUS_LEASE_TTL": str(LEASE_TTL),
                "CANCEL_BUS_DRAIN_TIMEOUT": "1",
                "CANCEL_BUS_RETENTION": str(RETENTION),
                "CANCEL_BUS_API_TOKENS": "",
                "CANCEL_BUS_API_TOKENS_FILE": "",
                "CANCEL_BUS_LOG_LEVEL": "warning",
                "CHAOS_AUDIT_LOG": str(self.audit_dir / f"{name}.jsonl"),
            }
            worker = Worker(name, proxy, port, env, self.workdir / f"{name}.log")
            worker.spawn()
            self.workers.append(worker)
        await asyncio.gather(*(w.ready() for w in self.workers))

    async def stop(self) -> None:
        for worker in self.workers:
            worker.proxy.heal()
            if worker.process is not None and worker.process.poll() is None:
                if worker.stopped:
                    worker.process.send_signal(signal.SIGCONT)
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            if worker.process is not None:
                try:
                    await asyncio.to_thread(worker.process.wait, 20)
                except subprocess.TimeoutExpired:
                    worker.process.kill()
            await worker.proxy.close()
        self.server.cleanup()

    def admin(self) -> aioredis.Redis:
        return aioredis.Redis(port=self.server.port, decode_responses=True)

    def record(self, kind: str, target: str) -> None:
        self.faults[kind] += 1
        self.fault_log.append((time.time(), kind, target))

    # -- the faults ----------------------------------------------------------------------

    async def client_kill(self, worker: Worker) -> None:
        """CLIENT KILL of every connection of the node (its subscriber included)."""
        self.record("client_kill", worker.name)
        async with self.admin() as admin:
            for client in await admin.client_list():
                if client.get("name", "").startswith(f"cancel-bus.{worker.name}"):
                    with contextlib.suppress(Exception):
                        await admin.client_kill_filter(_id=client["id"])

    async def proxy_reset(self, worker: Worker) -> None:
        self.record("proxy_reset", worker.name)
        worker.proxy.cut()

    async def latency(self, worker: Worker, seconds: float) -> None:
        self.record("latency_50ms", worker.name)
        worker.proxy.latency = 0.05
        await asyncio.sleep(seconds)
        worker.proxy.latency = 0.0

    async def partition(self, worker: Worker, seconds: float) -> None:
        """No packet in either direction for longer than the lease, then healing."""
        self.record("partition", worker.name)
        worker.proxy.blackhole()
        await asyncio.sleep(seconds)
        worker.proxy.heal()

    async def sigkill(self, worker: Worker, down: float) -> None:
        assert worker.process is not None
        self.record("sigkill", worker.name)
        worker.process.kill()
        await asyncio.to_thread(worker.process.wait)
        worker.killed = True
        await asyncio.sleep(down)
        worker.spawn()  # the same node id: a new incarnation once the old lease is gone
        await worker.ready(timeout=LEASE_TTL * 3 + 30)

    async def sigstop(self, worker: Worker, seconds: float) -> None:
        assert worker.process is not None
        self.record("sigstop", worker.name)
        worker.process.send_signal(signal.SIGSTOP)
        worker.stopped = True
        await asyncio.sleep(seconds)
        worker.process.send_signal(signal.SIGCONT)
        worker.stopped = False

    async def redis_restart(self) -> None:
        """Kill Redis and start it again on the same port: every key is gone. What Redis held
        just before is kept for the checker: it is part of the history."""
        self.record("redis_restart_data_loss", "redis")
        prefix = f"cb:{{{self.namespace}}}:run:"
        async with self.admin() as admin:
            await admin.execute_command("CLIENT", "PAUSE", "30000", "WRITE")  # a still picture
            async for key in admin.scan_iter(match=f"{prefix}*", count=1000):
                fields = await admin.hgetall(key)
                if fields:
                    self.forgotten[key[len(prefix) :]] = fields
        await asyncio.to_thread(self.server.restart)  # the paused writes die with it
