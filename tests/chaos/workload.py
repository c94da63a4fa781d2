"""The random workload (seeded, replayable) and the fault schedule; every call and its answer is
logged with timestamps for the checker: runs started and cancelled, and beside them the reads an
operator makes (the runs list, a run followed, readiness, the nodes)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from .faults import fault_kinds, strike
from .harness import TOKEN, Cluster, Settings, Topology, Worker

HTTP_SLACK = 2.0  # a client gives a node this long beyond the cancel's own timeout
TAIL_SECONDS = 4.0
FAULT_GAP = (0.5, 2.0)  # seconds between two faults (random)


@dataclass
class Op:
    """One call to a node and what it answered."""

    kind: str  # start | cancel | cancel_session | list | follow | ready | nodes
    node: str
    started: float
    ended: float = 0.0
    status: int | None = None  # HTTP status; None: no answer (transport error)
    run_id: str | None = None
    outcome: str | None = None
    mode: str | None = None
    wait: bool | None = None
    timeout: float | None = None
    error: str | None = None
    run: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Profile:
    runs: int  # at least; runs keep coming until the fault schedule is over
    concurrency: int
    seed: int
    fault_rounds: int  # each round injects every fault kind of the topology once
    topology: Topology = "proxied"
    settings: Settings = field(default_factory=Settings)


def bounded_profile(
    topology: Topology, seed: int, runs: int = 300, settings: Settings | None = None
) -> Profile:
    """The profile CI runs (tests/chaos/test_chaos.py): every fault kind of the topology once."""
    return Profile(runs, 24, seed, 1, topology, settings or Settings())


@dataclass
class Workload:
    cluster: Cluster
    profile: Profile
    ops: list[Op] = field(default_factory=list)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.profile.seed)

    async def run(self) -> None:
        """Runs keep coming until the fault schedule is over and ``profile.runs`` were made."""
        faults = asyncio.create_task(self._faults())
        headers = {"authorization": f"Bearer {TOKEN}"} if self.profile.settings.auth else {}
        async with httpx.AsyncClient(headers=headers) as client:

            async def lane(first: int) -> None:
                i = first
                while i < self.profile.runs or not faults.done():
                    await self._one_run(client, i)
                    i += self.profile.concurrency

            async def reads() -> None:
                while not faults.done():
                    await self._one_read(client)
                    await asyncio.sleep(self.rng.uniform(0.05, 0.3))

            await asyncio.gather(*(lane(i) for i in range(self.profile.concurrency)), reads())
        await faults

    # -- runs and cancels ----------------------------------------------------------------

    async def _one_run(self, client: httpx.AsyncClient, i: int) -> None:
        rng = random.Random(self.rng.random())
        spec = {
            "tokens": rng.randint(0, 60),
            "token_interval_ms": rng.randint(0, 15),
            "tools": [
                {"name": f"tool{t}", "duration_ms": rng.randint(0, 150)}
                for t in range(rng.randint(0, 2))
            ],
            "turns": rng.randint(1, 3),
        }
        duration = spec["turns"] * (
            spec["tokens"] * spec["token_interval_ms"] / 1000
            + sum(t["duration_ms"] / 1000 for t in spec["tools"])
        )
        session = (f"app{i % 3}", f"user{i % 17}", f"s{i}-{uuid.uuid4().hex[:6]}")
        body = {
            "app_name": session[0],
            "user_id": session[1],
            "session_id": session[2],
            "agent": spec,
        }
        worker = rng.choice(self.cluster.workers)
        start = await self._call(client, "start", worker, "/v1/runs", body, timeout=10)
        if start.status != 201 or start.run is None:
            return
        run_id = start.run["run_id"]
        start.run_id = run_id
        if rng.random() < 0.35:
            return  # left alone
        # cancel anywhere in the run's life, often right as it finishes
        delay = rng.choice([rng.uniform(0, duration), duration * rng.uniform(0.9, 1.1)])
        await asyncio.sleep(delay)
        via = rng.choice(self.cluster.workers)
        mode = rng.choice(["checkpoint", "immediate", "after_turn"])
        wait = rng.random() < 0.7
        timeout = round(rng.uniform(0.2, 3.0), 2)
        cancel_body = {
            "mode": mode,
            "wait": wait,
            "timeout": timeout,
            "reason": f"chaos {self.profile.seed}/{i}",
        }
        if rng.random() < 0.2:
            path = "/v1/sessions/{}/{}/{}/cancel".format(*session)
            op = await self._call(
                client, "cancel_session", via, path, cancel_body, timeout=timeout + HTTP_SLACK
            )
            op.run_id = run_id  # the run the session held when we cancelled it
        else:
            op = await self._call(
                client,
                "cancel",
                via,
                f"/v1/runs/{run_id}/cancel",
                cancel_body,
                timeout=timeout + HTTP_SLACK,
            )
            op.run_id = run_id
        op.mode, op.wait, op.timeout = mode, wait, timeout

    async def _one_read(self, client: httpx.AsyncClient) -> None:
        """What an operator reads meanwhile: it must be answered (2xx, 4xx or 503), in time."""
        worker = self.rng.choice(self.cluster.workers)
        kind = self.rng.choice(["list", "follow", "ready", "nodes"])
        op = Op(kind=kind, node=worker.name, started=time.time())
        self.ops.append(op)
        started = [o.run_id for o in self.ops[-200:] if o.kind == "start" and o.run_id]
        path = {
            "list": "/v1/runs?status=all&limit=20",
            "ready": "/readyz",
            "nodes": "/v1/nodes",
            "follow": f"/v1/runs/{started[-1] if started else 'none'}/stream",
        }[kind]
        try:
            if kind == "follow":  # a few lines of it, then hang up
                async with client.stream("GET", f"{worker.url}{path}", timeout=5) as response:
                    op.status = response.status_code
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.3):
                            async for _ in response.aiter_lines():
                                pass
            else:
                op.status = (await client.get(f"{worker.url}{path}", timeout=5)).status_code
        except httpx.HTTPError as exc:
            op.error = type(exc).__name__
        op.ended = time.time()

    async def _call(
        self,
        client: httpx.AsyncClient,
        kind: str,
        worker: Worker,
        path: str,
        body: dict[str, Any],
        timeout: float,
    ) -> Op:
        op = Op(kind=kind, node=worker.name, started=time.time())
        self.ops.append(op)
        try:
            response = await client.post(f"{worker.url}{path}", json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            op.ended, op.error = time.time(), type(exc).__name__
            return op
        op.ended, op.status = time.time(), response.status_code
        payload = response.json()
        if kind == "start":
            op.run = payload if response.status_code == 201 else None
        else:
            op.outcome = payload.get("outcome")
            op.run = payload.get("run")
        op.error = None if response.status_code < 500 else str(payload.get("detail"))[:200]
        return op

    # -- the fault schedule --------------------------------------------------------------

    async def _faults(self) -> None:
        cluster, rng = self.cluster, random.Random(self.profile.seed + 1)
        kinds = fault_kinds(cluster.topology)
        for _ in range(self.profile.fault_rounds):
            rng.shuffle(kinds)
            for kind in kinds:
                await asyncio.sleep(rng.uniform(*FAULT_GAP))
                await strike(cluster, kind, rng.choice(cluster.workers))
        await asyncio.sleep(TAIL_SECONDS)  # a calm spell: history made after the last fault
