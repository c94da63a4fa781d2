"""Real node processes (the installed ``cancel-bus serve``) on free loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from node.embedded import free_port

READY_TIMEOUT = 30.0
COMMAND = str(Path(sys.executable).parent / "cancel-bus")  # as installed: its exit codes too


class NodeProcess:
    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.env = {
            **os.environ,
            **env,
            "CANCEL_BUS_NODE_ID": name,
            "CANCEL_BUS_PORT": str(self.port),
        }
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> NodeProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [COMMAND, "serve"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> NodeProcess:
        """Poll /readyz like a kubelet does."""
        deadline = time.monotonic() + timeout
        answer = "no answer"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-3000:]}")
            try:
                response = httpx.get(f"{self.url}/readyz", timeout=1)
            except httpx.HTTPError as exc:
                answer = repr(exc)
            else:
                if response.status_code == 200:
                    return self
                answer = response.text
            time.sleep(0.05)
        log = self.log_path.read_text()[-3000:]
        raise RuntimeError(f"{self.name} not ready ({answer}): {log}")

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def client(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


class Cluster:
    """N nodes on one Redis server and one fresh namespace."""

    def __init__(self, redis_url: str, size: int, log_dir: Path, **settings: str) -> None:
        self.namespace = f"svc-{uuid.uuid4().hex[:10]}"
        env = {
            "CANCEL_BUS_REDIS_URL": redis_url,
            "CANCEL_BUS_NAMESPACE": self.namespace,
            "CANCEL_BUS_LEASE_TTL": "2",
            "CANCEL_BUS_DRAIN_TIMEOUT": "3",
            "CANCEL_BUS_LOG_LEVEL": "info",
            **{f"CANCEL_BUS_{k.upper()}": v for k, v in settings.items()},
        }
        for key in ("CANCEL_BUS_API_TOKENS", "CANCEL_BUS_API_TOKENS_FILE"):
            if key not in env:
                env[key] = ""
        self.nodes = [NodeProcess(f"node-{i + 1}", env, log_dir) for i in range(size)]

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
