"""How a node and the demo stop, on real processes: the drain announced with its deadline, a
second signal that cancels the runs at once, exit code 0 and no traceback, whichever signal; the
port bound before the node joins; the demo's processes gone with it, however it ends."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from node.embedded import EmbeddedServer
from node.server import PortInUse, bind

from ..node_cluster import COMMAND, Cluster, NodeProcess

STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM]


@pytest.fixture(scope="module")
def observer(
    redis_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A node that stays, to read what the leaving ones recorded."""
    cluster = Cluster(redis_server.url, 1, tmp_path_factory.mktemp("stay")).start()
    yield cluster
    cluster.stop()


def _leaving_node(observer: Cluster, tmp_path: Path, **settings: str) -> NodeProcess:
    env = {k: v for k, v in observer.nodes[0].env.items() if k.startswith("CANCEL_BUS_")}
    env.update({f"CANCEL_BUS_{k.upper()}": v for k, v in settings.items()})
    return NodeProcess(f"leaving-{uuid.uuid4().hex[:6]}", env, tmp_path).start().wait_ready()


def _start(node: NodeProcess, tokens: int) -> dict[str, Any]:
    body = {
        "app_name": "app",
        "user_id": "u",
        "session_id": uuid.uuid4().hex,
        "agent": {"tokens": tokens, "token_interval_ms": 10},
    }
    with node.client() as client:
        response = client.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: s.name)
def test_a_second_signal_cancels_the_runs_still_going_and_exits_cleanly(
    observer: Cluster, tmp_path: Path, sig: signal.Signals
) -> None:
    node = _leaving_node(observer, tmp_path, drain_timeout="30")
    try:
        run = _start(node, tokens=100_000)
        node.signal(sig)
        _wait_for(lambda: "Ctrl-C again" in node.log_path.read_text(), "the drain's announcement")
        announced = node.log_path.read_text()
        assert re.search(
            r"draining: 1 run\(s\) active; they have 30 s \(until \d\d:\d\d:\d\d\)", announced
        )
        with node.client() as client:
            assert client.get("/readyz").status_code == 503
        t0 = time.monotonic()
        node.signal(sig)
        assert node.wait_exit(15) == 0
        assert time.monotonic() - t0 < 10  # not the 30 s of the drain
    finally:
        node.stop()
    log = node.log_path.read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    assert "stopping now: cancelling 1 run(s) (node_shutdown)" in log
    with observer.nodes[0].client() as client:
        final = client.get(f"/v1/runs/{run['run_id']}").json()
    assert final["status"] == "cancelled" and final["cancel_reason"] == "node_shutdown"
    assert final["cancel_cause"] == "node_shutdown" and final["output"]


@pytest.mark.parametrize("sig", STOP_SIGNALS, ids=lambda s: s.name)
def test_one_signal_drains_and_exits_cleanly(
    observer: Cluster, tmp_path: Path, sig: signal.Signals
) -> None:
    node = _leaving_node(observer, tmp_path, drain_timeout="30")
    try:
        run = _start(node, tokens=40)  # ends inside the drain (about 0.4 s)
        node.signal(sig)
        assert node.wait_exit(20) == 0
    finally:
        node.stop()
    log = node.log_path.read_text()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    assert "drained: every run finished" in log
    with observer.nodes[0].client() as client:
        assert client.get(f"/v1/runs/{run['run_id']}").json()["status"] == "succeeded"


def test_the_port_is_bound_before_the_node_starts_its_server_or_joins(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [COMMAND, "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **os.environ,
                "CANCEL_BUS_REDIS_URL": "",
                "CANCEL_BUS_API_TOKENS": "",
                "CANCEL_BUS_DATA_DIR": str(tmp_path),
                "COLUMNS": "60",
            },
        )
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the port is in use" in result.stderr
    assert not (tmp_path / "redis" / "server.log").exists()  # no embedded server was started
    assert "joined" not in result.stdout + result.stderr
    assert "ready" not in result.stdout + result.stderr


def _read_until(process: subprocess.Popen[str], marker: str, timeout: float = 90) -> str:
    """The demo's output up to the line holding ``marker``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while marker not in seen:
        assert time.monotonic() < deadline and process.poll() is None, seen
        seen += process.stdout.readline()
    return seen


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_the_demo_takes_its_processes_with_it(sig: signal.Signals, tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [COMMAND, "demo", "--nodes", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a killed demo cannot remove its server's scratch dir: keep it in the test's
        env={**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp_path)},
    )
    try:
        shown = _read_until(demo, "Ctrl-C to stop the cluster.")
        ports = [int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", shown)]
        assert len(set(ports)) == 3, shown  # the server and two nodes
        assert all(_listening(port) for port in ports)
        assert "HTTP 200 cancelled" in shown and "delivered: +" in shown
        demo.send_signal(sig)
        code = demo.wait(30)
    finally:
        if demo.poll() is None:
            demo.kill()
        _, stderr = demo.communicate(timeout=30)
    assert code == (-signal.SIGKILL if sig is signal.SIGKILL else 0), stderr
    assert "Traceback" not in stderr, stderr
    _wait_for(lambda: not any(_listening(port) for port in ports), "the demo's processes", 30)


def test_an_address_of_another_machine_is_named_as_such() -> None:
    with pytest.raises(PortInUse, match="the address is not one of this machine's"):
        bind("192.0.2.1", 8080, 1)  # TEST-NET-1: never a local address
