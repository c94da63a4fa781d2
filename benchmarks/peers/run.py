"""The peers, side by side with cancel-bus: each in its own virtualenv under ``.cache/``
(created on first use from ``requirements/<peer>.txt``; never a dependency of cancel-bus), each
against its own Redis server, all measured by the same client protocol (see ``_peer``),
cancel-bus included, and divided by the floor hop measured by that protocol in the same run."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .._cluster import REPO, Bench, Scope, timed_phase

SECTION = "cancel-bus and its peers: one cancel of a running job, same protocol"
FLOOR_KEY = "hop:peers"
HERE = Path(__file__).resolve().parent
CACHE = REPO / ".cache" / "bench-peers"
INSTALL_TIMEOUT = 900.0
SECONDS_PER_SAMPLE = 10.0  # bounds the client; Celery needs ~3.4 s (see celery_peer)


@dataclass(frozen=True)
class Peer:
    key: str
    label: str
    own_venv: bool = True

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
    await _command([str(python), "-m", "pip", "install", "-q", "-r", requirements], INSTALL_TIMEOUT)
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


async def _measure(bench: Bench, scope: Scope, peer: Peer) -> dict[str, list[int]]:
    """Run the peer's worker and client against a fresh server; the client's samples."""
    python = str(await ensure_venv(peer))
    n = bench.profile.peers_n
    server = await scope.redis()
    env = {**os.environ, "BENCH_REDIS_URL": server.url}
    worker = await scope.process(f"{peer.key}-worker", [python, "-m", peer.module, "worker"], env)
    out = bench.log_dir / f"{peer.key}-samples.json"
    argv = [python, "-m", peer.module, "client", str(n), str(out)]
    client = await scope.process(f"{peer.key}-client", argv, env)
    code = await client.wait(60 + n * SECONDS_PER_SAMPLE)
    if code != 0 or worker.exited:
        raise RuntimeError(
            f"client exited {code}: {client.log_tail()} / worker: {worker.log_tail()}"
        )
    data: dict[str, list[int]] = json.loads(out.read_text())
    return data
