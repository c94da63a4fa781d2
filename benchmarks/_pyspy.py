"""py-spy for ``--profile`` / ``--profile-all``: finding (or installing) it, recording one process
for as long as a workload runs, and summarising what it recorded.

py-spy is not a dependency of cancel-bus, nor needed without those options. Where it is missing
(not beside this interpreter, nor on PATH), it is installed into a virtualenv of the benchmarks'
own, ``.cache/bench-tools/py-spy`` (gitignored), from the ``py-spy`` line of
``benchmarks/requirements.txt``, as the peers' virtualenvs are made (``peers/run.py``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ._cluster import REPO, ChildProcess
from ._harness import process_cpu_seconds

TOOLS = REPO / ".cache" / "bench-tools" / "py-spy"
REQUIREMENTS = REPO / "benchmarks" / "requirements.txt"
INSTALL_TIMEOUT = 600.0
ATTACH_TIMEOUT = 15.0
STOP_TIMEOUT = 30.0
RATE = 250  # samples per second
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
PACKAGES = {
    "asyncio": "asyncio",
    "uvloop": "uvloop",
    "redis": "redis-py",
    "hiredis": "redis-py",
    "cancel_bus": "cancel-bus",
    "node": "node service",
    "benchmarks": "benchmark harness",
    "uvicorn": "uvicorn",
    "starlette": "starlette",
    "fastapi": "fastapi",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "httpx": "httpx",
    "httpcore": "httpx",
    "h11": "httpx",
    "httptools": "httptools",
    "anyio": "anyio",
    "json": "json",
    "sse_starlette": "sse-starlette",
    "prometheus_client": "prometheus-client",
    "selectors.py": "epoll (selectors)",
}
# uvloop runs the loop in C: its own time (I/O, callbacks, epoll) shows as the frame that started
# the loop, asyncio's Runner.run
IN_C_LOOP = ("Runner.run", "asyncio/runners.py")


class PySpyMissing(RuntimeError):
    """py-spy is not there and could not be installed."""


def requirement() -> str:
    """The ``py-spy`` requirement of ``benchmarks/requirements.txt``."""
    for line in REQUIREMENTS.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text.startswith("py-spy"):
            return text
    return "py-spy>=0.4"


def _works(binary: Path) -> bool:
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, timeout=30, check=False
        )
    except OSError:
        return False
    return done.returncode == 0


def find_py_spy() -> Path | None:
    """py-spy beside this interpreter, on PATH, or in the benchmarks' own tool venv."""
    candidates = [
        Path(sys.executable).parent / "py-spy",
        Path(found) if (found := shutil.which("py-spy")) else None,
        TOOLS / "bin" / "py-spy",
    ]
    for candidate in candidates:
        if candidate is not None and candidate.is_file() and _works(candidate):
            return candidate
    return None


def ensure_py_spy() -> Path:
    """py-spy's binary; installs it into ``.cache/bench-tools/py-spy`` if it is missing."""
    found = find_py_spy()
    if found is not None:
        return found
    wanted = requirement()
    print(f"  py-spy is missing: installing {wanted} into {TOOLS} ...", flush=True)
    python = TOOLS / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(TOOLS)],
        [str(python), "-m", "pip", "install", "-q", wanted],
    ]
    for argv in steps:
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PySpyMissing(_how_to_install(f"{' '.join(argv)}: {exc}")) from exc
        if done.returncode != 0:
            raise PySpyMissing(_how_to_install(f"{' '.join(argv)}:\n{done.stdout}{done.stderr}"))
    binary = TOOLS / "bin" / "py-spy"
    if not _works(binary):
        raise PySpyMissing(_how_to_install(f"{binary} does not run"))
    return binary


def _how_to_install(why: str) -> str:
    return (
        f"--profile needs py-spy, which is not installed and could not be installed ({why}).\n"
        "Install it into the benchmarks' venv (pip install -r benchmarks/requirements.txt), or "
        "anywhere on PATH, e.g.:\n"
        "  python3 -m venv /tmp/pyspy && /tmp/pyspy/bin/pip install py-spy && "
        "export PATH=/tmp/pyspy/bin:$PATH\n"
        "(py-spy attaches with ptrace: run as root, or with CAP_SYS_PTRACE, or with "
        "kernel.yama.ptrace_scope=0.)"
    )


