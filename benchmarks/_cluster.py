"""What a benchmark starts: its own Redis server on a free port (or a local Redis Cluster), node
processes (library workers or ``python -m node.cli serve``), and the one cancel measurement
several benchmarks share.

Everything a :class:`Scope` starts is stopped when the scope ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
from redis.asyncio import Redis

from node.embedded import EmbeddedServer, free_port
from tests.topology import Cluster

from ._harness import Worker, orphan_guard
from ._report import Report

REPO = Path(__file__).resolve().parent.parent
CANCEL_TIMEOUT = 5.0  # the cancel's own timeout (an unconfirmed cancel answers "stopping")
SAMPLE_TIMEOUT = 15.0
PROFILER_EXIT = 30.0


@dataclass(frozen=True)
class Profile:
    """How much to measure: ``full`` for the documented run, ``quick`` while developing."""

    name: str
    n: int  # latency samples per measurement (after the warm-up)
    warmup: int
    scaling_n: int
    node_counts: tuple[int, ...]
    run_counts: tuple[int, ...]
    lifecycle_seconds: float
    cancel_rates: tuple[int, ...]
    cancel_step_seconds: float
    hot_calls: int
    hot_repeats: int
    peers_n: int


PROFILES = {
    "full": Profile(
        name="full",
        n=500,
        warmup=30,
        scaling_n=200,
        node_counts=(1, 2, 4, 8),
        run_counts=(100, 10_000, 100_000),
        lifecycle_seconds=5.0,
        cancel_rates=(250, 500, 750, 1000, 1500, 2000, 3000, 4000),
        cancel_step_seconds=3.0,
        hot_calls=200_000,
        hot_repeats=200,
        peers_n=200,
    ),
    "quick": Profile(
        name="quick",
        n=40,
        warmup=5,
        scaling_n=20,
        node_counts=(1, 2),
        run_counts=(100, 2_000),
        lifecycle_seconds=1.0,
        cancel_rates=(250, 500),
        cancel_step_seconds=1.0,
        hot_calls=50_000,
        hot_repeats=20,
        peers_n=10,
    ),
}


@dataclass
class Bench:
    """What every benchmark gets: the sizes, the report, where processes write their logs."""

    profile: Profile
    report: Report
    log_dir: Path
    profiling: bool = False

    def scope(self) -> Scope:
        return Scope(self.log_dir, self.profiling)

    @contextlib.asynccontextmanager
    async def stage(self, name: str) -> AsyncIterator[tuple[Scope, EmbeddedServer]]:
        """A scope with a Redis server of its own, its duration printed."""
        async with self.scope() as scope, timed_phase(name):
            yield scope, await scope.redis()


def new_namespace() -> str:
    return f"bench-{uuid.uuid4().hex[:10]}"


class Server(Protocol):
    """What nodes connect to: one server, or a cluster (``redis+cluster://``)."""

    @property
    def url(self) -> str: ...


class GuardedServer(EmbeddedServer):
    """The embedded server, which also exits if the benchmark process dies first."""

    def args(self) -> list[str]:
        return [*orphan_guard(), *super().args()]


class GuardedCluster(Cluster):
    """The tests' local Redis Cluster, of guarded servers."""

    @staticmethod
    def _server(args: list[str]) -> EmbeddedServer:
        return GuardedServer(extra_args=[*args, "--cluster-port", str(free_port())])


class ChildProcess:
    """A process in its own session, its output in a log file; stopped with its whole group
    (the peers' workers fork children of their own)."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> ChildProcess:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *orphan_guard(),
                *self.argv,
                env=self.env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def exited(self) -> bool:
        return self.process is not None and self.process.returncode is not None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    async def wait(self, timeout: float) -> int:
        assert self.process is not None
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the group (a node drains), then SIGKILL if it has not exited in time."""
        process = self.process
        if process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                await asyncio.wait_for(process.wait(), timeout)
                return
            except TimeoutError:
                continue


class ServiceProcess(ChildProcess):
    """One ``python -m node.cli serve`` (uvicorn, its own event loop and bus) on a free port."""

    def __init__(self, name: str, redis_url: str, namespace: str, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANCEL_BUS_")}
        env.update(
            CANCEL_BUS_REDIS_URL=redis_url,
            CANCEL_BUS_NAMESPACE=namespace,
            CANCEL_BUS_NODE_ID=name,
            CANCEL_BUS_PORT=str(self.port),
            CANCEL_BUS_LOG_LEVEL="warning",
            CANCEL_BUS_DRAIN_TIMEOUT="2",
        )
        super().__init__(name, [sys.executable, "-m", "node.cli", "serve"], log_dir, env)

    async def wait_ready(self, timeout: float = 30.0) -> ServiceProcess:
        """Poll /readyz until it answers 200."""
        async with httpx.AsyncClient(timeout=1.0) as client, asyncio.timeout(timeout):
            while True:
                if self.exited:
                    raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/readyz")).status_code == 200:
                        return self
                await asyncio.sleep(0.05)


class Scope:
    """The servers and processes of one benchmark (or one configuration of it). With
    ``profiling``, py-spy samples every node process; its flame graphs land in the log dir."""

    def __init__(self, log_dir: Path, profiling: bool = False) -> None:
        self.log_dir = log_dir
        self.profiling = profiling
        self._stack = contextlib.AsyncExitStack()
        self._profilers: list[ChildProcess] = []

    async def __aenter__(self) -> Scope:
        await self._stack.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.__aexit__(None, None, None)
        for profiler in self._profilers:  # each writes its file once its process has exited
            try:
                await profiler.wait(PROFILER_EXIT)
            except TimeoutError:
                await profiler.stop()

    async def _profile(self, name: str, pid: int) -> None:
        if not self.profiling:
            return
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
        out = self.log_dir / f"{name}.speedscope.json"
        argv = [spy, "record", "--nonblocking", "--format", "speedscope", "--output", str(out)]
        profiler = ChildProcess(f"{name}.py-spy", [*argv, "--pid", str(pid)], self.log_dir)
        self._profilers.append(await profiler.start())

    async def redis(self) -> EmbeddedServer:
        """A fresh server of its own on a free loopback port (nothing persisted)."""
        server = GuardedServer()
        self._stack.callback(server.cleanup)
        server.start()
        return server

    async def cluster(self, primaries: int) -> Cluster:
        """A Redis Cluster of ``primaries`` primaries (no replicas), the slots split evenly."""
        cluster = GuardedCluster(primaries=primaries, replicas_each=0)
        self._stack.callback(cluster.cleanup)
        return await asyncio.to_thread(cluster.start)  # bounded: it gives up after 30 s

    async def client(self, server: EmbeddedServer) -> Redis:
        """The benchmark's own connection (setup and INFO only; never in a timed path)."""
        redis = Redis.from_url(server.url, decode_responses=True)
        self._stack.push_async_callback(redis.aclose)
        return redis

    async def worker(self, name: str) -> Worker:
        worker = Worker(name, [sys.executable, "-m", "benchmarks._worker"], self.log_dir, cwd=REPO)
        self._stack.push_async_callback(worker.stop)
        return await worker.start()

    async def node(self, server: Server, namespace: str | Sequence[str], name: str) -> Worker:
        """A worker process holding a started :class:`CancelBus` for the namespace (one node of
        the cluster), or one for each of several namespaces, the first its default."""
        worker = await self.worker(name)
        for each in [namespace] if isinstance(namespace, str) else namespace:
            await worker.call("bus_start", url=server.url, namespace=each, node_id=name)
        await self._profile(name, worker.pid)
        return worker

    async def nodes(
        self, server: Server, namespace: str | Sequence[str], names: list[str]
    ) -> list[Worker]:
        return list(await asyncio.gather(*(self.node(server, namespace, n) for n in names)))

    async def service(self, server: EmbeddedServer, namespace: str, name: str) -> ServiceProcess:
        service = ServiceProcess(name, server.url, namespace, self.log_dir)
        self._stack.push_async_callback(service.stop)
        await service.start()
        await service.wait_ready()
        assert service.process is not None
        await self._profile(name, service.process.pid)
        return service

    async def process(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> ChildProcess:
        child = ChildProcess(name, argv, self.log_dir, env)
        self._stack.push_async_callback(child.stop)
        return await child.start()


class PairedFloor:
    """Floor hops between two processes of a benchmark, taken interleaved with its samples so
    that the floor sees the same processes, server and moment (the machine is shared)."""

    def __init__(self, server: EmbeddedServer, publisher: Worker, subscriber: Worker) -> None:
        self.url = server.url
        self.publisher = publisher
        self.subscriber = subscriber
        self.channel = f"floor:{uuid.uuid4().hex[:8]}"
        self._count = 0

    async def start(self) -> PairedFloor:
        await self.subscriber.call("floor_subscribe", url=self.url, channel=self.channel)
        return self

    async def sample(self, lookup: str = "") -> int:
        """One hop in ns: PUBLISH (after an HGET of ``lookup`` if given) -> the waker woke."""
        self._count += 1
        message = str(self._count)
        sent: int = await self.publisher.call(
            "publish", url=self.url, channel=self.channel, message=message, lookup=lookup
        )
        woke: int = await self.subscriber.call("floor_woken", message=message, timeout=5.0)
        return woke - sent


async def cancel_sample(
    owner: Worker, canceller: Worker, idle: bool = False, namespace: str | None = None
) -> tuple[int, int]:
    """One cancel of a run in a tight checkpoint loop on ``owner``, by ``canceller`` (the same
    process for a same-node cancel), or of an ``idle`` run woken by its cancel callback, in
    ``namespace`` (the nodes' default if not given).
    -> (observed, confirmed) in ns: observed is the run raising at its checkpoint minus the call
    (both ``time.time_ns()``), confirmed the call's duration."""
    run_id = await owner.call("run_start", idle=idle, namespace=namespace)
    answer: dict[str, Any] = await canceller.call(
        "cancel", run_id=run_id, timeout=CANCEL_TIMEOUT, namespace=namespace, within=SAMPLE_TIMEOUT
    )
    end: dict[str, Any] = await owner.call("run_end", run_id=run_id, timeout=CANCEL_TIMEOUT)
    if answer["outcome"] != "cancelled" or end["status"] != "cancelled":
        raise RuntimeError(f"cancel of {run_id}: {answer['outcome']}, run {end['status']}")
    return end["observed_ns"] - answer["t0_ns"], answer["elapsed_ns"]


@dataclass
class Rounds:
    """What :func:`paired_rounds` took, the warm-up left out: floor hops, and the cancels'
    observed and confirmed latencies by kind (ns)."""

    hops: list[int] = field(default_factory=list)
    observed: dict[str, list[int]] = field(default_factory=dict)
    confirmed: dict[str, list[int]] = field(default_factory=dict)


async def paired_rounds(
    floor: PairedFloor,
    warmup: int,
    n: int,
    take: Callable[[int], Awaitable[dict[str, tuple[int, int]]]],
) -> Rounds:
    """``warmup + n`` rounds, each a floor hop then ``take(i)``: cancel samples by kind."""
    rounds = Rounds()
    for i in range(warmup + n):
        hop = await floor.sample()
        samples = await take(i)
        if i >= warmup:
            rounds.hops.append(hop)
            for kind, (observed, confirmed) in samples.items():
                rounds.observed.setdefault(kind, []).append(observed)
                rounds.confirmed.setdefault(kind, []).append(confirmed)
    return rounds


async def redis_memory(redis: Redis) -> int:
    """Bytes the server holds for data: allocated memory less client buffers, script caches
    and other non-data overhead (``MEMORY STATS``), so connections opened meanwhile count not."""
    stats: dict[str, Any] = await redis.memory_stats()
    overhead = ("clients.normal", "clients.slaves", "lua.caches", "functions.caches")
    return int(stats["total.allocated"]) - sum(int(stats.get(key, 0)) for key in overhead)


@contextlib.asynccontextmanager
async def timed_phase(name: str) -> AsyncIterator[None]:
    """Print what the benchmark is doing (a full run takes minutes)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    print(f"  {name} ...", flush=True)
    yield
    print(f"  {name}: {loop.time() - started:.1f}s", flush=True)
