"""The history checker: what the workload was told, what the nodes' code did (audit logs) and
what Redis holds at the end must tell one consistent story — and one in which only the faults
of a node can cost its runs their lives (a stalled or failed-over Redis is nobody's death)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from cancel_bus import RunInfo
from cancel_bus._keys import KeySpace

from .faults import DATA_LOSS
from .harness import LEASE_TTL, RETENTION, RIDE_OUT, SWEEP, Cluster, Fault
from .workload import Op

ANSWER_BOUND = 1.5  # seconds a cancel may take beyond its own timeout (HTTP, a busy machine)
CLOCK_SLACK = 0.05  # Redis and the workload read the same host clock
THAW = 0.25  # seconds a SIGCONTed node's code may take one step before its fence stops it
# A node fault explains what befalls that node's runs from when it strikes until a lease and a
# sweep after it is over (+1 s: a loaded 2-core machine)
BLAME_WINDOW = LEASE_TTL + SWEEP + 1.0
DEATHS = ("owner_lost", "lease_lost", "redis_unreachable")  # end reasons that mean "not asked"
REFUSED = ("already_finished", "not_found")  # answers of a cancel that was not recorded
CATEGORIES = (
    "one_terminal_state",
    "cancelled_is_true",
    "answer_in_time_and_consistent",
    "no_orphan_after_faults",
    "no_leak",
    "cancelled_only_if_asked",
    "stall_is_not_death",
    "no_code_after_its_end",
    "no_server_error",
)


@dataclass
class Report:
    seed: int
    topology: str = "proxied"
    settings: str = "plain"
    runs: int = 0
    reads: Counter[str] = field(default_factory=Counter)
    cancels: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: Counter[str] = field(default_factory=Counter)
    # stall_is_not_death: runs stopped or lost by each Redis fault kind (0: it harmed none)
    unexplained_by_fault: Counter[str] = field(default_factory=Counter)
    recovered_by_sweep: int = 0
    worst_orphan_resolution: float = 0.0
    quiet_after_faults: float = 0.0
    worst_orphan: str = ""
    worst_cancel_answer: float = 0.0
    worst_cancel_overshoot: float = 0.0
    duration: float = 0.0
    fault_log: list[str] = field(default_factory=list)  # as struck, with their real lengths
    lags: list[str] = field(default_factory=list)  # when the harness's or a node's loop ran late

    @property
    def violation_count(self) -> int:
        return sum(len(v) for v in self.violations.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "topology": self.topology,
            "settings": self.settings,
            "runs": self.runs,
            "reads": dict(self.reads),
            "cancels": dict(self.cancels),
            "faults": dict(self.faults),
            "violations": {c: len(self.violations.get(c, [])) for c in CATEGORIES},
            "violation_examples": {c: v[:20] for c, v in self.violations.items() if v},
            "notes": dict(self.notes),
            "unexplained_stops_by_redis_fault": dict(self.unexplained_by_fault),
            "cancels_recovered_by_sweep": self.recovered_by_sweep,
            "worst_orphan_resolution_s": round(self.worst_orphan_resolution, 3),
            "worst_orphan": self.worst_orphan,
            "active_runs_gone_after_faults_s": round(self.quiet_after_faults, 3),
            "worst_cancel_answer_s": round(self.worst_cancel_answer, 3),
            "worst_cancel_overshoot_s": round(self.worst_cancel_overshoot, 3),
            "duration_s": round(self.duration, 1),
            "fault_log": self.fault_log,
            "loop_lags": self.lags,
        }


class Checker:
    def __init__(
        self,
        cluster: Cluster,
        ops: list[Op],
        report: Report,
        harness_lags: Sequence[tuple[float, float]] = (),
    ) -> None:
        self.cluster = cluster
        self.harness_lags = harness_lags  # (wall time it began, seconds late)
        self.ops = ops
        self.report = report
        self.keys = KeySpace(cluster.namespace)
        self.records: dict[str, RunInfo | None] = {}
        self.finishes: dict[str, list[str]] = {}
        self.audit: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.before_restart: dict[str, RunInfo] = {}  # the last record of runs Redis forgot
        self.data_loss = [f.at for f in cluster.fault_log if f.kind in DATA_LOSS]
        self.downtime = [f for f in cluster.fault_log if f.kind in ("sigkill", "sigstop")]
        self.cancels: dict[str, list[Op]] = defaultdict(list)
        for op in self.cancel_ops():
            if op.run_id is not None:
                self.cancels[op.run_id].append(op)

    def fail(self, category: str, detail: str) -> None:
        self.report.violations[category].append(detail)

    def dump(self, path: Path) -> None:
        """The whole history and every violation, to study a failed run offline."""
        history = {
            "violations": self.report.violations,
            "faults": [asdict(f) for f in self.cluster.fault_log],
            "ops": [op.as_dict() for op in self.ops],
            "records": {
                run_id: record and record.model_dump(mode="json")
                for run_id, record in self.records.items()
            },
            "before_data_loss": {
                run_id: record.model_dump(mode="json")
                for run_id, record in self.before_restart.items()
            },
            "finishes": self.finishes,
        }
        path.write_text(json.dumps(history, indent=1) + "\n")

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

    def owner_struck_near_the_loss(self, before: RunInfo) -> bool:
        """The run's owner had a fault around the data loss that forgot the run (then nobody
        may be left to re-assert it)."""
        loss = next(
            (
                f
                for f in self.cluster.fault_log
                if f.kind in DATA_LOSS and f.at >= before.created_at - CLOCK_SLACK
            ),
            None,
        )
        return loss is None or any(
            f.node_level
            and f.target == before.owner
            and loss.at - BLAME_WINDOW <= f.at <= loss.end + BLAME_WINDOW
            for f in self.cluster.fault_log
        )

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
                    if self.owner_struck_near_the_loss(before):
                        self.report.notes["active_at_a_restart_and_never_reasserted"] += 1
                    else:
                        self.fail(
                            "one_terminal_state",
                            f"{run_id}: active when Redis lost its data, never re-asserted nor "
                            f"finished by its live owner; {self.story(run_id, before, None)}",
                        )
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

    # -- 2b. no answer and no record says a run ended while its code went on ------------------

    def check_no_code_after_its_end(self) -> None:
        """A run recorded ended (by its owner, or resolved ``owner_lost`` by another node), or
        answered ``already_finished``/``owner_lost``, emits nothing after that moment: a node
        cut off from Redis stops its code before its lease can expire (DESIGN §9)."""
        for run_id, entries in self.audit.items():
            record = self.last_record(run_id)
            moments = (
                [("recorded ended", record.finished_at)] if record and record.finished_at else []
            )
            moments += [
                (f"answered {op.outcome}", op.ended)
                for op in self.cancels.get(run_id, ())
                if op.outcome in ("already_finished", "owner_lost")
            ]
            for what, at in moments:
                late = [
                    e
                    for e in entries
                    if e["event"] == "emit"
                    and e["at"] > at + CLOCK_SLACK
                    and not self.just_thawed(e["node"], e["at"])
                ]
                if late:
                    self.fail(
                        "no_code_after_its_end",
                        f"{run_id}: {len(late)} emission(s) after it was {what} "
                        f"({late[-1]['at'] - at:.3f}s after); {self.story(run_id, record, at)}",
                    )
                    break

    def harness_late(self, op: Op) -> float:
        """Seconds the harness's own loop ran late while ``op`` was under way: its timestamps
        (and its requests' sending) were late by as much, whatever the node did."""
        return sum(
            late for at, late in self.harness_lags if op.started <= at + late and at <= op.ended
        )

    def just_thawed(self, node: str, at: float) -> bool:
        """``at`` is in the first moments after a SIGSTOP of ``node`` ended: a frozen process
        cannot stop its code while frozen, and on waking the code's next step may come before
        the node's first turn of its own (then the fence stops it)."""
        return any(
            f.kind == "sigstop" and f.target == node and f.end <= at <= f.end + THAW
            for f in self.cluster.fault_log
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
                elif self.harness_late(op) >= took - op.timeout - ANSWER_BOUND:
                    self.report.notes["answers_timed_by_a_late_harness"] += 1
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
        lost = any(op.started - 60 <= at <= op.ended + 5 for at in self.data_loss)
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
            f"{f.kind} {f.target} at {f.at:.3f}"
            for f in self.cluster.fault_log
            if op.started - 10 <= f.at <= op.ended
        )

    def node_was_down(self, node: str, start: float, end: float) -> bool:
        """A kill or a stop of that node around the call (it cannot answer while frozen)."""
        return any(f.target == node and start - 10 <= f.at <= end for f in self.downtime)

    # -- 3b. no call is ever answered with a server error but 503 -------------------------

    def check_no_server_error(self) -> None:
        """Every call — a start, a cancel, and the reads beside them (the runs list, a follow,
        readiness, the nodes) — is answered 2xx, 4xx or 503 (Redis cannot serve it now, with a
        reason): never a 500, whatever the fault."""
        for op in self.ops:
            if op.kind in ("list", "follow", "ready", "nodes"):
                answer = op.status if op.status is not None else f"no answer ({op.error})"
                self.report.reads[f"{op.kind} {answer}"] += 1
            if op.status is not None and op.status >= 500 and op.status != 503:
                self.fail(
                    "no_server_error",
                    f"{op.kind} via {op.node} at {op.started:.3f}: HTTP {op.status} "
                    f"({op.error}; {self.faults_near(op)})",
                )

    # -- 4. orphans are resolved ---------------------------------------------------------

    def measure_orphan_resolution(self) -> None:
        """For each run resolved as owner_lost: from its owner's fault to its resolution."""
        for run_id in self.records:
            record = self.last_record(run_id)
            if record is None or record.end_reason != "owner_lost" or not record.finished_at:
                continue
            struck = [  # the owner's faults in the run's life (others: stall_is_not_death)
                f.at
                for f in self.cluster.fault_log
                if f.target == record.owner
                and record.created_at - CLOCK_SLACK <= f.at <= record.finished_at
                and f.kind in ("sigkill", "sigstop", "partition")
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
            f"{f.kind} {f.target} at {f.at - start:+.2f}s"
            for f in self.cluster.fault_log
            if start - 5 <= f.at <= end
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

    # -- 6. "cancelled" only if someone asked -------------------------------------------

    def asked(self, run_id: str, before: float | None) -> bool:
        """The workload sent a cancel for the run (not refused) before ``before``."""
        return any(
            op.outcome not in REFUSED and (before is None or op.started <= before + CLOCK_SLACK)
            for op in self.cancels.get(run_id, ())
        )

    def check_cancelled_only_if_asked(self) -> None:
        """A run recorded ``cancelled`` holds a cancel request in its record and the workload
        sent one for it. (A drain records one too, reason ``node_shutdown``; the suite drains
        no node before the checker has read the history.)"""
        for run_id in self.records:
            if self.final_status(run_id) != "cancelled":
                continue
            record = self.last_record(run_id)
            ended = record.finished_at if record is not None else None
            missing = []
            if record is not None and record.cancel_requested_at is None:
                missing.append("no cancel_requested_at in its record")
            if not self.asked(run_id, ended):
                missing.append("no cancel sent by the workload")
            if missing:
                self.fail(
                    "cancelled_only_if_asked",
                    f"{run_id}: ended cancelled, but {' and '.join(missing)}; "
                    f"{self.story(run_id, record, ended)}",
                )

    # -- 7. a stall is nobody's death ------------------------------------------------------

    def check_stall_is_not_death(self) -> None:
        """Only a fault of a run's own node (within BLAME_WINDOW) may end it ``owner_lost``,
        ``lease_lost`` or ``redis_unreachable``, or stop its code without a cancel request:
        never a Redis-wide stall or a failover shorter than a node rides out (past it, each node
        stops its runs before its lease could run out: ``redis_unreachable`` is the honest
        cause)."""
        for fault in self.cluster.fault_log:
            if not fault.node_level:
                self.report.unexplained_by_fault[fault.kind] += 0  # listed, even if harmless
        unanswered = [run_id for run_id in self.audit if run_id not in self.records]
        for run_id in [*self.records, *unanswered]:  # a start without an answer may have run
            record = self.last_record(run_id)
            found: list[str] = []
            at: float | None = None
            if record is not None and (death := self.unexplained_death(record)) is not None:
                found.append(f"ended {record.status.value}/{record.end_reason}")
                at = death
            if (stop := self.unexplained_stop(run_id)) is not None:
                found.append(f"its code on {stop['node']} was stopped unasked")
                at = at if at is not None else float(stop["at"])
            if at is None:
                if record is not None and record.end_reason == "error":
                    self.report.notes["failed_with_an_error"] += 1  # the agents never fail
                continue
            self.report.unexplained_by_fault[self.culprit(at)] += 1
            self.fail(
                "stall_is_not_death",
                f"{run_id}: {' and '.join(found)}, its node had no fault; "
                f"{self.story(run_id, record, at)}",
            )

    def unexplained_death(self, record: RunInfo) -> float | None:
        """When the run ended owner_lost/lease_lost/redis_unreachable with no fault of its
        owner to explain it (None: it did not, or a fault explains it)."""
        if record.end_reason not in DEATHS or record.finished_at is None:
            return None
        at = record.finished_at
        if self.blame(record.owner, at) or self.long_outage(record, at):
            return None
        return at

    def unexplained_stop(self, run_id: str) -> dict[str, Any] | None:
        """The audit entry of the run's code stopped without a cancel sent for it and with no
        fault of its node to explain it (None: it was not, or it is explained)."""
        stop = self.stop_seen(run_id)
        if stop is None or self.asked(run_id, stop["at"]) or self.blame(stop["node"], stop["at"]):
            return None
        if self.outage_past_the_ride_out(float(stop["at"])):
            return None  # its node stopped it before its lease could run out
        return stop

    def stop_seen(self, run_id: str) -> dict[str, Any] | None:
        """The first moment the run's code was stopped (a cancel observed or an interruption)."""
        entries = sorted(self.audit.get(run_id, ()), key=lambda e: float(e["at"]))
        return next(
            (
                e
                for e in entries
                if e["event"] == "observed"
                or (e["event"] == "code_end" and e.get("how") in ("cancelled", "interrupted"))
            ),
            None,
        )

    def blame(self, node: str | None, at: float) -> Fault | None:
        """The fault of ``node`` that explains what befell its run at ``at``, if any."""
        return next(
            (
                f
                for f in self.cluster.fault_log
                if f.node_level
                and f.target == node
                and f.at - CLOCK_SLACK <= at <= f.end + BLAME_WINDOW
            ),
            None,
        )

    def long_outage(self, record: RunInfo, at: float) -> bool:
        """Redis gone for longer than the nodes ride out: ``redis_unreachable`` is true."""
        return record.end_reason == "redis_unreachable" and self.outage_past_the_ride_out(at)

    def outage_past_the_ride_out(self, at: float) -> bool:
        """A Redis-wide fault near ``at`` lasted longer than a node rides out (``RIDE_OUT``)."""
        return any(f.end - f.at >= RIDE_OUT for f in self.redis_faults_near(at))

    def redis_faults_near(self, at: float) -> list[Fault]:
        """Redis-wide faults that were on, or recently over, at ``at``: the likely culprits."""
        return [
            f
            for f in self.cluster.fault_log
            if not f.node_level and f.at - 1.0 <= at <= f.end + BLAME_WINDOW
        ]

    def culprit(self, at: float) -> str:
        """The Redis-wide fault most likely behind what happened at ``at``: the last to have
        struck by then (else the first about to), or ``no_fault``."""
        suspects = self.redis_faults_near(at)
        struck = [f for f in suspects if f.at <= at]
        if struck:
            return struck[-1].kind
        return suspects[0].kind if suspects else "no_fault"

    def story(self, run_id: str, record: RunInfo | None, at: float | None) -> str:
        """The run's life next to the faults (times relative to its creation), for a
        violation's detail."""
        if record is None:
            origin = at or 0.0
            life = f"record lost; times from {origin:.3f}"
        else:
            origin = record.created_at
            requested = record.cancel_requested_at
            asked = "never" if requested is None else f"{requested - origin:+.2f}s"
            life = (
                f"owner {record.owner}, created {origin:.3f}, ended {record.status.value}/"
                f"{record.end_reason} at {(record.finished_at or origin) - origin:+.2f}s, "
                f"cancel requested {asked}"
            )
        cancels = [
            f"{op.kind} -> {op.outcome or op.status or op.error} at {op.started - origin:+.2f}s"
            for op in self.cancels.get(run_id, ())
        ]
        until = max(at or origin, record.finished_at or origin if record else origin) + 1.0
        faults = [
            f"{f.kind} {f.target} at {f.at - origin:+.2f}s for {f.end - f.at:.2f}s"
            for f in self.cluster.fault_log
            if origin - 5 <= f.at <= until
        ]
        return f"{life}; cancels sent: {cancels or 'none'}; faults: {faults or 'none'}"
