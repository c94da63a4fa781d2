"""Plumbing shared by every benchmark: worker processes driven over JSON lines, statistics.

A worker is a separate Python process (``python -m <module>``) that answers one request at a time
on its stdin/stdout: ``{"id", "op", "args"}`` in, ``{"id", "result"}`` or ``{"id", "error"}`` out.
Its log (and anything else it prints) goes to a file. Every call is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

WAIT = 60.0  # the default bound of a call to a worker
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
LINE_LIMIT = 256 * 1024 * 1024  # the longest reply line (100k run ids fit easily)


def orphan_guard() -> list[str]:
    """A command prefix that makes the child get SIGTERM if the benchmark process dies first
    (util-linux ``setpriv``; nothing where it is missing)."""
    return ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of sorted samples."""
    if not ordered:
        return math.nan
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """n, min, p50, p90, p99, max and mean of the samples."""
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "min": ordered[0] if ordered else math.nan,
        "p50": percentile(ordered, 0.50),
        "p90": percentile(ordered, 0.90),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] if ordered else math.nan,
        "mean": sum(ordered) / len(ordered) if ordered else math.nan,
    }


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, from /proc (its threads included)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / CLOCK_TICKS  # utime, stime


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores, from /proc/stat: what
    every process used, ours and everybody else's (the machine is shared)."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


class WorkerError(RuntimeError):
    """A worker answered with an error, exited, or did not answer in time."""


class Worker:
    """The benchmark's side of one worker process."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self.process: asyncio.subprocess.Process | None = None
        self._next_id = 0
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self, timeout: float = START_TIMEOUT) -> Worker:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *orphan_guard(),
                *self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                cwd=self.cwd,
                limit=LINE_LIMIT,
            )
        hello = await self._read(timeout)
        if hello.get("ready") is not True:
            raise WorkerError(f"{self.name} did not start: {hello}")
        return self

    async def call(self, op: str, /, *, within: float = WAIT, **args: Any) -> Any:
        """Ask the worker to run ``op(**args)``; its result, or :class:`WorkerError` (also if no
        answer comes ``within`` seconds)."""
        async with self._lock:
            assert self.process is not None and self.process.stdin is not None
            self._next_id += 1
            request = {"id": self._next_id, "op": op, "args": args}
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            await self.process.stdin.drain()
            reply = await self._read(within, op)
            if "error" in reply:
                raise WorkerError(f"{self.name}.{op} failed:\n{reply['error']}")
            return reply["result"]

    async def _read(self, timeout: float, what: str = "start") -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            raise WorkerError(f"{self.name}: no answer to {what} in {timeout}s") from None
        if not line:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise WorkerError(f"{self.name} exited during {what}; log tail:\n{tail}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Close its stdin (it exits), then SIGKILL if it has not exited in time."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await asyncio.wait_for(process.wait(), timeout)


Handler = Callable[..., Awaitable[Any]]


def serve(
    handlers: Callable[[str], Handler], close: Callable[[], Awaitable[None]] | None = None
) -> None:
    """The worker's side: answer requests until stdin closes, then ``close()``.
    ``handlers(op)`` finds the coroutine function of an op."""
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints go to the log

    def reply(message: dict[str, Any]) -> None:
        protocol_out.write(json.dumps(message) + "\n")
        protocol_out.flush()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        reply({"ready": True})
        while line := await reader.readline():
            request = json.loads(line)
            try:
                result = await handlers(request["op"])(**request["args"])
            except Exception:
                reply({"id": request["id"], "error": traceback.format_exc()})
            else:
                reply({"id": request["id"], "result": result})
        if close is not None:
            await close()

    asyncio.run(main())
