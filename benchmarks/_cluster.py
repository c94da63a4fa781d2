"""What a benchmark starts: its own Redis server on a free port (or a local Redis Cluster), node
processes (library workers or ``python -m node.cli serve``), and the one cancel measurement
several benchmarks share.

Everything a :class:`Scope` starts is stopped when the scope ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
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

from cancel_bus._scripts import ALL_SCRIPTS
from node.embedded import EmbeddedServer, free_port
from tests.topology import Cluster

from ._harness import Worker, machine_cpu_seconds, orphan_guard, process_cpu_seconds
from ._report import Report

REPO = Path(__file__).resolve().parent.parent
SCRIPT_NAMES = {
    hashlib.sha1(text.encode()).hexdigest(): name  # Redis names a script by its SHA-1
    for name, text in ALL_SCRIPTS.items()
}
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
    lifecycle_seconds: float  # the cluster section's lifecycle loops
    rate_rounds: int  # throughput: rounds of (PINGs/s, lifecycles/s) in the same node process
    rate_seconds: float  # ... each loop's length
    cancel_rates: tuple[int, ...]
    cancel_step_seconds: float
    hot_calls: int
    hot_repeats: int
    peers_n: int
    round_trip_repeats: int  # isolated operations per path whose Redis commands are counted
    profile_seconds: float  # --profile: how long py-spy samples each profiled workload


PROFILES = {
    "full": Profile(
        name="full",
        n=500,
        warmup=30,
        scaling_n=200,
        node_counts=(1, 2, 4, 8),
        run_counts=(100, 10_000, 100_000),
        lifecycle_seconds=5.0,
        rate_rounds=3,
        rate_seconds=2.0,
        cancel_rates=(250, 500, 750, 1000, 1500, 2000, 2500, 3000, 4000),
        cancel_step_seconds=3.0,
        hot_calls=200_000,
        hot_repeats=200,
        peers_n=200,
        round_trip_repeats=5,
        profile_seconds=10.0,
    ),
    "quick": Profile(
        name="quick",
        n=40,
        warmup=5,
        scaling_n=20,
        node_counts=(1, 2),
        run_counts=(100, 2_000),
        lifecycle_seconds=1.0,
        rate_rounds=1,
        rate_seconds=1.0,
        cancel_rates=(250, 500),
        cancel_step_seconds=1.0,
        hot_calls=50_000,
        hot_repeats=20,
        peers_n=10,
        round_trip_repeats=3,
        profile_seconds=3.0,
    ),
}


@dataclass
class Bench:
    """What every benchmark gets: the sizes, the report, where processes write their logs.
    ``py_spy``: the profiler's binary when ``--profile`` was given; ``profile_all``: sample every
    node process of every benchmark with it (``--profile-all``)."""

    profile: Profile
    report: Report
    log_dir: Path
    py_spy: Path | None = None
    profile_all: bool = False
    artifacts: Path | None = None  # where --profile's profiles are kept

    def scope(self) -> Scope:
        return Scope(self.log_dir, self.py_spy if self.profile_all else None)

    @contextlib.asynccontextmanager
    async def stage(self, name: str) -> AsyncIterator[tuple[Scope, EmbeddedServer]]:
        """A scope with a Redis server of its own, its duration printed; the load average and
        how busy the whole machine was meanwhile go to the run's metadata (the machine is
        shared: other work shows there)."""
        busy, total = machine_cpu_seconds()
        load = os.getloadavg()
        async with self.scope() as scope, timed_phase(name) as elapsed:
            yield scope, await scope.redis()
        busy_after, total_after = machine_cpu_seconds()
        stages: list[dict[str, Any]] = self.report.meta.setdefault("stages", [])
        cpus = os.cpu_count() or 1
        stages.append(
            {
                "stage": name,
                "seconds": round(elapsed(), 1),
                "load_at_start": [round(x, 2) for x in load],
                "machine_busy_cores": round(
                    cpus * (busy_after - busy) / max(total_after - total, 1e-9), 2
                ),
            }
        )


def script_name(sha: str) -> str:
    """The library script a SHA-1 names (``EVALSHA <sha>``), else the SHA's start."""
    return SCRIPT_NAMES.get(sha, f"EVALSHA {sha[:8]}")


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
            CANCEL_BUS_ACCESS_LOG="false",  # as the bare app (the HTTP floor); ignored if unknown
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


