"""Run the benchmarks: ``python -m benchmarks`` (everything, the documented full run).

Prints one table per section and writes ``benchmarks/results/<time>.json`` and ``.md``.
``--quick`` measures little (for development); ``--only`` picks benchmarks (the floor always
runs: every figure is a ratio to it); ``--no-peers`` skips the peers' comparison; ``--profile``
records py-spy flame graphs of every node process (it slows them: not for the published run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

import cancel_bus
from node.embedded import server_binary

from . import cancel, cluster, floor, hot_path, over_http, scaling, throughput
from ._cluster import PROFILES, REPO, Bench
from ._report import Report
from .peers import run as peers

BENCHMARKS: dict[str, Callable[[Bench], Awaitable[None]]] = {
    "cancel": cancel.run,
    "http": over_http.run,
    "throughput": throughput.run,
    "scaling": scaling.run,
    "hot_path": hot_path.run,
    "cluster": cluster.run,
    "peers": peers.run,
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers' comparison")
    parser.add_argument(
        "--profile", action="store_true", help="py-spy flame graphs of every node (in the logs)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    chosen = list(BENCHMARKS) if args.only is None else args.only.split(",")
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    if args.no_peers and "peers" in chosen:
        chosen.remove("peers")
    profile = PROFILES["quick" if args.quick else "full"]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = Path(tempfile.mkdtemp(prefix=f"cancel-bus-bench-{stamp}-"))
    report = Report()
    report.meta = _meta(profile.name, chosen, log_dir)
    bench = Bench(profile, report, log_dir, profiling=args.profile)
    started = time.monotonic()
    asyncio.run(_run_all(bench, chosen))
    report.meta["seconds"] = round(time.monotonic() - started, 1)
    report.meta["load_after"] = os.getloadavg()
    table = report.table()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(args.out / f"{stamp}.json")
    (args.out / f"{stamp}.md").write_text(_header(report.meta) + table)
    print(f"written: {args.out / stamp}.json and .md (process logs in {log_dir})")
    return 0


async def _run_all(bench: Bench, chosen: list[str]) -> None:
    await floor.run(bench)
    for name in chosen:
        await BENCHMARKS[name](bench)


def _meta(profile: str, chosen: list[str], log_dir: Path) -> dict[str, Any]:
    binary = server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "command": shlex.join(["python", "-m", "benchmarks", *sys.argv[1:]]),
        "profile": profile,
        "benchmarks": ["floor", *chosen],
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_before": os.getloadavg(),
        "python": platform.python_version(),
        "redis_server": version.stdout.strip(),
        "redis_py": redis.__version__,
        "cancel_bus": cancel_bus.__version__,
        "commit": commit.stdout.strip(),
        "log_dir": str(log_dir),
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _header(meta: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in meta["load_before"])
    return (
        f"`{meta['command']}` — {meta['started_at']}, {meta['seconds']} s, "
        f"{meta['cpus']} CPUs ({meta['cpu_model']}), load before {load}; "
        f"Python {meta['python']}, {meta['redis_server']}, redis-py {meta['redis_py']}, "
        f"commit {meta['commit']}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
