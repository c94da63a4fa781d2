"""Run chaos profiles by hand, on the cells of the fault-by-configuration matrix (``matrix.py``):

    python -m tests.chaos --bounded --seed 20261202                # what CI runs (its cells)
    python -m tests.chaos --matrix --seed 20261204                 # every cell, bounded size
    python -m tests.chaos --matrix --cell proxied-signing --seed 1  # one cell of it
    python -m tests.chaos --runs 2000 --rounds 5 --seed 20261203   # the long profile

Exit status 1 if any violation; the logs of a run with violations are kept (the path is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .harness import TOPOLOGIES
from .matrix import BOUNDED, CELLS, Cell
from .runner import run_chaos
from .workload import Profile, bounded_profile


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos")
    parser.add_argument("--runs", type=int, default=2000, help="at least this many, per topology")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="each round injects every fault")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--topology", choices=[*TOPOLOGIES, "all"], default="all")
    parser.add_argument("--bounded", action="store_true", help="the CI profile (--seed only)")
    parser.add_argument(
        "--matrix", action="store_true", help="every cell of the matrix, at the bounded size"
    )
    parser.add_argument("--cell", action="append", help="with --matrix: only this cell (by name)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    print(f"chaos seed {args.seed}", flush=True)
    summaries: dict[str, Any] = {}
    violations = 0
    if args.matrix:
        cells: tuple[Cell, ...] = tuple(c for c in CELLS if c.name in (args.cell or [c.name]))
    elif args.bounded:
        cells = BOUNDED
    else:
        cells = tuple(c for c in BOUNDED if args.topology in ("all", c.topology))
    for cell in cells:
        if args.bounded or args.matrix:
            profile = bounded_profile(cell.topology, args.seed, settings=cell.settings)
        else:
            profile = Profile(
                args.runs, args.concurrency, args.seed, args.rounds, cell.topology, cell.settings
            )
        workdir = Path(tempfile.mkdtemp(prefix=f"cancel-bus-chaos-{cell.name}-"))
        report = asyncio.run(run_chaos(profile, workdir))
        if report.violation_count:
            print(f"{cell.name}: logs, audit logs, fault log and history kept in {workdir}")
        else:
            shutil.rmtree(workdir)
        summaries[cell.name] = report.as_dict()
        violations += report.violation_count
        print(json.dumps(summaries[cell.name], indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
