"""What a list of runs asks for (``GET /v1/runs``, the dashboard's feed, the CLI): the filters,
the page, and how a run is ordered (most recent first: an active run by its creation, a
finished one by its end, as the library orders them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from cancel_bus import ID_PATTERN, RunInfo, RunStatus

StatusFilter = Literal[
    "active", "finished", "all", "queued", "running", "waiting", "succeeded", "failed", "cancelled"
]
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
# The most runs one answer looks through: the library's own bound on a list. Filters the
# library does not take (session, phase, id prefix, age) look through that many of the most
# recent runs that match the others; a parent's children are read as such.
WINDOW = 1000
OptionalId = Annotated[str | None, Field(pattern=ID_PATTERN, max_length=200)]
Age = Annotated[float | None, Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False)]


class RunQuery(BaseModel):
    """The runs to list: each filter given must match; ``offset``/``limit`` page the result."""

    model_config = ConfigDict(frozen=True)

    status: StatusFilter = Field(
        default="active",
        description="active (queued, running, waiting), finished (succeeded, failed, "
        "cancelled), all, or one status",
    )
    node_id: OptionalId = None
    app_name: OptionalId = None
    user_id: OptionalId = None
    session_id: OptionalId = None
    parent: Annotated[OptionalId, Field(description="runs started as its children")] = None
    phase: str | None = Field(
        default=None,
        max_length=200,
        description='the run\'s phase, or its kind: "tool" matches "tool:search"',
    )
    id_prefix: Annotated[OptionalId, Field(description="run ids that start so")] = None
    min_age: Annotated[Age, Field(description="seconds since the run was created, at least")] = None
    max_age: Annotated[Age, Field(description="seconds since the run was created, at most")] = None
    limit: int = Field(default=100, ge=1, le=WINDOW)
    offset: int = Field(default=0, ge=0, lt=WINDOW, description=f"offset + limit ≤ {WINDOW}")

    @property
    def narrows(self) -> bool:
        """A filter the library does not take is given: the node applies it."""
        return any(
            value is not None
            for value in (
                self.session_id,
                self.parent,
                self.phase,
                self.id_prefix,
                self.min_age,
                self.max_age,
            )
        )

    def listed(self, run: RunInfo) -> bool:
        """The filters the library applies to a list, for runs read another way (children)."""
        return (
            _status_matches(run.status, self.status)
            and (self.node_id is None or run.owner == self.node_id)
            and (self.app_name is None or run.app_name == self.app_name)
            and (self.user_id is None or run.user_id == self.user_id)
        )

    def matches(self, run: RunInfo, now: float) -> bool:
        """The filters the node applies (the library applied the others)."""
        age = now - run.created_at
        return (
            (self.session_id is None or run.session_id == self.session_id)
            and (self.parent is None or run.parent == self.parent)
            and (self.phase is None or _phase_matches(run.phase, self.phase))
            and (self.id_prefix is None or run.run_id.startswith(self.id_prefix))
            and (self.min_age is None or age >= self.min_age)
            and (self.max_age is None or age <= self.max_age)
        )


def _status_matches(status: RunStatus, wanted: StatusFilter) -> bool:
    if wanted == "active":
        return status.is_active
    if wanted == "finished":
        return status in FINISHED
    return wanted in ("all", status.value)


def _phase_matches(phase: str | None, wanted: str) -> bool:
    return phase is not None and (phase == wanted or phase.startswith(wanted + ":"))


def recency(run: RunInfo) -> float:
    """When the run last changed state: its end, else its creation (the library's order)."""
    return run.finished_at if run.finished_at is not None else run.created_at
