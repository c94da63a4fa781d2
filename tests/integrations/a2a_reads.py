"""The replicas' count of task-store reads, per task (both a2a-sdk lines): a request that names a
task has reached the handler once the store was read for it. The follow-up tests wait for that
count to grow before letting the running execution go on, on stock a2a-sdk and on the replicas
alike (no sleep)."""

from __future__ import annotations

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..helpers import eventually


def read_routes(reads: dict[str, int]) -> list[Route]:
    """``GET /test/reads/{task_id}``: how many times the store was read for the task."""

    async def count(request: Request) -> JSONResponse:
        return JSONResponse({"reads": reads.get(request.path_params["task_id"], 0)})

    return [Route("/test/reads/{task_id}", count, methods=["GET"])]


async def reads(http: httpx.AsyncClient, urls: list[str], task_id: str) -> int:
    """The task's store reads on all the servers at ``urls``."""
    total = 0
    for url in urls:
        response = await http.get(f"{url}/test/reads/{task_id}")
        response.raise_for_status()
        total += int(response.json()["reads"])
    return total


async def read_again(http: httpx.AsyncClient, urls: list[str], task_id: str, before: int) -> None:
    """Until the servers read the task's store more than ``before`` times."""

    async def grown() -> bool:
        return await reads(http, urls, task_id) > before

    await eventually(grown)
