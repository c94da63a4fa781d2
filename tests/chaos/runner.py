"""One chaos run end to end: cluster, workload under faults, quiescence, the checker."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path

import httpx

from .checker import Checker, Report
from .harness import LEASE_TTL, SWEEP, Cluster
from .lag import watch_lag
from .workload import Profile, Workload

MAX_RUN_SECONDS = 3 * (60 * 0.015 + 2 * 0.15)  # the longest run the workload makes
QUIET_DEADLINE = MAX_RUN_SECONDS + LEASE_TTL + LEASE_TTL / 3 + SWEEP + 3.0
NODES = 4


async def run_chaos(profile: Profile, workdir: Path) -> Report:
    report = Report(seed=profile.seed, topology=profile.topology, settings=profile.settings.name())
    began = time.monotonic()
    cluster = Cluster(
        workdir, NODES, f"chaos-{uuid.uuid4().hex[:8]}", profile.topology, profile.settings
    )
    harness_lags: list[tuple[float, float, str]] = []
    watching = asyncio.create_task(
        watch_lag(lambda at, late: harness_lags.append((at, late, "harness")))
    )
    try:
        await cluster.start()
        workload = Workload(cluster, profile)
        await workload.run()
        watching.cancel()
        report.lags = _lags(cluster, harness_lags)
        report.faults.update(cluster.faults)
        if cluster.group is not None:  # a stall of the primary must not have become a failover
            made = await asyncio.to_thread(cluster.group.failovers)
            report.notes["unplanned_failovers"] = made - cluster.faults["sentinel_failover"]
        report.fault_log = [
            f"{f.at - cluster.fault_log[0].at:+7.2f}s {f.kind} {f.target}: planned "
            f"{f.length:.2f}s, over after {f.end - f.at:.2f}s"
            for f in cluster.fault_log
        ]
        async with cluster.admin() as redis:
            quiet_after = await _quiescence(redis, cluster.namespace)
            report.quiet_after_faults = quiet_after
            checker = Checker(
                cluster, workload.ops, report, [(at, late) for at, late, _ in harness_lags]
            )
            if quiet_after > QUIET_DEADLINE:
                checker.fail(
                    "no_orphan_after_faults",
                    f"runs still active {quiet_after:.1f}s after the faults stopped",
                )
            report.recovered_by_sweep = await _sum_metric(
                cluster, "cancel_bus_cancels_recovered_by_sweep_total"
            )
            await checker.load(redis)
            checker.check_terminal_states()
            checker.check_cancelled_is_true()
            checker.check_no_code_after_its_end()
            checker.check_answers()
            checker.check_no_server_error()
            checker.measure_orphan_resolution()
            await checker.check_no_leak(redis)
            checker.check_cancelled_only_if_asked()
            checker.check_stall_is_not_death()
            if report.violation_count:
                await asyncio.to_thread(checker.dump, workdir / "history.json")
    finally:
        watching.cancel()
        await cluster.stop()
    report.duration = time.monotonic() - began
    return report


def _lags(cluster: Cluster, lags: list[tuple[float, float, str]]) -> list[str]:
    """Every time the harness's or a node's loop ran late, in order, timed from the first
    fault (as the fault log is)."""
    for path in cluster.audit_dir.glob("*.lag"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            lags.append((entry["at"], entry["late"], entry["node"]))
    origin = cluster.fault_log[0].at if cluster.fault_log else 0.0
    return [f"{at - origin:+7.2f}s {who} {late:.2f}s late" for at, late, who in sorted(lags)]


async def _quiescence(redis: object, namespace: str, poll: float = 0.1) -> float:
    """Seconds until no run is active (stops looking at twice the deadline)."""
    active = f"cb:{{{namespace}}}:active"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2 * QUIET_DEADLINE:
        if not await redis.zcard(active):  # type: ignore[attr-defined]
            break
        await asyncio.sleep(poll)
    return time.monotonic() - t0


async def _sum_metric(cluster: Cluster, name: str) -> int:
    total = 0
    async with httpx.AsyncClient(timeout=5) as client:
        for worker in cluster.workers:
            try:
                text = (await client.get(f"{worker.url}/metrics")).text
            except httpx.HTTPError:
                continue
            total += sum(
                int(float(value))
                for value in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
            )
    return total
