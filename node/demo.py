"""``cancel-bus demo``: a local cluster (an embedded server and N node processes) and a
cross-node cancel shown step by step. Its children never outlive it: SIGINT, SIGTERM and SIGHUP
stop them before it exits, and if it dies without a word (SIGKILL) the kernel sends each of them
SIGTERM (:func:`~node.embedded.die_with_parent`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType

import httpx
from rich.console import Console

from .display import CANCEL_PHASES, span
from .embedded import EmbeddedServer, die_with_parent, free_port

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
out = Console(highlight=False)


class Stopped(Exception):
    """A signal asked the demo to stop."""


class NotReady(Exception):
    """A node of the demo did not become ready."""


def run_demo(size: int, exit_after: bool) -> int:
    """Start the cluster, show the cancel, then wait for a signal (or exit at once)."""
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopping:  # once: the cleanup below must not be cut short
            raise Stopped(signal.Signals(signum).name)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    server: EmbeddedServer | None = None
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        server = EmbeddedServer(die_with_parent=True).start()
        out.print(f"embedded server: {server.url}")
        ports = [free_port() for _ in range(size)]
        nodes = [_spawn_node(server.url, i, port) for i, port in enumerate(ports, 1)]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url, node in zip(urls, nodes, strict=True):
            _wait_ready(url, node)
        out.print(f"{size} nodes ready: " + ", ".join(urls))
        _show_cross_node_cancel(urls)
        out.print("\ndashboards: " + "  ".join(f"{url}/" for url in urls))
        if exit_after:
            return 0
        out.print("Ctrl-C to stop the cluster.")
        while True:
            signal.pause()
    except Stopped as exc:
        out.print(f"\n{exc}: stopping the cluster ...")
        return 0
    finally:
        stopping = True
        _stop(nodes, server)


def _spawn_node(redis_url: str, index: int, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CANCEL_BUS_REDIS_URL": redis_url,
        "CANCEL_BUS_NODE_ID": f"node-{index}",
        "CANCEL_BUS_PORT": str(port),
        "CANCEL_BUS_HOST": "127.0.0.1",
        "CANCEL_BUS_LOG_LEVEL": "warning",
    }
    for key in ("CANCEL_BUS_API_TOKENS", "CANCEL_BUS_API_TOKENS_FILE"):
        env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, "-m", "node.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C reaches the demo, which stops them in order
        preexec_fn=die_with_parent(),  # noqa: PLW1509
    )


def _stop(nodes: list[subprocess.Popen[bytes]], server: EmbeddedServer | None) -> None:
    """SIGTERM to every node (they drain at once: their run was cancelled), then the server."""
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    for node in nodes:
        try:
            node.wait(15)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
    if server is not None:
        server.cleanup()


def _wait_ready(url: str, node: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and node.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise NotReady(f"the node at {url} was not ready within {timeout:.0f} s")


def _show_cross_node_cancel(urls: list[str]) -> None:
    first, second = urls[0], urls[1]
    body = {
        "app_name": "demo",
        "user_id": "alice",
        "session_id": "s1",
        "agent": {
            "tokens": 2000,
            "token_interval_ms": 20,
            "tools": [{"name": "search", "duration_ms": 300}],
        },
    }
    started = httpx.post(f"{first}/v1/runs", json=body, timeout=10).json()
    run_id = started["run_id"]
    out.print(f"\nstarted run {run_id} on node-1 ({started['owner']})")
    time.sleep(0.5)  # let it stream a little: its partial output is kept
    out.print(f"cancelling it through node-2 ({second}) ...")
    t0 = time.perf_counter()
    response = httpx.post(f"{second}/v1/runs/{run_id}/cancel", json={"reason": "demo"}, timeout=10)
    elapsed = time.perf_counter() - t0
    answer = response.json()
    run = answer["run"]
    out.print(
        f"HTTP {response.status_code} {answer['outcome']} in {span(elapsed)} "
        f"(status {run['status']}, {len(run['output'])} chars of partial output kept)"
    )
    requested = run["cancel_requested_at"]
    for label, key in CANCEL_PHASES:
        if run.get(key):
            out.print(f"  {label:>9}: +{span(run[key] - requested)} after the request")
