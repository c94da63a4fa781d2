"""What a list of runs asks for (``GET /v1/runs``, the dashboard's feed, the CLI): the filters,
the page, and how a run is ordered (most recent first: an active run by its creation, a
finished one by its end, as the library orders them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from cancel_bus import RunFilter, RunStatus
from cancel_bus.fields import MAX_LIST_LIMIT, Label, ListLimit, OptionalId

StatusFilter = Literal[
    "active", "finished", "all", "queued", "running", "waiting", "succeeded", "failed", "cancelled"
]
# The most runs one answer looks through: the library's own bound on a list. Filters the
# library does not take (session, phase, id prefix, age) look through that many of the most
# recent runs that match the others; a parent's children are read as such.
WINDOW = MAX_LIST_LIMIT
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
    phase: Label | None = Field(
        default=None,
        description='the run\'s phase, or its kind: "tool" matches "tool:search"',
    )
    id_prefix: Annotated[OptionalId, Field(description="run ids that start so")] = None
    min_age: Annotated[Age, Field(description="seconds since the run was created, at least")] = None
    max_age: Annotated[Age, Field(description="seconds since the run was created, at most")] = None
    limit: ListLimit = 100
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

    @property
    def filter(self) -> RunFilter:
        """Which runs it asks for, as the library matches them."""
        return RunFilter(
            status=_of_library(self.status),
            node_id=self.node_id,
            app_name=self.app_name,
            user_id=self.user_id,
            session_id=self.session_id,
            parent=self.parent,
            phase=self.phase,
            id_prefix=self.id_prefix,
            min_age=self.min_age,
            max_age=self.max_age,
        )


def _of_library(status: StatusFilter) -> RunStatus | Literal["active", "finished", "all"]:
    """The status filter as the library takes it: a group's name, or one status."""
    if status == "active" or status == "finished" or status == "all":  # noqa: PLR1714 (narrows)
        return status
    return RunStatus(status)