class BareApp(ChildProcess):
    """The HTTP floor: a FastAPI app with ``GET /healthz`` alone, served by uvicorn with the
    node's options (``python -m benchmarks._bare_app``), on a free port."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "benchmarks._bare_app", "--port", str(self.port)]
        super().__init__(name, argv, log_dir)

    async def wait_ready(self, timeout: float = 30.0) -> BareApp:
        async with httpx.AsyncClient(timeout=1.0) as client, asyncio.timeout(timeout):
            while True:
                if self.exited:
                    raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/healthz")).status_code == 200:
                        return self
                await asyncio.sleep(0.05)


class Scope:
    """The servers and processes of one benchmark (or one configuration of it). With a
    ``py_spy`` binary (``--profile-all``), py-spy samples every node process of the scope, from
    its start to its end; the profiles land in the log dir."""

    def __init__(self, log_dir: Path, py_spy: Path | None = None) -> None:
        self.log_dir = log_dir
        self.py_spy = py_spy
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
        if self.py_spy is None:
            return
        out = self.log_dir / f"{name}.speedscope.json"
        argv = [str(self.py_spy), "record", "--nonblocking", "--format", "speedscope"]
        argv += ["--output", str(out), "--pid", str(pid)]
        profiler = ChildProcess(f"{name}.py-spy", argv, self.log_dir)
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

    async def node(
        self,
        server: Server,
        namespace: str | Sequence[str],
        name: str,
        options: dict[str, Any] | None = None,
    ) -> Worker:
        """A worker process holding a started :class:`CancelBus` for the namespace (one node of
        the cluster), or one for each of several namespaces, the first its default.
        ``options``: more arguments of the bus (``sweep_interval``)."""
        worker = await self.worker(name)
        for each in [namespace] if isinstance(namespace, str) else namespace:
            await worker.call(
                "bus_start", url=server.url, namespace=each, node_id=name, options=options
            )
        await self._profile(name, worker.pid)
        return worker

    async def nodes(
        self,
        server: Server,
        namespace: str | Sequence[str],
        names: list[str],
        options: dict[str, Any] | None = None,
    ) -> list[Worker]:
        return list(
            await asyncio.gather(*(self.node(server, namespace, n, options) for n in names))
        )

    async def bare_app(self, name: str) -> BareApp:
        app = BareApp(name, self.log_dir)
        self._stack.push_async_callback(app.stop)
        await app.start()
        return await app.wait_ready()

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


class CpuMeter:
    """CPU used meanwhile (``async with meter:``), in % of one core: by each named process
    (``/proc``), by each named Redis server (``INFO cpu``) and by the whole machine (every
    core, everybody's work: the machine is shared). What bounds a rate shows here: a process at
    ~100 % is bound by its own (GIL-holding) thread; a machine at ~100 % of every core, by the
    machine."""

    def __init__(self, processes: dict[str, int], servers: dict[str, Redis] | None = None) -> None:
        self.processes = processes
        self.servers = servers or {}
        self.shares: dict[str, float] = {}
        self.used: dict[str, float] = {}  # CPU seconds each used meanwhile
        self.elapsed = 0.0
        self._start: dict[str, float] = {}
        self._started = 0.0

    async def _snapshot(self) -> dict[str, float]:
        seconds = {name: process_cpu_seconds(pid) for name, pid in self.processes.items()}
        for name, server in self.servers.items():
            info = await server.info("cpu")
            seconds[name] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        seconds["machine"] = machine_cpu_seconds()[0]
        return seconds

    async def __aenter__(self) -> CpuMeter:
        self._start = await self._snapshot()
        self._started = asyncio.get_running_loop().time()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.elapsed = max(asyncio.get_running_loop().time() - self._started, 1e-9)
        end = await self._snapshot()
        self.used = {name: end[name] - self._start[name] for name in end}
        self.shares = {name: 100 * used / self.elapsed for name, used in self.used.items()}

    def note(self) -> str:
        cores = os.cpu_count() or 1
        parts = [f"{name} {share:.0f}" for name, share in self.shares.items() if name != "machine"]
        machine = self.shares.get("machine", math.nan)
        return f"CPU % of a core: {', '.join(parts)}; machine {machine:.0f} of {100 * cores}"


async def redis_memory(redis: Redis) -> int:
    """Bytes the server holds for data: allocated memory less client buffers, script caches
    and other non-data overhead (``MEMORY STATS``), so connections opened meanwhile count not."""
    stats: dict[str, Any] = await redis.memory_stats()
    overhead = ("clients.normal", "clients.slaves", "lua.caches", "functions.caches")
    return int(stats["total.allocated"]) - sum(int(stats.get(key, 0)) for key in overhead)


@contextlib.asynccontextmanager
async def timed_phase(name: str) -> AsyncIterator[Callable[[], float]]:
    """Print what the benchmark is doing (a full run takes minutes); yields its elapsed time."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    print(f"  {name} ...", flush=True)
    yield lambda: loop.time() - started
    print(f"  {name}: {loop.time() - started:.1f}s", flush=True)
