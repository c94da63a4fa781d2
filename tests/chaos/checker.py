"""The history checker: what the workload was told, what the nodes' code did (audit logs) and
what Redis holds at the end must tell one consistent story."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from cancel_bus import RunInfo
from cancel_bus._keys import KeySpace

from .harness import LEASE_TTL, RETENTION, SWEEP, Cluster
from .workload import Op

ANSWER_BOUND = 1.5  # seconds a cancel may take beyond its own timeout (HTTP, a busy machine)
CLOCK_SLACK = 0.05  # Redis and the workload read the same host clock
CATEGORIES = (
    "one_terminal_state",
    "cancelled_is_true",
    "answer_in_time_and_consistent",
    "no_orphan_after_faults",
    "no_leak",
)


@dataclass
class Report:
    seed: int
    runs: int = 0
    cancels: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: Counter[str] = field(default_factory=Counter)
    recovered_by_sweep: int = 0
    worst_orphan_resolution: float = 0.0
    quiet_after_faults: float = 0.0
    worst_orphan: str = ""
    worst_cancel_answer: float = 0.0
    worst_cancel_overshoot: float = 0.0
    duration: float = 0.0

    @property
    def violation_count(self) -> int:
        return sum(len(v) for v in self.violations.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "runs": self.runs,
            "cancels": dict(self.cancels),
            "faults": dict(self.faults),
            "violations": {c: len(self.violations.get(c, [])) for c in CATEGORIES},
            "violation_examples": {c: v[:20] for c, v in self.violations.items() if v},
            "notes": dict(self.notes),
            "cancels_recovered_by_sweep": self.recovered_by_sweep,
            "worst_orphan_resolution_s": round(self.worst_orphan_resolution, 3),
            "worst_orphan": self.worst_orphan,
            "active_runs_gone_after_faults_s": round(self.quiet_after_faults, 3),
            "worst_cancel_answer_s": round(self.worst_cancel_answer, 3),
            "worst_cancel_overshoot_s": round(self.worst_cancel_overshoot, 3),
            "duration_s": round(self.duration, 1),
        }


class Checker:
    def __init__(self, cluster: Cluster, ops: list[Op], report: Report) -> None:
        self.cluster = cluster
        self.ops = ops
        self.report = report
        self.keys = KeySpace(cluster.namespace)
        self.records: dict[str, RunInfo | None] = {}
        self.finishes: dict[str, list[str]] = {}
        self.audit: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.before_restart: dict[str, RunInfo] = {}  # the last record of runs Redis forgot
        self.restarts = [at for at, kind, _ in cluster.fault_log if kind.startswith("redis")]
        self.downtime = [
            (at, kind, target)
            for at, kind, target in cluster.fault_log
            if kind in ("sigkill", "sigstop")
        ]

    def fail(self, category: str, detail: str) -> None:
        self.report.violations[category].append(detail)

    def load_audit(self) -> None:
        for path in Path(self.cluster.audit_dir).glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self.audit[entry["run"]].append(entry)

    async def load(self, redis: aioredis.Redis) -> None:
        self.load_audit()
        for op in self.ops:
            if op.kind == "start" and op.run_id and op.run_id not in self.records:
                fields = await redis.hgetall(self.keys.run(op.run_id))
                self.records[op.run_id] = RunInfo.from_redis(fields) if fields else None
                before = self.cluster.forgotten.get(op.run_id)
                if before is not None:
                    self.before_restart[op.run_id] = RunInfo.from_redis(before)
                log = map(json.loads, await redis.lrange(self.keys.events(op.run_id), 0, -1))
                self.finishes[op.run_id] = [
                    e["data"].get("status") for e in log if e["type"] == "run.finished"
                ]
        self.report.runs = len(self.records)

    # -- 1. exactly one terminal state, Redis and the logs agree --------------------------

    def last_record(self, run_id: str) -> RunInfo | None:
        """The run as Redis holds it, or as it held it just before a restart forgot it."""
        return self.records.get(run_id) or self.before_restart.get(run_id)

    def final_status(self, run_id: str) -> str | None:
        record = self.last_record(run_id)
        if record is not None and not record.is_active:
            return record.status.value
        finals = [e["status"] for e in self.audit[run_id] if e["event"] == "final"]
        return finals[-1] if finals and finals[-1] else None

    def check_terminal_states(self) -> None:
        for run_id, record in self.records.items():
            finals = {
                e["status"] for e in self.audit[run_id] if e["event"] == "final" and e["status"]
            }
            if record is None:
                before = self.before_restart.get(run_id)
                if before is None:
                    self.fail(
                        "one_terminal_state", f"{run_id}: no record, not even before a restart"
                    )
                elif before.is_active:
                    self.report.notes["active_at_a_restart_and_never_reasserted"] += 1
                else:
                    self.report.notes["finished_before_a_restart_forgot_them"] += 1
                    if finals and finals != {before.status.value}:
                        self.fail(
                            "one_terminal_state",
                            f"{run_id}: node recorded {finals}, Redis had {before.status.value}",
                        )
                continue
            if record.is_active:
                self.fail("one_terminal_state", f"{run_id}: still {record.status.value}")
                continue
            if self.finishes[run_id] != [record.status.value]:
                self.fail(
                    "one_terminal_state",
                    f"{run_id}: record {record.status.value}, events {self.finishes[run_id]}",
                )
            if finals and finals != {record.status.value}:
                self.fail(
                    "one_terminal_state",
                    f"{run_id}: node recorded {finals}, Redis {record.status.value}",
                )

    # -- 2. "cancelled" is true, and no code went on after a cancel was observed -----------

    def check_cancelled_is_true(self) -> None:
        for op in self.cancel_ops():
            if op.outcome == "cancelled" and op.run_id:
                status = self.final_status(op.run_id)
                if status not in ("cancelled", None):
                    self.fail("cancelled_is_true", f"{op.run_id}: answered cancelled, is {status}")
        for run_id, entries in self.audit.items():
            stopped_at = min((e["at"] for e in entries if e["event"] == "observed"), default=None)
            if stopped_at is None:
                continue
            late = [e for e in entries if e["event"] == "emit" and e["at"] > stopped_at]
            if late:
                self.fail(
                    "cancelled_is_true",
                    f"{run_id}: {len(late)} emission(s) after the cancel was observed",
                )

    # -- 3. every cancel answered in time, with an outcome the history bears out ----------

    def cancel_ops(self) -> list[Op]:
        return [op for op in self.ops if op.kind in ("cancel", "cancel_session")]

    def check_answers(self) -> None:
        for op in self.cancel_ops():
            assert op.timeout is not None and op.run_id is not None
            took = op.ended - op.started
            if op.status is None:
                self.report.cancels["no_answer"] += 1
                if not self.node_was_down(op.node, op.started, op.ended):
                    self.fail(
                        "answer_in_time_and_consistent",
                        f"{op.run_id}: no answer from live node {op.node} ({op.error})",
                    )
                continue
            frozen = self.node_was_down(op.node, op.started, op.ended)
            if not frozen:
                self.report.worst_cancel_answer = max(self.report.worst_cancel_answer, took)
                self.report.worst_cancel_overshoot = max(
                    self.report.worst_cancel_overshoot, took - op.timeout
                )
            if took > op.timeout + ANSWER_BOUND:
                if frozen:
                    self.report.notes["late_answers_from_a_frozen_node"] += 1
                else:
                    self.fail(
                        "answer_in_time_and_consistent",
                        f"{op.run_id}: answered in {took:.2f}s, timeout {op.timeout}s, "
                        f"by {op.node} at {op.started:.3f} ({self.faults_near(op)})",
                    )
            if op.status >= 500:
                self.report.cancels["bus_unavailable"] += 1
                if op.status != 503:
                    self.fail("answer_in_time_and_consistent", f"{op.run_id}: HTTP {op.status}")
                continue
            self.report.cancels[op.outcome or "?"] += 1
            self.check_outcome(op)

    def check_outcome(self, op: Op) -> None:
        assert op.run_id is not None
        record = self.last_record(op.run_id)
        status = self.final_status(op.run_id)
        lost = any(op.started - 60 <= at <= op.ended + 5 for at in self.restarts)
        if op.outcome == "already_finished":
            if record is not None and (record.finished_at or 0) > op.ended + CLOCK_SLACK:
                self.fail(
                    "answer_in_time_and_consistent",
                    f"{op.run_id}: already_finished, but it ended after the answer",
                )
        elif op.outcome == "not_found":
            ended = self.ended_at(op.run_id)
            if not (
                lost
                or (
                    op.kind == "cancel_session"
                    and ended is not None
                    and ended <= op.ended + CLOCK_SLACK
                )
            ):
                self.fail(
                    "answer_in_time_and_consistent",
                    f"{op.run_id}: {op.kind} not_found while known, via {op.node} "
                    f"{op.started:.3f}-{op.ended:.3f}, record {record and record.status}"
                    f" finished {record and record.finished_at} ({self.faults_near(op)})",
                )
        elif op.outcome == "owner_lost":
            if record is not None and record.end_reason != "owner_lost":
                self.fail(
                    "answer_in_time_and_consistent",
                    f"{op.run_id}: owner_lost, but ended {record.end_reason}",
                )
        elif op.outcome == "stopping":
            if status is None:
                self.report.notes["stopping_unverifiable_after_data_loss"] += 1
            elif status != "cancelled":
                now = self.records.get(op.run_id)
                self.fail(
                    "answer_in_time_and_consistent",
                    f"{op.run_id}: accepted (stopping), but ended {status}; {op.kind} "
                    f"{op.mode} wait={op.wait} via {op.node} {op.started:.3f}-"
                    f"{op.ended:.3f}; owner {record and record.owner}; record "
                    f"{'kept' if now else 'forgotten'} ({self.faults_near(op)})",
                )

    def ended_at(self, run_id: str) -> float | None:
        record = self.last_record(run_id)
        return record.finished_at if record is not None else None

    def faults_near(self, op: Op) -> str:
        return ", ".join(
            f"{kind} {target} at {at:.3f}"
            for at, kind, target in self.cluster.fault_log
            if op.started - 10 <= at <= op.ended
        )

    def node_was_down(self, node: str, start: float, end: float) -> bool:
        """A kill or a stop of that node around the call (it cannot answer while frozen)."""
        return any(target == node and start - 10 <= at <= end for at, _, target in self.downtime)

    # -- 4. orphans are resolved ---------------------------------------------------------

    def measure_orphan_resolution(self) -> None:
        """For each run resolved as owner_lost: from its owner's fault to its resolution."""
        for run_id in self.records:
            record = self.last_record(run_id)
            if record is None or record.end_reason != "owner_lost" or not record.finished_at:
                continue
            struck = [
                at
                for at, kind, target in self.cluster.fault_log
                if target == record.owner
                and at <= record.finished_at
                and kind in ("sigkill", "sigstop", "partition")
            ]
            if struck:
                took = record.finished_at - max(struck)
                if took > self.report.worst_orphan_resolution:
                    self.report.worst_orphan_resolution = took
                    self.report.worst_orphan = f"{run_id}: {self.faults_between(record)}"
                if took > LEASE_TTL + SWEEP:
                    self.fail(
                        "no_orphan_after_faults",
                        f"{run_id} resolved {took:.2f}s after "
                        f"its owner's fault ({self.faults_between(record)})",
                    )
                self.report.notes["runs_resolved_as_owner_lost"] += 1

    def faults_between(self, record: RunInfo) -> str:
        start, end = record.created_at, record.finished_at or 0.0
        faults = ", ".join(
            f"{kind} {target} at {at - start:+.2f}s"
            for at, kind, target in self.cluster.fault_log
            if start - 5 <= at <= end
        )
        return f"owner {record.owner}; {faults}; resolved at {end - start:+.2f}s"

    # -- 5. nothing left behind ---------------------------------------------------------

    async def check_no_leak(self, redis: aioredis.Redis) -> None:
        k = self.keys
        if await redis.zcard(k.active):
            self.fail("no_leak", f"{await redis.zcard(k.active)} run(s) left in the active index")
        async for key in redis.scan_iter(match=f"{k.prefix}*", count=1000):
            rest = key[len(k.prefix) :]
            kind = rest.split(":", 1)[0]
            if rest.endswith(":pending") and await redis.hlen(key):
                self.fail("no_leak", f"{key}: pending cancels left")
            elif kind in ("wait", "sess"):
                self.fail("no_leak", f"{key} left behind")
            elif kind in ("run", "ev", "out"):
                ttl = await redis.pttl(key)
                if not 0 < ttl <= RETENTION * 1000:
                    self.fail("no_leak", f"{key}: ttl {ttl} ms, retention {RETENTION}s")
