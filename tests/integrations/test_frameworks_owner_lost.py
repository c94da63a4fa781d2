"""A replica running an agno, a google-adk and a pydantic-ai run is killed (SIGKILL): a cancel on
another replica, each the framework's way, learns that the owner died, and each run's record ends
``owner_lost`` once the replica's lease expired."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from cancel_bus import CancelBus, RunStatus

from ..helpers import WAIT
from .replica import Replica
from .story_support import APP, USER
from .test_agno_replicas import AgnoRuns
from .test_google_adk_replicas import AdkRuns, Invocation, record


@pytest.fixture
def namespace(replica_namespace: str) -> str:
    return replica_namespace


async def test_runs_of_a_killed_replica_end_owner_lost(
    http: httpx.AsyncClient,
    frameworks_replicas: list[Replica],
    frameworks_victim: Replica,
    ops: CancelBus,
) -> None:
    replicas = [frameworks_victim, frameworks_replicas[1]]  # A: the victim; B: a live replica
    agno, adk = AgnoRuns(http, replicas, APP, USER), AdkRuns(http, replicas, "story", USER)
    agno_session, agno_run = await agno.run()
    pai_session = f"pai-lost-{uuid.uuid4().hex[:8]}"
    pai_run = await agno.start("pydantic-ai", pai_session, api="run_stream_events")
    invocation = Invocation(http, frameworks_victim, "story", f"adk-lost-{uuid.uuid4().hex[:8]}")
    adk_run = (await record(ops, invocation)).run_id
    for session in (agno_session, pai_session):
        await agno.streaming(session)
    await asyncio.wait_for(invocation.streaming.wait(), WAIT)

    frameworks_victim.kill()

    answers = await asyncio.gather(
        adk.http.post(
            f"{adk.b.url}/apps/story/users/{USER}/sessions/{invocation.session}/cancel",
            json={"wait": True, "timeout": WAIT},
        ),
        adk.post(
            adk.b,
            "/bus/cancel",
            {"app": APP, "user": USER, "session": pai_session, "wait": True, "timeout": WAIT},
        ),
        agno.agno_cancel("other", agno_run),  # recorded: within the lease it was running
    )
    assert (answers[0].status_code, answers[0].json()["outcome"]) == (200, "owner_lost")
    assert answers[1]["outcome"] == "owner_lost"
    for run_id in (agno_run, pai_run, adk_run):
        final = await ops.wait(run_id, timeout=WAIT)
        assert final is not None
        assert (final.status, final.end_reason) == (RunStatus.CANCELLED, "owner_lost")
    invocation.task.cancel()  # its stream died with the replica
    await asyncio.gather(invocation.task, return_exceptions=True)
