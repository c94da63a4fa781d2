"""The test side of the replicas' control routes (see replica_routes.py): start a run on
replica A, cancel it from A (its owner) or B (another replica), open its gates, read its result."""

from __future__ import annotations

from typing import Any

import httpx

from cancel_bus import CancelBus

from ..helpers import eventually
from .replica import Replica

WHERE = ["owner", "other"]


class ReplicaRuns:
    """Runs of the app ``app`` for the user ``user`` on replicas A and B."""

    def __init__(
        self, http: httpx.AsyncClient, replicas: list[Replica], app: str, user: str
    ) -> None:
        self.http = http
        self.a, self.b = replicas
        self.app, self.user = app, user

    def at(self, where: str) -> Replica:
        return self.a if where == "owner" else self.b

    async def post(self, replica: Replica, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self.http.post(f"{replica.url}{path}", json=body or {})
        response.raise_for_status()
        return response.json()

    async def start(self, framework: str, session: str, **options: Any) -> str:
        """Start a run on A; its bus run id, once the framework was called (inside the run)."""
        body = {"session": session, **options}
        run_id: str = (await self.post(self.a, f"/{framework}/runs", body))["run_id"]
        return run_id

    async def cancel(self, where: str, session: str, mode: str) -> str:
        """``bus.cancel_session`` on a replica, without waiting; its outcome."""
        body = {"app": self.app, "user": self.user, "session": session, "mode": mode}
        outcome: str = (await self.post(self.at(where), "/bus/cancel", {**body, "wait": False}))[
            "outcome"
        ]
        return outcome

    async def open(self, gate: str) -> None:
        await self.post(self.a, f"/gates/{gate}")

    async def streaming(self, session: str) -> None:
        """Until the user's code on A has the run's first text."""
        await self.post(self.a, f"/runs/{session}/streaming")

    async def result(self, session: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.post(self.a, f"/runs/{session}/result")
        return result


async def delivered(ops: CancelBus, run_id: str) -> None:
    """Until the cancel has reached the run's owner."""

    async def check() -> bool:
        run = await ops.get_run(run_id)
        return run is not None and run.cancel_delivered_at is not None

    await eventually(check)
