"""The peers, side by side with cancel-bus: each in its own virtualenv under ``.cache/``
(created on first use from ``requirements/<peer>.txt``; never a dependency of cancel-bus), each
against its own Redis server, all measured by the same client protocol (see ``_peer``),
cancel-bus included, and divided by the floor hop measured by that protocol in the same run.

Then agno's own ``RedisRunCancellationManager`` against the cancel-bus adapter for agno
(``agno_peer``): one server, the same agent loop, the floor hop measured there (paired)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.embedded import EmbeddedServer

from .._cluster import REPO, Bench, Scope, timed_phase

SECTION = "cancel-bus and its peers: one cancel of a running job, same protocol"
FLOOR_KEY = "hop:peers"
HERE = Path(__file__).resolve().parent
CACHE = REPO / ".cache" / "bench-peers"
INSTALL_TIMEOUT = 900.0
SECONDS_PER_SAMPLE = 10.0  # bounds the client; Celery needs ~3.4 s (see celery_peer)
AGNO_SECTION = "agno: its RedisRunCancellationManager and the cancel-bus adapter, same server"
AGNO_FLOOR = "hop:agno"
AGNO_AWAIT = "agno:await"
AGNO_MANAGERS = {
    "redis": "agno RedisRunCancellationManager",
    "bus": "cancel-bus agno adapter",
}
AGNO_HOT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Peer:
    key: str
    label: str
    own_venv: bool = True
    with_cancel_bus: bool = False  # its venv also has cancel-bus (editable, from this repo)

    @property
    def module(self) -> str:
        return f"benchmarks.peers.{self.key}_peer"


FLOOR = Peer("floor", "floor: pub/sub hop (PUBLISH -> woken), same protocol", own_venv=False)
PEERS = (
    Peer("cancelbus", "cancel-bus cancel(wait=True)", own_venv=False),
    Peer("arq", "arq Job.abort()"),
    Peer("rq", "RQ send_stop_job_command()"),
    Peer("dramatiq", "dramatiq-abort abort()"),
    Peer("celery", "Celery revoke(terminate=True)"),
)
AGNO = Peer("agno", "agno Agent.acancel_run()", with_cancel_bus=True)


async def _command(argv: list[str], timeout: float) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"{argv[0]} did not finish in {timeout}s") from None
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{output.decode()[-2000:]}")


async def ensure_venv(peer: Peer) -> Path:
    """The peer's interpreter; (re)creates its venv when its requirements changed."""
    if not peer.own_venv:
        return Path(sys.executable)
    venv = CACHE / peer.key
    python = venv / "bin" / "python"
    wanted = (HERE / "requirements" / f"{peer.key}.txt").read_text()
    stamp = venv / "bench-requirements.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"  peers: creating the {peer.key} venv in {venv} ...", flush=True)
    await _command([sys.executable, "-m", "venv", "--clear", str(venv)], 120.0)
    requirements = str(HERE / "requirements" / f"{peer.key}.txt")
    own = ["-e", str(REPO)] if peer.with_cancel_bus else []
    await _command(
        [str(python), "-m", "pip", "install", "-q", "-r", requirements, *own], INSTALL_TIMEOUT
    )
    stamp.write_text(wanted)
    return python


async def run(bench: Bench) -> None:
    report = bench.report
    async with bench.scope() as scope, timed_phase("peers: floor"):
        hops = (await _measure(bench, scope, FLOOR))["observed_ns"]
    report.set_floor(FLOOR_KEY, report.latency(SECTION, FLOOR.label, hops))
    for peer in PEERS:
        async with bench.scope() as scope, timed_phase(f"peers: {peer.key}"):
            try:
                data = await _measure(bench, scope, peer)
            except (RuntimeError, TimeoutError, OSError) as exc:
                row = report.figure(SECTION, f"{peer.label}: not measured", math.nan, "")
                row.note = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
                continue
        for what in ("observed", "confirmed"):
            samples = data[f"{what}_ns"]
            report.latency(SECTION, f"{peer.label}: {what}", samples, floor=FLOOR_KEY)
    await run_agno(bench)


async def run_agno(bench: Bench) -> None:
    """agno's comparison (part of :func:`run`; ``--only agno`` runs it alone)."""
    try:
        await _agno(bench)
    except (RuntimeError, TimeoutError, OSError) as exc:
        row = bench.report.figure(AGNO_SECTION, "agno: not measured", math.nan, "")
        row.note = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]


