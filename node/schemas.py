"""Request and response bodies of the HTTP API. Request bodies refuse unknown fields and
non-finite numbers (JSON's NaN/Infinity literals, or 1e400 which parses as infinity)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cancel_bus import (
    ID_PATTERN,
    CancelMode,
    CancelResult,
    MultitaskStrategy,
    NodeInfo,
    Outcome,
    RunEvent,
    RunInfo,
    RunStatus,
    Tombstone,
)
from cancel_bus.fields import MAX_HOLD, MAX_ID_LENGTH, Label, OptionalId, Text

from .queries import Age

Id = Field(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH)
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
LATEST = 4e9  # seconds since the epoch (in 2096): a time beyond is a mistake


class ToolSpec(BaseModel):
    """A tool the simulated agent calls: its name, and how long the call takes."""

    model_config = STRICT

    name: str = Field(pattern=ID_PATTERN, max_length=64)
    duration_ms: int = Field(default=500, ge=0, le=600_000)


class AgentSpec(BaseModel):
    """The simulated agent: per turn, ``tokens`` chunks then each tool in turn."""

    model_config = STRICT

    tokens: int = Field(default=50, ge=0, le=100_000)
    token_interval_ms: int = Field(default=20, ge=0, le=60_000)
    tools: list[ToolSpec] = Field(default_factory=list, max_length=32)
    turns: int = Field(default=1, ge=1, le=100)


class StartRun(BaseModel):
    """A run to start on this node: its session, its id (else a new one), its parent, and the
    simulated agent it runs."""

    model_config = STRICT

    app_name: str = Id
    user_id: str = Id
    session_id: str = Id
    run_id: OptionalId = None
    parent: Annotated[
        OptionalId,
        Field(
            description="a run this one is a child of (the caller may see it, in the same "
            "namespace): cancelling the parent cancels it"
        ),
    ] = None
    agent: AgentSpec = Field(default_factory=AgentSpec)
    multitask_strategy: MultitaskStrategy = Field(
        default=MultitaskStrategy.REJECT,
        description="what it does to the session's active run (on any node): reject (409), "
        "enqueue (recorded queued behind it, answered 201 with status queued, started here when "
        "the runs before it have ended, in arrival order), interrupt (cancel it, wait for its "
        "end, then start), rollback (as interrupt, its output discarded)",
    )
    interrupt_mode: CancelMode = CancelMode.CHECKPOINT
    interrupt_timeout: float = Field(
        default=10.0, gt=0, le=60, description="seconds to wait for the interrupted run's end"
    )


class CancelBody(BaseModel):
    """How to cancel: the mode, a reason recorded with the run, and whether to wait (up to
    ``timeout`` seconds) for the run to stop."""

    model_config = STRICT

    mode: CancelMode = CancelMode.CHECKPOINT
    reason: Text | None = None
    wait: bool = True
    # seconds to wait for the owner's confirmation; it also bounds the Redis round trips, so a
    # shorter one could only end in a 503
    timeout: float = Field(default=5.0, ge=0.1, le=60)


class CancelOutcome(BaseModel):
    """One run's answer to a cancel: the outcome, and the run as it then stood."""

    outcome: Outcome
    run: RunInfo | None

    @classmethod
    def of(cls, result: CancelResult) -> CancelOutcome:
        """The answer of the library's :class:`CancelResult`."""
        return cls(outcome=result.outcome, run=result.run)


class CancelAnswer(CancelOutcome):
    """The answer to a cancel: the run's, and one per run started below it (its tree)."""

    descendants: list[CancelOutcome] = Field(
        default_factory=list,
        description="one answer per run started below it (the active ones deepest first, then "
        "ended ones); the run answers cancelled only once each of them is stopped or lost",
    )
    truncated: bool = Field(
        default=False,
        description="the tree was too large for one cancel (over 1,000 active runs below it, or "
        "10,000 in all): the runs left out were not cancelled",
    )

    @classmethod
    def of(cls, result: CancelResult) -> CancelAnswer:
        """The answer of the library's :class:`CancelResult`, with its runs below."""
        return cls(
            outcome=result.outcome,
            run=result.run,
            descendants=[CancelOutcome.of(below) for below in result.descendants],
            truncated=result.truncated,
        )


MetadataKey = Annotated[Label, Field(min_length=1)]
MetadataValue = Text | int | float | bool


class SelectorCancel(BaseModel):
    """Every active run that matches all the criteria given (at least one), across the
    namespaces the node serves (only the app's, given an app). A user token's selector is its
    own runs: its ``user_id`` is put in (another user's id matches nothing)."""

    model_config = STRICT

    run_id: OptionalId = None
    app_name: OptionalId = None
    user_id: OptionalId = None
    session_id: OptionalId = None
    node_id: Annotated[OptionalId, Field(description="runs owned by this node")] = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="the run's metadata holds these keys with these values",
    )
    started_before: float | None = Field(
        default=None, gt=0, le=LATEST, description="started before this time (Redis clock)"
    )
    min_age: Annotated[Age, Field(description="started at least this many seconds ago")] = None
    dry_run: bool = Field(
        default=True,
        description="only count the runs that match (the default: a preview); false cancels",
    )
    ttl: float | None = Field(
        default=None,
        gt=0,
        le=MAX_HOLD,
        description="also cancel matching runs started, claimed or queued in the next ttl "
        "seconds (a tombstone)",
    )
    until: float | None = Field(
        default=None, gt=0, le=LATEST, description="as ttl, until this time (Redis clock)"
    )
    mode: CancelMode = CancelMode.CHECKPOINT
    reason: Text | None = None
    wait: bool = True
    timeout: float = Field(default=5.0, ge=0.1, le=60)

    @model_validator(mode="after")
    def _one_criterion_and_one_hold(self) -> SelectorCancel:
        criteria = (
            self.run_id,
            self.app_name,
            self.user_id,
            self.session_id,
            self.node_id,
            self.metadata,
            self.started_before,
            self.min_age,
        )
        if all(criterion is None for criterion in criteria):
            raise ValueError(
                "a selector needs at least one of run_id, app_name, user_id, session_id, "
                "node_id, metadata, started_before, min_age"
            )
        if self.ttl is not None and self.until is not None:
            raise ValueError("give ttl or until, not both")
        if self.started_before is not None and self.min_age is not None:
            raise ValueError("give started_before or min_age, not both")
        return self


