"""Request and response bodies of the HTTP API. Request bodies refuse unknown fields and
non-finite numbers (JSON's NaN/Infinity literals, or 1e400 which parses as infinity)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cancel_bus import ID_PATTERN, CancelMode, NodeInfo, Outcome, RunEvent, RunInfo

Id = Field(pattern=ID_PATTERN, max_length=200)
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class ToolSpec(BaseModel):
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
    model_config = STRICT

    app_name: str = Id
    user_id: str = Id
    session_id: str = Id
    run_id: str | None = Field(default=None, pattern=ID_PATTERN, max_length=200)
    agent: AgentSpec = Field(default_factory=AgentSpec)


class CancelBody(BaseModel):
    model_config = STRICT

    mode: CancelMode = CancelMode.CHECKPOINT
    reason: str | None = Field(default=None, max_length=1000)
    wait: bool = True
    # seconds to wait for the owner's confirmation; it also bounds the Redis round trips, so a
    # shorter one could only end in a 503
    timeout: float = Field(default=5.0, ge=0.1, le=60)


class CancelAnswer(BaseModel):
    outcome: Outcome
    run: RunInfo | None


class RunList(BaseModel):
    runs: list[RunInfo]
    more: bool = Field(description="more runs match beyond this page (see offset)")
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class NodeView(NodeInfo):
    """A node and the state of its lease, read on the server clock: ``late`` when its last
    heartbeat is older than half a lease (one was missed: it may be dying), ``expired`` once
    its lease ran out (its runs are about to be resolved ``owner_lost``)."""

    state: Literal["alive", "late", "expired"]
    heartbeat_age: float = Field(description="seconds since its last heartbeat")
    lease_left: float = Field(description="seconds until its lease expires without a heartbeat")

    @classmethod
    def of(cls, node: NodeInfo, now: float) -> NodeView:
        lease = max(node.lease_expires_at - node.last_heartbeat, 0.0)
        heartbeat_age = max(now - node.last_heartbeat, 0.0)
        lease_left = node.lease_expires_at - now
        state: Literal["alive", "late", "expired"] = "alive"
        if node.expired or lease_left <= 0:
            state = "expired"
        elif heartbeat_age > lease / 2:
            state = "late"
        return cls(
            **node.model_dump(),
            state=state,
            heartbeat_age=heartbeat_age,
            lease_left=max(lease_left, 0.0),
        )


class NodeList(BaseModel):
    nodes: list[NodeView]
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class EventList(BaseModel):
    events: list[RunEvent]
    at: float = Field(description="now, on the Redis server clock the timestamps use")


class Problem(BaseModel):
    """Every error body."""

    detail: str


class FieldError(BaseModel):
    loc: list[str | int] = Field(description="where: body, query or path, then the field")
    msg: str
    type: str


class ValidationProblem(Problem):
    """A 422: ``detail`` in one line, ``errors`` field by field; the input is not echoed."""

    errors: list[FieldError]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    node_id: str
    problems: list[str]
