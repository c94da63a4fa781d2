"""The bounded chaos profile CI runs (the long one: `python -m tests.chaos --help`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .runner import run_chaos
from .workload import Profile

pytestmark = pytest.mark.chaos


async def test_bounded_profile_has_no_violation(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261202"))
    profile = Profile(
        runs=int(os.environ.get("CHAOS_RUNS", "300")), concurrency=24, seed=seed, fault_rounds=1
    )
    print(f"chaos seed {seed} (replay: CHAOS_SEED={seed})")
    report = await run_chaos(profile, tmp_path)
    summary = report.as_dict()
    print(json.dumps(summary, indent=2))
    assert report.violation_count == 0, summary["violation_examples"]
    assert report.runs >= profile.runs * 0.6  # most runs started despite the faults
    assert sum(report.faults.values()) == 7 and sum(report.cancels.values()) > 50