class Recording:
    """``async with Recording(...)``: py-spy samples process ``pid`` from when it has attached
    until the block ends (SIGINT: it writes what it has), as collapsed stacks (``--format raw``:
    one line per stack, ``frame;frame;... count``, for flamegraph.pl or speedscope.app). Only
    samples where the process is on a CPU count (py-spy's default): the shares are of its CPU
    time, and samples ÷ (rate x seconds) is the share of the time it was on a CPU."""

    def __init__(self, py_spy: Path, name: str, pid: int, log_dir: Path) -> None:
        self.name = name
        self.pid = pid
        self.cpu = 0.0  # CPU time the process used while recorded, from /proc: seconds
        self.out = log_dir / f"{name}.pyspy-collapsed.txt"
        argv = [str(py_spy), "record", "--pid", str(pid), "--rate", str(RATE)]
        argv += ["--format", "raw", "--output", str(self.out), "--nonblocking"]
        self.child = ChildProcess(f"{name}.py-spy", argv, log_dir)
        self.seconds = 0.0
        self._started = 0.0

    async def __aenter__(self) -> Recording:
        await self.child.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ATTACH_TIMEOUT
        while "Sampling process" not in self.child.log_path.read_text(errors="replace"):
            if self.child.exited or loop.time() > deadline:
                await self.child.stop()
                raise RuntimeError(
                    f"py-spy could not record {self.name}: {self.child.log_tail()}\n"
                    "(it attaches with ptrace: root, CAP_SYS_PTRACE or ptrace_scope=0)"
                )
            await asyncio.sleep(0.05)
        self._started = loop.time()
        self.cpu = process_cpu_seconds(self.pid)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.seconds = asyncio.get_running_loop().time() - self._started
        self.cpu = process_cpu_seconds(self.pid) - self.cpu
        process = self.child.process
        assert process is not None
        if process.returncode is None:
            os.kill(process.pid, signal.SIGINT)
        try:
            await self.child.wait(STOP_TIMEOUT)
        except TimeoutError:
            await self.child.stop()
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile of {self.name}: {self.child.log_tail()}")

    @property
    def cpu_share(self) -> float:
        """The process's CPU use while recorded (``/proc``), in % of one core."""
        return 100 * self.cpu / self.seconds if self.seconds else float("nan")

    def summary(self) -> Summary:
        return summarize(self.out, RATE * self.seconds)


@dataclass
class Summary:
    """What one recording shows: samples, and their shares by package and by function. py-spy
    counts a sample where the thread is running or runnable (not idle in a syscall): on a
    saturated machine, waiting for a CPU counts too."""

    samples: int = 0
    possible: float = 0.0  # samples had the process been active the whole time
    own: Counter[str] = field(default_factory=Counter)  # package of the innermost frame
    within: Counter[str] = field(default_factory=Counter)  # package anywhere in the stack
    functions: Counter[str] = field(default_factory=Counter)  # innermost frame

    @property
    def active(self) -> float:
        return self.samples / self.possible if self.possible else float("nan")

    def shares(self, counter: Counter[str], top: int) -> str:
        total = max(self.samples, 1)
        return ", ".join(f"{what} {100 * k / total:.0f} %" for what, k in counter.most_common(top))

    def text(self, title: str) -> str:
        total = max(self.samples, 1)
        lines = [
            f"# {title}",
            f"active samples: {self.samples} ({100 * self.active:.0f} % of the time)",
            "",
            "## self time by package (innermost frame)",
            *(f"{100 * k / total:5.1f} %  {what}" for what, k in self.own.most_common()),
            "",
            "## time within each package (anywhere in the stack)",
            *(f"{100 * k / total:5.1f} %  {what}" for what, k in self.within.most_common()),
            "",
            "## self time by function (top 40)",
            *(f"{100 * k / total:5.1f} %  {what}" for what, k in self.functions.most_common(40)),
        ]
        return "\n".join(lines) + "\n"


def package(file: str) -> str:
    """The package a frame's file belongs to (see :data:`PACKAGES`), else ``other: <file>``."""
    parts = file.replace("\\", "/").split("/")
    for part in parts:
        if part in PACKAGES:
            return PACKAGES[part]
    return f"other: {parts[-1]}"


def summarize(path: Path, possible: float) -> Summary:
    summary = Summary(possible=possible)
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_FRAME.match(frame) for frame in stack.split(";")]
        parsed = [(m["function"], m["file"]) for m in frames if m is not None]
        if not parsed:
            continue
        summary.samples += count
        function, file = parsed[-1]
        own = "event loop in C (uvloop)" if (function, file) == IN_C_LOOP else package(file)
        summary.own[own] += count
        summary.functions[f"{function} ({file})"] += count
        for each in {package(f) for _, f in parsed}:
            summary.within[each] += count
    return summary
