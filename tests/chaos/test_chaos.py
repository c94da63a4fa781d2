"""The bounded chaos profile CI runs, once per topology: every fault kind of the topology once
(together: every fault kind of the catalogue). The long one: `python -m tests.chaos --help`.
Replay a seed: CHAOS_SEED=<seed>; more runs: CHAOS_RUNS=<n>; keep the JSON summaries:
CHAOS_REPORT_DIR=<dir>."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from .faults import CATALOGUE, fault_kinds
from .harness import TOPOLOGIES, Topology
from .runner import run_chaos
from .workload import bounded_profile

pytestmark = pytest.mark.chaos


def test_every_fault_kind_has_a_topology() -> None:
    covered = {kind.name for topology in TOPOLOGIES for kind in fault_kinds(topology)}
    assert covered == {kind.name for kind in CATALOGUE}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_bounded_profile_has_no_violation(topology: Topology, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261202"))
    profile = bounded_profile(topology, seed, runs=int(os.environ.get("CHAOS_RUNS", "300")))
    print(f"chaos seed {seed}, {topology} (replay: CHAOS_SEED={seed})")
    report = await run_chaos(profile, tmp_path)
    summary = report.as_dict()
    print(json.dumps(summary, indent=2))
    if directory := os.environ.get("CHAOS_REPORT_DIR"):
        path = Path(directory, f"chaos-{topology}.json")
        await asyncio.to_thread(path.write_text, json.dumps(summary, indent=2) + "\n")
    assert report.violation_count == 0, summary["violation_examples"]
    assert not report.notes["unplanned_failovers"], "a stall became a failover"
    assert report.runs >= profile.runs * 0.6  # most runs started despite the faults
    assert report.faults == {kind.name: 1 for kind in fault_kinds(topology)}
    assert sum(report.cancels.values()) > 50
