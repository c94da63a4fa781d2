"""The result rows of a benchmark run, their ratios to the same-run floor, the table and the JSON.

A latency row divides each percentile by the same percentile of its floor (p50 by the floor's p50,
p99 by the floor's p99): machine noise that slows the floor slows the measurement alike. A figure
row (a rate, a size) divides by a floor figure where one applies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._harness import summarize

PERCENTILES = ("min", "p50", "p90", "p99", "max")


@dataclass(frozen=True)
class Target:
    text: str
    met: bool


@dataclass
class Row:
    section: str
    name: str
    unit: str
    stats: dict[str, float] | None = None  # latency rows
    value: float | None = None  # figure rows
    floor: str | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    note: str = ""

    def expect(self, text: str, met: bool) -> Row:
        """Record a target of this row and whether it was met."""
        self.targets.append(Target(text, met))
        return self


class Report:
    """Rows in the order measured, and the floors they are divided by."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.floors: dict[str, Row] = {}
        self.meta: dict[str, Any] = {}

    def latency(
        self,
        section: str,
        name: str,
        samples_ns: Sequence[float],
        *,
        floor: str | None = "hop",
        unit: str = "ms",
        note: str = "",
    ) -> Row:
        scale = {"ms": 1e6, "us": 1e3, "ns": 1.0}[unit]
        stats = {k: v / scale if k not in ("n",) else v for k, v in summarize(samples_ns).items()}
        row = Row(section, name, unit, stats=stats, floor=floor, note=note)
        if floor is not None and floor in self.floors:
            base = self.floors[floor].stats
            assert base is not None
            row.ratios = {q: stats[q] / base[q] for q in ("p50", "p99")}
            row.ratios["p99_over_floor_p50"] = stats["p99"] / base["p50"]
        self.rows.append(row)
        return row

    def figure(
        self,
        section: str,
        name: str,
        value: float,
        unit: str,
        *,
        floor: str | None = None,
        note: str = "",
    ) -> Row:
        row = Row(section, name, unit, value=value, floor=floor, note=note)
        if floor is not None and floor in self.floors:
            base = self.floors[floor].value
            assert base is not None
            row.ratios = {"value": value / base}
        self.rows.append(row)
        return row

    def set_floor(self, key: str, row: Row, *, divided: bool = False) -> None:
        """Make ``row`` the floor named ``key`` (itself divided by nothing, unless ``divided``:
        then it keeps its own ratio to the floor it was measured against)."""
        self.floors[key] = row
        if not divided:
            row.floor = None
            row.ratios = {}

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "floors": {key: row.name for key, row in self.floors.items()},
            "rows": [asdict(row) for row in self.rows],
        }

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    def table(self) -> str:
        """Markdown tables, one per section (printed, and pasted into docs/BENCHMARKS.md)."""
        out: list[str] = []
        sections = list(dict.fromkeys(row.section for row in self.rows))
        for section in sections:
            rows = [row for row in self.rows if row.section == section]
            latency = [row for row in rows if row.stats is not None]
            figures = [row for row in rows if row.stats is None]
            out.append(f"\n### {section}\n")
            if latency:
                out.append(
                    "| measurement | n | min | p50 | p90 | p99 | max | unit "
                    "| p50 / floor | p99 / floor | target |"
                )
                out.append("|---|--:|--:|--:|--:|--:|--:|---|--:|--:|---|")
                out.extend(_latency_line(row) for row in latency)
            if figures:
                if latency:
                    out.append("")
                out.append("| measurement | value | unit | / floor | target |")
                out.append("|---|--:|---|--:|---|")
                out.extend(_figure_line(row) for row in figures)
        return "\n".join(out) + "\n"


def _num(value: float) -> str:
    if math.isnan(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    if abs(value) >= 10:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _targets(row: Row) -> str:
    marks = [f"{'met' if t.met else '**NOT MET**'}: {t.text}" for t in row.targets]
    text = "; ".join(marks)
    return f"{text} {row.note}".strip() if row.note else text


def _ratio(row: Row, key: str) -> str:
    return f"{row.ratios[key]:.2f}x" if key in row.ratios else ""


def _latency_line(row: Row) -> str:
    assert row.stats is not None
    cells = [row.name, str(int(row.stats["n"]))]
    cells += [_num(row.stats[q]) for q in PERCENTILES]
    cells += [row.unit, _ratio(row, "p50"), _ratio(row, "p99"), _targets(row)]
    return "| " + " | ".join(cells) + " |"


def _figure_line(row: Row) -> str:
    assert row.value is not None
    cells = [row.name, _num(row.value), row.unit, _ratio(row, "value"), _targets(row)]
    return "| " + " | ".join(cells) + " |"