class RunOutcome(BaseModel):
    """A run's answer to a selector cancel, without its record (``GET /v1/runs/{run_id}``)."""

    run_id: str | None = Field(description="null only if the run's record is gone")
    outcome: Outcome
    status: RunStatus | None
    stopped_after: float | None = Field(
        description="seconds from the cancel request to the run's end, once it ended"
    )

    @classmethod
    def of(cls, result: CancelResult, run_id: str | None = None) -> RunOutcome:
        """The answer of the library's :class:`CancelResult`; ``run_id`` names the run if its record
        is gone."""
        return cls(**_outcome_fields(result, run_id))


class SelectedRun(RunOutcome):
    """A matched run's answer, and one per run started below it."""

    descendants: list[RunOutcome] = Field(description="deepest first")

    @classmethod
    def of(cls, result: CancelResult, run_id: str | None = None) -> SelectedRun:
        """The answer of the library's :class:`CancelResult`, with its runs below; ``run_id`` names
        the run if its record is gone."""
        below = [RunOutcome.of(descendant) for descendant in result.descendants]
        return cls(**_outcome_fields(result, run_id), descendants=below)


def _outcome_fields(result: CancelResult, run_id: str | None) -> dict[str, Any]:
    run = result.run
    if run is None:
        return {"run_id": run_id, "outcome": result.outcome, "status": None, "stopped_after": None}
    stopped_after = None
    if run.finished_at is not None and run.cancel_requested_at is not None:
        stopped_after = max(0.0, run.finished_at - run.cancel_requested_at)
    return {
        "run_id": run.run_id,
        "outcome": result.outcome,
        "status": run.status,
        "stopped_after": stopped_after,
    }


class SelectorAnswer(BaseModel):
    """The answer to a selector cancel: the active runs that matched, their cancels (none on a dry
    run), and the tombstones laid."""

    matched: int = Field(description="active runs that matched")
    run_ids: list[str]
    dry_run: bool
    results: list[SelectedRun] = Field(description="each matched run's cancel (none on a dry run)")
    tombstones: list[Tombstone] = Field(
        description="the holds on later runs, one per namespace (with ttl or until)"
    )
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class TombstoneList(BaseModel):
    """The live tombstones: every one for an ops token, those it laid for a user token."""

    tombstones: list[Tombstone] = Field(description="the live tombstones, soonest to expire first")
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class RunList(BaseModel):
    """A page of runs, the most recent first."""

    runs: list[RunInfo]
    more: bool = Field(description="more runs match beyond this page (see offset)")
    at: float = Field(description="now, on the Redis server clock the timestamps use")


NodeState = Literal["alive", "late", "expired", "draining"]


class NodeView(NodeInfo):
    """A node and the state of its lease, read on the server clock: ``late`` when its last
    heartbeat is older than half a lease (one was missed: it may be dying), ``expired`` once
    its lease ran out (its runs are about to be resolved ``owner_lost``); ``draining``: it
    takes no new runs and leaves once its runs end (its record says so from its first
    heartbeat after the drain began; the node answering says so of itself at once)."""

    state: NodeState
    heartbeat_age: float = Field(description="seconds since its last heartbeat")
    lease_left: float = Field(description="seconds until its lease expires without a heartbeat")

    @classmethod
    def of(cls, node: NodeInfo, now: float) -> NodeView:
        """The node, with the state of its lease at ``now`` (the server clock)."""
        lease = max(node.lease_expires_at - node.last_heartbeat, 0.0)
        heartbeat_age = max(now - node.last_heartbeat, 0.0)
        lease_left = node.lease_expires_at - now
        state: NodeState = "alive"
        if node.expired or lease_left <= 0:
            state = "expired"
        elif node.draining:
            state = "draining"
        elif heartbeat_age > lease / 2:
            state = "late"
        return cls(
            **node.model_dump(),
            state=state,
            heartbeat_age=heartbeat_age,
            lease_left=max(lease_left, 0.0),
        )


class NodeList(BaseModel):
    """The live nodes and their leases, by node id."""

    nodes: list[NodeView]
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class EventList(BaseModel):
    """A run's recorded events."""

    events: list[RunEvent]
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class Problem(BaseModel):
    """Every error body."""

    detail: str


class FieldError(BaseModel):
    """One field of a request that is wrong: where it is, and what is wrong with it."""

    loc: list[str | int] = Field(description="where: body, query or path, then the field")
    msg: str
    type: str


class ValidationProblem(Problem):
    """A 422: ``detail`` in one line, ``errors`` field by field; the input is not echoed."""

    errors: list[FieldError]


class Health(BaseModel):
    """Liveness: ``ok``, or ``failing`` with the problem (the embedded server is down)."""

    status: Literal["ok", "failing"]
    problem: str | None = None


class Readiness(BaseModel):
    """Whether the node takes traffic, the problems that keep it from it, and the risks it runs
    with (``warnings``)."""

    ready: bool
    node_id: str
    problems: list[str]
    warnings: list[str] = Field(
        default=[], description="risks the node runs with, accepted by its settings"
    )
