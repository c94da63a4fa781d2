"""Replicas as separate OS processes, as an application runs them behind a load balancer.

``python -m tests.integrations.replica APP REDIS_URL NAMESPACE LEASE_TTL READY_FD`` runs one
replica: a started bus, and the ASGI app that the module ``APP`` serves for it (its
``serve(bus, url)`` async context manager) on a free loopback port, until SIGTERM. Once it listens
it writes one JSON line with its URL and node id to the file descriptor ``READY_FD`` (a pipe of
the test's; stdout and stderr are the test's, for the frameworks' logs). The test side
(:class:`Replica`) starts, stops and kills them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import uvicorn

from cancel_bus import CancelBus

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0  # importing a framework takes seconds on a loaded 2-core machine
STOP_TIMEOUT = 15.0
TEXTING_LEASE = 10.0  # the replicas of the double-texting tests: no test there loses a node,
# and a loaded machine stalling a fresh replica for a few seconds (a framework's lazy imports on
# its loop) must not fence it


AppFactory = Callable[[CancelBus, str], AbstractAsyncContextManager[Any]]


@dataclass
class Replica:
    """One replica process (test side)."""

    process: subprocess.Popen[bytes]
    url: str
    node_id: str

    @staticmethod
    def spawn(
        app: str, redis_url: str, namespace: str, lease_ttl: float, env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], IO[str]]:
        """The process (``env`` added to this one's environment), and the pipe its ready line
        comes on."""
        read_fd, write_fd = os.pipe()
        command = [sys.executable, "-m", __name__, app, redis_url, namespace, str(lease_ttl)]
        try:
            process = subprocess.Popen(
                [*command, str(write_fd)],
                cwd=ROOT,
                pass_fds=[write_fd],
                env={**os.environ, **env},
            )
        finally:
            os.close(write_fd)
        return process, os.fdopen(read_fd)

    @classmethod
    def ready(cls, process: subprocess.Popen[bytes], pipe: IO[str]) -> Replica:
        """Wait for the process's ready line."""
        with pipe, selectors.DefaultSelector() as selector:
            selector.register(pipe, selectors.EVENT_READ)
            if not selector.select(START_TIMEOUT):
                process.kill()
                raise TimeoutError(f"replica {process.args} did not start")
            line = pipe.readline()
        if not line:
            raise RuntimeError(f"replica {process.args} exited with {process.wait()}")
        ready = json.loads(line)
        return cls(process, ready["url"], ready["node_id"])

    def stop(self) -> None:
        """SIGTERM: the replica closes its server and leaves the cluster."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL: the replica vanishes without a word."""
        self.process.kill()
        self.process.wait()

    async def install_multitask(
        self, http: httpx.AsyncClient, strategy: str, mode: str = "checkpoint"
    ) -> None:
        """Its adapter installed again with this double-texting setting (``/multitask``)."""
        setting = {"multitask_strategy": strategy, "interrupt_mode": mode}
        response = await http.post(f"{self.url}/multitask", json=setting)
        assert response.status_code == 200, response.text


def start_replicas(
    app: str,
    count: int,
    redis_url: str,
    namespace: str,
    lease_ttl: float = 3.0,
    env: dict[str, str] | None = None,
) -> list[Replica]:
    """Start ``count`` replicas of ``app`` at once (their imports overlap) and wait for each."""
    spawned = [Replica.spawn(app, redis_url, namespace, lease_ttl, env or {}) for _ in range(count)]
    replicas: list[Replica] = []
    try:
        for process, pipe in spawned:
            replicas.append(Replica.ready(process, pipe))
    except BaseException:
        for process, _ in spawned:
            process.kill()
        raise
    return replicas


@contextlib.contextmanager
def running(
    app: str,
    count: int,
    redis_url: str,
    namespace: str,
    lease_ttl: float = 3.0,
    env: dict[str, str] | None = None,
) -> Iterator[list[Replica]]:
    """``count`` replicas of ``app`` for the block; stopped (SIGTERM) after it."""
    replicas = start_replicas(app, count, redis_url, namespace, lease_ttl, env)
    try:
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


# -- the replica process ------------------------------------------------------------------------


async def _serve(
    app_module: str, redis_url: str, namespace: str, lease_ttl: float, ready_fd: int
) -> None:
    factory: AppFactory = importlib.import_module(app_module).serve
    bus = CancelBus(redis_url, namespace=namespace, lease_ttl=lease_ttl)
    await bus.start()
    try:
        listener = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        async with factory(bus, url) as app:
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
            serving = asyncio.create_task(server.serve(sockets=[listener]))
            await _until(lambda: server.started or serving.done())
            with os.fdopen(ready_fd, "w") as ready:
                ready.write(json.dumps({"url": url, "node_id": bus.node_id}) + "\n")
            await serving
    finally:
        await bus.close(cancel_timeout=2.0)


async def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


if __name__ == "__main__":
    _, app_name, url_arg, namespace_arg, ttl_arg, fd_arg = sys.argv
    asyncio.run(_serve(app_name, url_arg, namespace_arg, float(ttl_arg), int(fd_arg)))
