"""The bounded chaos profile CI runs: the cells of the fault-by-configuration matrix that give
each setting (signing, auth, an ACL user) and each topology both its values (``matrix.BOUNDED``),
every fault kind of the topology once in each (together: every fault kind of the catalogue).
The whole matrix and the long profile: `python -m tests.chaos --help`. Replay a seed:
CHAOS_SEED=<seed>; more runs: CHAOS_RUNS=<n>; keep the JSON summaries: CHAOS_REPORT_DIR=<dir>."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from .faults import CATALOGUE, fault_kinds
from .harness import TOPOLOGIES
from .matrix import BOUNDED, CELLS, Cell
from .runner import run_chaos
from .workload import bounded_profile

pytestmark = pytest.mark.chaos


def test_every_fault_kind_has_a_topology() -> None:
    covered = {kind.name for topology in TOPOLOGIES for kind in fault_kinds(topology)}
    assert covered == {kind.name for kind in CATALOGUE}


def test_the_bounded_cells_give_every_setting_and_topology_both_values() -> None:
    for field in ("signing", "auth", "acl"):
        assert {getattr(cell.settings, field) for cell in BOUNDED} == {False, True}, field
    assert {cell.topology for cell in BOUNDED} == set(TOPOLOGIES)
    assert set(BOUNDED) <= set(CELLS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cell", BOUNDED, ids=lambda cell: cell.name)
async def test_bounded_profile_has_no_violation(cell: Cell, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261202"))
    runs = int(os.environ.get("CHAOS_RUNS", "300"))
    profile = bounded_profile(cell.topology, seed, runs, cell.settings)
    topology = cell.topology
    print(f"chaos seed {seed}, {cell.name} (replay: CHAOS_SEED={seed})")
    report = await run_chaos(profile, tmp_path)
    summary = report.as_dict()
    print(json.dumps(summary, indent=2))
    if directory := os.environ.get("CHAOS_REPORT_DIR"):
        path = Path(directory, f"chaos-{cell.name}.json")
        await asyncio.to_thread(path.write_text, json.dumps(summary, indent=2) + "\n")
    assert report.violation_count == 0, summary["violation_examples"]
    assert not report.notes["unplanned_failovers"], "a stall became a failover"
    assert report.runs >= profile.runs * 0.6  # most runs started despite the faults
    assert report.faults == {kind.name: 1 for kind in fault_kinds(topology)}
    assert sum(report.cancels.values()) > 50
