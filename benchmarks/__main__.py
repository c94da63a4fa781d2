"""Run the benchmarks: ``python -m benchmarks`` (everything, the documented full run).

Prints one table per section and writes ``benchmarks/results/<time>.json`` and ``.md``.
``--quick`` measures little (for development); ``--only`` picks benchmarks (the floor always
runs: every figure is a ratio to it); ``--no-peers`` skips the peers' comparison; ``--profile``
adds py-spy profiles of the lifecycle loop and the cancel paths, each recorded in a stage of its
own after the timed ones (``<results>/<time>-profiles/``; py-spy is installed into
``.cache/bench-tools`` if missing); ``--profile-all`` samples every node process of every
benchmark instead (it slows them: not for published figures).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

import cancel_bus
from node.embedded import server_binary

from . import (
    cancel,
    cluster,
    floor,
    hot_path,
    over_http,
    profiles,
    round_trips,
    scaling,
    throughput,
    trees,
)
from ._cluster import PROFILES, REPO, Bench
from ._pyspy import PySpyMissing, ensure_py_spy
from ._report import Report
from .peers import run as peers

BENCHMARKS: dict[str, Callable[[Bench], Awaitable[None]]] = {
    "cancel": cancel.run,
    "trees": trees.run,
    "round_trips": round_trips.run,
    "http": over_http.run,
    "throughput": throughput.run,
    "scaling": scaling.run,
    "hot_path": hot_path.run,
    "cluster": cluster.run,
    "peers": peers.run,  # agno's included
    "agno": peers.run_agno,  # with --only agno only: agno's comparison alone
    "profile": profiles.run,  # with --profile (or --only profile) only
}
ONLY_ON_REQUEST = ("agno", "profile")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers' comparison")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also py-spy profiles of the lifecycle loop and the cancel paths (after the rest)",
    )
    parser.add_argument(
        "--profile-all",
        action="store_true",
        help="py-spy samples every node process of every benchmark (slows them)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    default = [name for name in BENCHMARKS if name not in ONLY_ON_REQUEST]
    chosen = default if args.only is None else args.only.split(",")
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    if args.no_peers and "peers" in chosen:
        chosen.remove("peers")
    if args.profile and "profile" not in chosen:
        chosen.append("profile")
    py_spy = None
    if "profile" in chosen or args.profile_all:
        try:
            py_spy = ensure_py_spy()
        except PySpyMissing as exc:
            parser.exit(2, f"{exc}\n")
    profile = PROFILES["quick" if args.quick else "full"]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = Path(tempfile.mkdtemp(prefix=f"cancel-bus-bench-{stamp}-"))
    report = Report()
    report.meta = _meta(profile.name, chosen, log_dir)
    bench = Bench(profile, report, log_dir, py_spy=py_spy, profile_all=args.profile_all)
    if "profile" in chosen:
        bench.artifacts = args.out / f"{stamp}-profiles"
        report.meta["profiles"] = str(bench.artifacts)
    started = time.monotonic()
    failed = asyncio.run(_run_all(bench, chosen))
    report.meta["seconds"] = round(time.monotonic() - started, 1)
    report.meta["load_after"] = os.getloadavg()
    table = report.table()
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(args.out / f"{stamp}.json")
    (args.out / f"{stamp}.md").write_text(_header(report.meta) + table)
    print(f"written: {args.out / stamp}.json and .md (process logs in {log_dir})")
    if failed:
        print(f"FAILED: {', '.join(failed)} (see the tracebacks above)")
    return 1 if failed else 0


async def _run_all(bench: Bench, chosen: list[str]) -> list[str]:
    """Run the floor, then each benchmark; one that fails is reported (a row and its
    traceback) and the others still run. -> the names of those that failed."""
    await floor.run(bench)
    failed = []
    for name in chosen:
        try:
            await BENCHMARKS[name](bench)
        except Exception as exc:
            failed.append(name)
            traceback.print_exc()
            row = bench.report.figure("failures", f"{name}: not measured", math.nan, "")
            row.note = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
    return failed


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
        "note": "load averages are the machine's (shared): see each stage's machine_busy_cores",
        "profile": profile,
        "benchmarks": ["floor", *chosen],
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_before": os.getloadavg(),
        "python": platform.python_version(),
        "redis_server": version.stdout.strip(),
        "redis_py": redis.__version__,
        "http_stack": _versions("uvicorn", "uvloop", "httptools", "fastapi", "starlette", "httpx"),
        "cancel_bus": cancel_bus.__version__,
        "commit": commit.stdout.strip(),
        "log_dir": str(log_dir),
    }


def _versions(*packages: str) -> dict[str, str]:
    """Installed versions (uvicorn's "auto" loop and parser use uvloop and httptools if there)."""
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _header(meta: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.2f}" for x in meta["load_before"])
    after = ", ".join(f"{x:.2f}" for x in meta["load_after"])
    busy = ", ".join(
        f"{stage['stage']} {stage['machine_busy_cores']:.2f}" for stage in meta.get("stages", [])
    )
    http = ", ".join(f"{k} {v}" for k, v in meta["http_stack"].items())
    return (
        f"`{meta['command']}` — {meta['started_at']}, {meta['seconds']} s, "
        f"{meta['cpus']} CPUs ({meta['cpu_model']}), load average before {load}, after {after}; "
        f"Python {meta['python']}, {meta['redis_server']}, redis-py {meta['redis_py']}, {http}; "
        f"commit {meta['commit']}\n\n"
        f"Machine busy (cores, all processes) by stage: {busy}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
