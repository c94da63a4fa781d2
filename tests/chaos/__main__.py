"""Run a chaos profile by hand: python -m tests.chaos --runs 2000 --rounds 4 --seed 7"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

from .runner import run_chaos
from .workload import Profile


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="each round injects every fault")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    print(f"chaos seed {args.seed}", flush=True)
    profile = Profile(args.runs, args.concurrency, args.seed, args.rounds)
    workdir = Path(tempfile.mkdtemp(prefix="cancel-bus-chaos-"))
    report = asyncio.run(run_chaos(profile, workdir))
    if report.violation_count:
        print(f"node logs and audit logs kept in {workdir}")
    else:
        shutil.rmtree(workdir)
    summary = report.as_dict()
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if report.violation_count == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
