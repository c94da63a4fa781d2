"""Which runs match: one matcher for every list of runs (the bus's ``list_runs``, the node's
``GET /v1/runs``, its dashboard and CLI), and the order they are listed in."""

from __future__ import annotations

from dataclasses import dataclass

from ._types import ACTIVE_STATUSES, RunInfo, StatusFilter


@dataclass(frozen=True, slots=True)
class RunFilter:
    """Each criterion given must match. ``status``: ``active``, ``finished``, ``all`` or one
    status; ``phase`` matches the phase or its kind (``tool`` matches ``tool:search``); ages are
    seconds since the run's creation, on the clock given to :meth:`matches`."""

    status: StatusFilter = "active"
    node_id: str | None = None
    app_name: str | None = None
    user_id: str | None = None
    session_id: str | None = None
    parent: str | None = None
    phase: str | None = None
    id_prefix: str | None = None
    min_age: float | None = None
    max_age: float | None = None

    def matches(self, run: RunInfo, now: float | None = None) -> bool:
        """Whether ``run`` matches; ``now`` (server clock) is needed only for the ages."""
        age = None if now is None else now - run.created_at
        return (
            _status_matches(run, self.status)
            and (self.node_id is None or run.owner == self.node_id)
            and (self.app_name is None or run.app_name == self.app_name)
            and (self.user_id is None or run.user_id == self.user_id)
            and (self.session_id is None or run.session_id == self.session_id)
            and (self.parent is None or run.parent == self.parent)
            and (self.phase is None or _phase_matches(run.phase, self.phase))
            and (self.id_prefix is None or run.run_id.startswith(self.id_prefix))
            and (self.min_age is None or (age is not None and age >= self.min_age))
            and (self.max_age is None or (age is not None and age <= self.max_age))
        )


def recency(run: RunInfo) -> float:
    """When the run last changed state, as the indexes order runs: its end, else its creation."""
    return run.finished_at if run.finished_at is not None else run.created_at


def _status_matches(run: RunInfo, wanted: StatusFilter) -> bool:
    if wanted == "active":
        return run.status in ACTIVE_STATUSES
    if wanted == "finished":
        return run.status not in ACTIVE_STATUSES
    return wanted in ("all", run.status)


def _phase_matches(phase: str | None, wanted: str) -> bool:
    return phase is not None and (phase == wanted or phase.startswith(wanted + ":"))
