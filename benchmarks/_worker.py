"""A benchmark worker process: one cancel-bus node with a bus per namespace it serves (or a raw
redis-py client for the floor, or an HTTP client), driven by the benchmark over JSON lines (see
``_harness``).

Timestamps that are compared across processes are ``time.time_ns()`` (CLOCK_REALTIME, one clock
for the whole host); durations measured inside one process use ``time.perf_counter_ns()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
from redis.asyncio import Redis

from cancel_bus import CancelBus, RunCancelled, RunHandle

from ._harness import Handler, serve

SUBSCRIBER_POLL = 1.0  # seconds a subscriber's get_message waits, as the bus's listener does
LAG_PROBE = 0.005  # seconds between the wake-ups of the event-loop lag probe


class _Empty:
    """The reference of the hot-path benchmark: a method that does nothing."""

    __slots__ = ()

    def method(self) -> None:
        pass


Call = Callable[[], object]


def _calls(fn: Call, iterations: range) -> None:
    for _ in iterations:
        fn()


def _no_calls(_fn: Call, iterations: range) -> None:
    for _ in iterations:
        pass


def _best_ns(loop: Callable[[Call, range], None], fn: Call, calls: int, best_of: int) -> float:
    """ns per iteration of ``loop(fn, range(calls))``, the best of ``best_of`` (as timeit)."""
    iterations = range(calls)
    best = math.inf
    for _ in range(best_of):
        started = time.perf_counter_ns()
        loop(fn, iterations)
        best = min(best, time.perf_counter_ns() - started)
    return best / calls


class BusWorker:
    def __init__(self) -> None:
        self.buses: dict[str, CancelBus] = {}
        self.clients: dict[str, Redis] = {}
        self.http: httpx.AsyncClient | None = None
        self.woken: dict[str, int] = {}
        self.woken_waiters: dict[str, asyncio.Future[int]] = {}
        self.runs: dict[str, tuple[asyncio.Task[None], RunHandle]] = {}
        self.observed: dict[str, int] = {}
        self.idle: dict[str, asyncio.Event] = {}
        self.idle_tasks: set[asyncio.Task[None]] = set()
        self.sessions = 0
        self.background: set[asyncio.Task[None]] = set()
        self.held: dict[str, tuple[asyncio.Task[None], asyncio.Event, RunHandle]] = {}

    def handler(self, op: str) -> Handler:
        found: Handler = getattr(self, f"op_{op}")
        return found

    def client(self, url: str) -> Redis:
        if url not in self.clients:
            self.clients[url] = Redis.from_url(url, decode_responses=True)
        return self.clients[url]

    def node(self, namespace: str | None = None) -> CancelBus:
        """The bus of ``namespace``, by default of the first one started."""
        assert self.buses, "bus_start first"
        return self.buses[namespace or next(iter(self.buses))]

    # -- the floor ----------------------------------------------------------------------------

    async def op_floor_subscribe(self, url: str, channel: str) -> None:
        """Subscribe; a reader task takes messages (as the bus's listener does) and sets an event
        that a waker task awaits: the wake-up time is what the floor measures."""
        pubsub = self.client(url).pubsub()
        await pubsub.subscribe(channel)
        subscribed = await pubsub.get_message(timeout=5.0)
        assert subscribed is not None and subscribed["type"] == "subscribe", subscribed
        event = asyncio.Event()
        last: list[str] = []

        async def reader() -> None:
            while True:
                message = await pubsub.get_message(timeout=SUBSCRIBER_POLL)
                if message is not None and message["type"] == "message":
                    last.append(message["data"])
                    event.set()

        async def waker() -> None:
            while True:
                await event.wait()
                now = time.time_ns()
                event.clear()
                for data in last:
                    self.woken[data] = now
                    waiter = self.woken_waiters.pop(data, None)
                    if waiter is not None:
                        waiter.set_result(now)
                last.clear()

        for job in (reader(), waker()):
            self.background.add(asyncio.create_task(job))

    async def op_floor_woken(self, message: str, timeout: float) -> int:
        """When the waker woke for ``message`` (time_ns)."""
        if message in self.woken:
            return self.woken.pop(message)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.woken_waiters[message] = future
        at = await asyncio.wait_for(future, timeout)
        self.woken.pop(message, None)
        return at

    async def op_publish(self, url: str, channel: str, message: str, lookup: str = "") -> int:
        """PUBLISH (after an HGET of the channel's name from ``lookup`` if given); the time_ns
        just before."""
        redis = self.client(url)
        started = time.time_ns()
        if lookup:
            channel = str(await redis.hget(lookup, "owner") or channel)
        await redis.publish(channel, message)
        return started

    async def op_ping(self, url: str, n: int) -> list[int]:
        """Round-trip times of ``n`` sequential PINGs (ns)."""
        redis = self.client(url)
        samples = []
        for _ in range(n):
            started = time.perf_counter_ns()
            await redis.ping()
            samples.append(time.perf_counter_ns() - started)
        return samples

    async def op_ping_throughput(self, url: str, concurrency: int, seconds: float) -> float:
        """PINGs per second with ``concurrency`` callers in flight."""
        redis = Redis.from_url(url, decode_responses=True, max_connections=concurrency)
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        counts = [0] * concurrency

        async def caller(i: int) -> None:
            while loop.time() < end:
                await redis.ping()
                counts[i] += 1

        started = loop.time()
        await asyncio.gather(*(caller(i) for i in range(concurrency)))
        elapsed = loop.time() - started
        await redis.aclose()
        return sum(counts) / elapsed

    # -- one cancel-bus node ------------------------------------------------------------------

    async def op_bus_start(
        self, url: str, namespace: str, node_id: str, options: dict[str, Any] | None = None
    ) -> None:
        """Serve ``namespace`` too: one more bus, as a node serving several namespaces has.
        ``options``: more keyword arguments of :class:`CancelBus` (``sweep_interval``)."""
        bus = CancelBus(url, namespace=namespace, node_id=node_id, **(options or {}))
        await bus.start()
        self.buses[namespace] = bus

    async def op_stats(self, namespace: str | None = None) -> dict[str, int]:
        """The bus's counters (``BusStats``)."""
        return dataclasses.asdict(self.node(namespace).stats)

    async def op_hold_start(self, namespace: str | None = None) -> str:
        """Enter ``bus.run()`` (nothing else: a run of a lifecycle) and hold the run open until
        :meth:`op_hold_finish`; -> its id once its start has returned."""
        started: asyncio.Future[RunHandle] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()

        async def body() -> None:
            async with self.node(namespace).run() as run:
                started.set_result(run)
                await release.wait()

        task = asyncio.create_task(body())
        handle = await asyncio.wait_for(started, 10.0)
        self.held[handle.run_id] = (task, release, handle)
        return handle.run_id

    async def op_hold_finish(self, run_id: str) -> str | None:
        """Let a run of :meth:`op_hold_start` end normally; -> its recorded final status."""
        task, release, handle = self.held.pop(run_id)
        release.set()
        await asyncio.wait_for(task, 10.0)
        status = handle.final_status
        return None if status is None else str(status.value)

    async def op_lifecycle_once(self, n: int = 1) -> list[int]:
        """``n`` lifecycles one after another (``async with bus.run(): pass``): ns each."""
        bus = self.node()
        samples = []
        for _ in range(n):
            started = time.perf_counter_ns()
            async with bus.run():
                pass
            samples.append(time.perf_counter_ns() - started)
        return samples

    async def op_run_start(
        self, idle: bool = False, namespace: str | None = None, parent: str | None = None
    ) -> str:
        """Start a run in a tight checkpoint loop (checkpoint, yield to the loop, again), or an
        ``idle`` one that awaits an event set by its cancel callback, then checkpoints; the child
        of ``parent`` (a run id, on any node) if given."""
        started: asyncio.Future[RunHandle] = asyncio.get_running_loop().create_future()

        async def body() -> None:
            async with self.node(namespace).run(parent=parent) as run:
                started.set_result(run)
                woken = asyncio.Event()
                try:
                    if idle:
                        run.add_cancel_callback(lambda _request: woken.set())
                        await woken.wait()
                    while True:
                        run.checkpoint()
                        await asyncio.sleep(0)
                except RunCancelled:
                    self.observed[run.run_id] = time.time_ns()
                    raise

        task = asyncio.create_task(body())
        handle = await asyncio.wait_for(started, 10.0)
        self.runs[handle.run_id] = (task, handle)
        return handle.run_id

    async def op_run_end(self, run_id: str, timeout: float) -> dict[str, Any]:
        """Wait for a run of :meth:`op_run_start` to end: when it raised, how it was recorded."""
        task, handle = self.runs.pop(run_id)
        await asyncio.wait_for(task, timeout)
        status = handle.final_status
        return {"observed_ns": self.observed.pop(run_id, None), "status": status}

    async def op_cancel(
        self, run_id: str, timeout: float, namespace: str | None = None
    ) -> dict[str, Any]:
        """``bus.cancel(run_id, wait=True)``: when it was called (time_ns), how long it took, its
        outcome, and the answer for each run of its tree below it (deepest first: its id, its
        outcome, its recorded status; empty for a run without descendants)."""
        bus = self.node(namespace)
        started_at = time.time_ns()
        started = time.perf_counter_ns()
        result = await bus.cancel(run_id, wait=True, timeout=timeout)
        elapsed = time.perf_counter_ns() - started
        below = [
            {
                "run_id": r.run.run_id if r.run is not None else None,
                "outcome": r.outcome.value,
                "status": r.run.status.value if r.run is not None else None,
            }
            for r in result.descendants
        ]
        return {
            "t0_ns": started_at,
            "elapsed_ns": elapsed,
            "outcome": result.outcome.value,
            "descendants": below,
        }

    async def op_fill(self, count: int, concurrency: int, return_ids: bool) -> dict[str, Any]:
        """Start ``count`` idle runs (with a session key), spread over the namespaces in turn,
        that wait until a cancel reaches them (``add_cancel_callback``), then checkpoint: they stop
        at once, without a busy loop. ``runs``: ``[namespace, run id]`` pairs."""
        runs: list[list[str]] = []
        namespaces = list(self.buses)
        started_at = time.perf_counter()
        for first in range(0, count, concurrency):
            batch = [
                self._idle_run(namespaces[i % len(namespaces)])
                for i in range(first, min(first + concurrency, count))
            ]
            runs.extend(await asyncio.wait_for(asyncio.gather(*batch), 30.0))
        seconds = time.perf_counter() - started_at
        return {"runs": runs if return_ids else [], "seconds": seconds}

    async def _idle_run(self, namespace: str) -> list[str]:
        bus = self.node(namespace)
        self.sessions += 1
        session = f"{bus.node_id}-{self.sessions}"
        started: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()

        async def body() -> None:
            async with bus.run(app_name="bench", user_id="user", session_id=session) as run:
                run.add_cancel_callback(lambda _request: release.set())
                self.idle[run.run_id] = release
                started.set_result([namespace, run.run_id])
                await release.wait()
                self.idle.pop(run.run_id, None)
                run.checkpoint()

        task = asyncio.create_task(body())
        self.idle_tasks.add(task)
        task.add_done_callback(self.idle_tasks.discard)
        await asyncio.wait((task, started), return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()  # raises what stopped the run from starting
        return started.result()

    async def op_release_all(self, timeout: float) -> dict[str, Any]:
        """Let every idle run end normally (``succeeded``), all in the same event-loop turn (each
        release event is set before anything else runs); -> seconds until every run's scope
        has exited, the event loop's worst lag meanwhile (a task that asks to wake every
        ``LAG_PROBE`` seconds: how late it woke), and the bus's counters before and after."""
        loop = asyncio.get_running_loop()
        before = dataclasses.asdict(self.node().stats)
        worst = 0.0
        done = False

        async def probe() -> None:
            nonlocal worst
            while not done:
                due = loop.time() + LAG_PROBE
                await asyncio.sleep(LAG_PROBE)
                worst = max(worst, loop.time() - due)

        prober = asyncio.create_task(probe())
        await asyncio.sleep(0)  # the probe is waiting before the burst starts
        started = time.perf_counter()
        for release in list(self.idle.values()):
            release.set()
        try:
            if self.idle_tasks:
                await asyncio.wait_for(asyncio.gather(*self.idle_tasks), timeout)
            seconds = time.perf_counter() - started
        finally:
            done = True
            await prober
        after = dataclasses.asdict(self.node().stats)
        return {"seconds": seconds, "max_lag_s": worst, "stats_before": before, "stats": after}

    async def op_cancel_load(self, runs: list[list[str]], rate: float, timeout: float) -> Any:
        """Open-loop cancels of ``[namespace, run id]`` pairs at ``rate`` per second, each waiting
        for confirmation. A cancel's latency counts from when it was due, so falling behind shows
        (no coordinated omission)."""
        loop = asyncio.get_running_loop()
        latencies: list[int] = []
        outcomes: Counter[str] = Counter()

        async def one(namespace: str, run_id: str, due: float) -> None:
            try:
                result = await self.node(namespace).cancel(run_id, wait=True, timeout=timeout)
                outcomes[result.outcome.value] += 1
            except Exception as exc:
                outcomes[type(exc).__name__] += 1
            latencies.append(int((loop.time() - due) * 1e9))

        begin = loop.time() + 0.05
        tasks = []
        for i, (namespace, run_id) in enumerate(runs):
            due = begin + i / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(namespace, run_id, due)))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout + 5)
        return {
            "latency_ns": latencies,
            "outcomes": dict(outcomes),
            "seconds": loop.time() - begin,
        }

    async def op_cancel_each(
        self, runs: list[list[str]], timeout: float, seconds: float
    ) -> dict[str, Any]:
        """Cancel ``[namespace, run id]`` pairs one after another, each waiting for its
        confirmation (the cross-node path, nothing else in this process meanwhile), for at
        most ``seconds``."""
        outcomes: Counter[str] = Counter()
        started = time.perf_counter()
        for namespace, run_id in runs:
            if time.perf_counter() - started >= seconds:
                break
            result = await self.node(namespace).cancel(run_id, wait=True, timeout=timeout)
            outcomes[result.outcome.value] += 1
        return {"outcomes": dict(outcomes), "seconds": time.perf_counter() - started}

    async def op_lifecycles(self, seconds: float, concurrency: int) -> dict[str, Any]:
        """``async with bus.run(): pass`` in ``concurrency`` loops for ``seconds``, the loops
        spread over the namespaces in turn."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        latencies: list[int] = []
        buses = list(self.buses.values())

        async def looping(bus: CancelBus) -> None:
            while loop.time() < end:
                started = time.perf_counter_ns()
                async with bus.run():
                    pass
                latencies.append(time.perf_counter_ns() - started)

        started = loop.time()
        loops = (looping(buses[i % len(buses)]) for i in range(concurrency))
        await asyncio.wait_for(asyncio.gather(*loops), seconds + 30)
        return {"count": len(latencies), "seconds": loop.time() - started, "latency_ns": latencies}

    async def op_hot_path(self, calls: int, repeats: int, best_of: int) -> dict[str, list[float]]:
        """ns per call (loop included) of an empty method, ``checkpoint()`` and
        ``turn_boundary()`` on a live run, and of the bare loop; interleaved, ``repeats`` times."""
        samples: dict[str, list[float]] = {
            "loop": [],
            "empty_method": [],
            "checkpoint": [],
            "turn_boundary": [],
        }
        async with self.node().run() as run:
            functions = {
                "empty_method": _Empty().method,
                "checkpoint": run.checkpoint,
                "turn_boundary": run.turn_boundary,
            }
            for _ in range(repeats):
                samples["loop"].append(_best_ns(_no_calls, run.checkpoint, calls, best_of))
                for name, fn in functions.items():
                    samples[name].append(_best_ns(_calls, fn, calls, best_of))
        return samples

    # -- an HTTP client of node services ------------------------------------------------------

    async def op_http_start(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/runs: the run's id, ns to the response (a 201)."""
        started = time.perf_counter_ns()
        response = await self._http().post(f"{url}/v1/runs", json=body)
        elapsed = time.perf_counter_ns() - started
        if response.status_code != 201:
            raise RuntimeError(f"POST /v1/runs answered {response.status_code}: {response.text}")
        return {"run_id": response.json()["run_id"], "elapsed_ns": elapsed}

    async def op_http_cancel(self, url: str, run_id: str, timeout: float) -> dict[str, Any]:
        """POST /v1/runs/{id}/cancel with wait=true: how long until the response, its code."""
        body = {"wait": True, "timeout": timeout}
        started = time.perf_counter_ns()
        response = await self._http().post(f"{url}/v1/runs/{run_id}/cancel", json=body)
        elapsed = time.perf_counter_ns() - started
        return {"elapsed_ns": elapsed, "code": response.status_code}

    async def op_http_get(self, url: str, path: str) -> int:
        """GET ``path``: ns to the response (a 200)."""
        started = time.perf_counter_ns()
        response = await self._http().get(f"{url}{path}")
        elapsed = time.perf_counter_ns() - started
        response.raise_for_status()
        return elapsed

    async def op_http_cycle(
        self, start_url: str, cancel_url: str, agent: dict[str, Any], seconds: float
    ) -> dict[str, Any]:
        """For ``seconds``: start a run of the agent on ``start_url``, cancel it (``wait=true``)
        on ``cancel_url``, again; -> how many, and the cancels' status codes."""
        codes: Counter[int] = Counter()
        started = time.perf_counter()
        count = 0
        while time.perf_counter() - started < seconds:
            count += 1
            session = f"cycle-{time.time_ns()}-{count}"
            body = {"app_name": "bench", "user_id": "user", "session_id": session, "agent": agent}
            run = await self.op_http_start(start_url, body)
            answer = await self.op_http_cancel(cancel_url, run["run_id"], 5.0)
            codes[answer["code"]] += 1
        return {"count": count, "codes": {str(k): v for k, v in codes.items()}}

    def _http(self) -> httpx.AsyncClient:
        if self.http is None:
            self.http = httpx.AsyncClient(timeout=30.0)
        return self.http

    async def close(self) -> None:
        for task in self.background:
            task.cancel()
        for bus in self.buses.values():
            await bus.close(cancel_timeout=5.0)
        for redis in self.clients.values():
            with contextlib.suppress(Exception):
                await redis.aclose()
        if self.http is not None:
            await self.http.aclose()


def main() -> None:
    worker = BusWorker()
    serve(worker.handler, worker.close)


if __name__ == "__main__":
    main()