async def _measure(
    bench: Bench,
    scope: Scope,
    peer: Peer,
    server: EmbeddedServer | None = None,
    variant: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the peer's worker and client against a server (a fresh one unless given), with the
    environment ``variant`` adds; the client's samples. A client that kills its worker
    (``agno``: the SIGKILL step) is not a failure."""
    python = str(await ensure_venv(peer))
    n = bench.profile.peers_n
    server = server or await scope.redis()
    env = {**os.environ, "BENCH_REDIS_URL": server.url, **(variant or {})}
    name = "-".join([peer.key, *(variant or {}).values()])
    worker = await scope.process(f"{name}-worker", [python, "-m", peer.module, "worker"], env)
    out = bench.log_dir / f"{name}-samples.json"
    argv = [python, "-m", peer.module, "client", str(n), str(out)]
    client = await scope.process(f"{name}-client", argv, env)
    code = await client.wait(60 + n * SECONDS_PER_SAMPLE)
    if code != 0 or (worker.exited and peer is not AGNO):
        raise RuntimeError(
            f"client exited {code}: {client.log_tail()} / worker: {worker.log_tail()}"
        )
    data: dict[str, Any] = json.loads(out.read_text())
    return data


async def _agno(bench: Bench) -> None:
    """agno's Redis manager and the cancel-bus adapter on one server: the floor hop (paired),
    each one's cross-process cancel, the cost of a check, Redis commands per check, and what
    ``acancel_run`` answers for a run whose process was SIGKILLed."""
    report = bench.report
    async with bench.scope() as scope, timed_phase("peers: agno"):
        server = await scope.redis()
        hops = (await _measure(bench, scope, FLOOR, server))["observed_ns"]
        measured = {
            key: await _measure(bench, scope, AGNO, server, {"BENCH_AGNO_MANAGER": key})
            for key in AGNO_MANAGERS
        }
        hot = {key: await _agno_hot(bench, scope, server, key) for key in AGNO_MANAGERS}
    floor = report.latency(AGNO_SECTION, "floor: pub/sub hop, same protocol (paired)", hops)
    report.set_floor(AGNO_FLOOR, floor)
    for key, label in AGNO_MANAGERS.items():
        data = measured[key]
        report.latency(AGNO_SECTION, f"{label}: observed", data["observed_ns"], floor=AGNO_FLOOR)
        report.latency(
            AGNO_SECTION,
            f"{label}: acancel_run() answered",
            data["confirmed_ns"],
            floor=AGNO_FLOOR,
            note="(agno has no call that waits for the run's end)",
        )
    empty = report.figure(AGNO_SECTION, "an empty coroutine, awaited", hot["bus"]["floor_ns"], "ns")
    report.set_floor(AGNO_AWAIT, empty)
    for key, label in AGNO_MANAGERS.items():
        figures = hot[key]
        report.figure(
            AGNO_SECTION,
            f"{label}: one check (await araise_if_cancelled)",
            figures["check_ns"],
            "ns",
            floor=AGNO_AWAIT,
        )
        report.figure(
            AGNO_SECTION, f"{label}: one check (raise_if_cancelled)", figures["sync_check_ns"], "ns"
        )
        report.figure(
            AGNO_SECTION,
            f"{label}: Redis commands per check of a run",
            figures["commands_per_check"],
            "",
            note="(every command the server processed meanwhile, heartbeats included)",
        )
    for key, label in AGNO_MANAGERS.items():
        killed = measured[key]["killed"]
        for when, name in (("at_once", "at once"), ("after_lease", "a lease later")):
            answer = bool(killed[when])
            record = f"; the bus's record: {killed['record']}" if killed["record"] else ""
            report.figure(
                AGNO_SECTION,
                f"{label}: acancel_run() of a SIGKILLed run, {name}",
                float(answer),
                "True=1",
                note=f"(answered {answer}{record if when == 'after_lease' else ''})",
            )


async def _agno_hot(
    bench: Bench, scope: Scope, server: EmbeddedServer, manager: str
) -> dict[str, float]:
    python = str(await ensure_venv(AGNO))
    env = {**os.environ, "BENCH_REDIS_URL": server.url, "BENCH_AGNO_MANAGER": manager}
    out = bench.log_dir / f"agno-{manager}-hot.json"
    process = await scope.process(
        f"agno-{manager}-hot", [python, "-m", AGNO.module, "hot", str(out)], env
    )
    code = await process.wait(AGNO_HOT_TIMEOUT)
    if code != 0:
        raise RuntimeError(f"agno hot ({manager}) exited {code}: {process.log_tail()}")
    figures: dict[str, float] = json.loads(out.read_text())
    return figures
