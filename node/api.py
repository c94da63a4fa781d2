"""The /v1 HTTP API: start, stream, cancel and inspect runs across the cluster."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from cancel_bus import ID_PATTERN, CancelBus, CancelResult, Outcome, RunInfo

from . import sse
from .auth import CurrentPrincipal, OpsPrincipal, Principal
from .queries import WINDOW, RunQuery
from .schemas import (
    CancelAnswer,
    CancelBody,
    EventList,
    NodeList,
    Problem,
    RunList,
    StartRun,
    ValidationProblem,
)
from .service import NodeService

router = APIRouter(prefix="/v1", tags=["runs"])

IdPath = Annotated[str, Path(pattern=ID_PATTERN, max_length=200)]
OUTCOME_STATUS = {
    Outcome.CANCELLED: 200,
    Outcome.OWNER_LOST: 200,
    Outcome.STOPPING: 202,
    Outcome.NOT_FOUND: 404,
    Outcome.ALREADY_FINISHED: 409,
}
NOT_FOUND = CancelResult(outcome=Outcome.NOT_FOUND, run=None)
Responses = dict[int | str, dict[str, Any]]


ERRORS = {
    400: "the body is not JSON that can be parsed",
    401: "a bearer token is needed (API tokens are configured) and none valid was given",
    403: "this needs an ops token",
    404: "no such run (another user's run answers the same)",
    413: "the request body is larger than CANCEL_BUS_MAX_BODY_BYTES",
    422: "invalid input: where and what, in one line and field by field (never echoed)",
    503: "Redis is unreachable",
}


def errors(*codes: int, **descriptions: str) -> Responses:
    """The error answers of a route that needs a token: 401, and ``codes``, described as in
    :data:`ERRORS` unless ``descriptions`` says otherwise (``e409="..."``). 422 is a
    :class:`ValidationProblem`, every other one a :class:`Problem`."""
    return {
        code: {
            "model": ValidationProblem if code == 422 else Problem,
            "description": descriptions.get(f"e{code}") or ERRORS[code],
        }
        for code in (401, *codes)
    }


# 400: a body JSON cannot parse (not UTF-8, nested too deep, an integer of 4,300+ digits);
# 413: a body larger than CANCEL_BUS_MAX_BODY_BYTES; 422: bad input; 503: Redis unreachable
# (or, to start a run, the node draining)
BODY_ERRORS = (400, 413, 422, 503)
CANCEL_ANSWERS: Responses = {
    **errors(*BODY_ERRORS),
    200: {"model": CancelAnswer, "description": "cancelled, or owner_lost"},
    202: {"model": CancelAnswer, "description": "stopping: recorded, not yet confirmed"},
    404: {"model": CancelAnswer, "description": "not_found"},
    409: {"model": CancelAnswer, "description": "already_finished"},
}


async def node_of(request: Request) -> NodeService:
    node: NodeService = request.app.state.node
    return node


Node = Annotated[NodeService, Depends(node_of)]
CancelBodyIn = Annotated[CancelBody | None, Body()]


START_ERRORS = errors(
    403,
    409,
    *BODY_ERRORS,
    e403="a user token starting a run as another user",
    e409="the session has an active run, or the run id given cannot be used",
    e503="Redis is unreachable, or this node is draining (another replica takes it)",
)


@router.post("/runs", status_code=201, response_model=RunInfo, responses=START_ERRORS)
async def start_run(body: StartRun, node: Node, principal: CurrentPrincipal) -> RunInfo:
    """Start a run of the simulated agent on this node. A ``run_id`` given must be new, or name
    a queued run of the same app, user and session (it is claimed); any other is a 409 that
    says nothing of the run."""
    _may_start(principal, body, node)
    return await node.start_run(body)


@router.post(
    "/runs/stream",
    response_class=sse.EventStream,
    status_code=200,
    responses={**START_ERRORS, **sse.SSE_OK},
)
async def start_run_streaming(
    body: StartRun, node: Node, principal: CurrentPrincipal
) -> sse.EventStream:
    """Start a run and stream it; closing the stream before the run ends cancels the run."""
    _may_start(principal, body, node)
    info = await node.start_run(body)
    bus = node.bus_for_app(body.app_name)
    return sse.run_stream(
        bus,
        info,
        node.metrics.open_streams,
        from_start=True,
        on_disconnect=lambda: node.cancel_soon(bus, info.run_id, "client_disconnected"),
    )


@router.get(
    "/runs/{run_id}/stream",
    response_class=sse.EventStream,
    status_code=200,
    responses={**errors(404, 422, 503), **sse.SSE_OK},
)
async def follow_run(run_id: IdPath, node: Node, principal: CurrentPrincipal) -> sse.EventStream:
    """Follow a run's events from now on, whichever node runs it."""
    bus, run = await _visible_run(node, principal, run_id)
    return sse.run_stream(
        bus, run, node.metrics.open_streams, from_start=False, closing=node.drain_started
    )


@router.post("/runs/{run_id}/cancel", response_model=CancelAnswer, responses=CANCEL_ANSWERS)
async def cancel_run(
    run_id: IdPath, node: Node, principal: CurrentPrincipal, body: CancelBodyIn = None
) -> JSONResponse:
    """Cancel a run from any node: 200 cancelled/owner_lost, 202 stopping, 404, 409 finished."""
    if principal.is_ops and len(node.buses) == 1:
        bus = node.bus  # no lookup needed: the cancel itself says not_found
    else:
        found = await node.find_run(run_id)
        if found is None or not principal.may_see(found[1]):
            return _cancel_response(NOT_FOUND)
        bus = found[0]
    result = await node.cancel(bus, run_id, body or CancelBody(), principal.name)
    return _cancel_response(result)


@router.post(
    "/sessions/{app_name}/{user_id}/{session_id}/cancel",
    response_model=CancelAnswer,
    responses=CANCEL_ANSWERS,
)
async def cancel_session(
    app_name: IdPath,
    user_id: IdPath,
    session_id: IdPath,
    node: Node,
    principal: CurrentPrincipal,
    body: CancelBodyIn = None,
) -> JSONResponse:
    """Cancel the active run of a session key, wherever it runs."""
    if not principal.may_act_for(user_id):
        return _cancel_response(NOT_FOUND)
    session = (app_name, user_id, session_id)
    result = await node.cancel_session(session, body or CancelBody(), principal.name)
    return _cancel_response(result)


@router.get("/runs", response_model=RunList, responses=errors(422, 503))
async def list_runs(
    query: Annotated[RunQuery, Query()], node: Node, principal: CurrentPrincipal
) -> RunList:
    """Runs across the cluster, the most recent first: an active run by its creation, a
    finished one by its end (a user token sees only its own). Filters the library does not
    take (session, phase, id prefix, age) look through the 1,000 most recent runs."""
    return await runs_for(node, principal, query)


def check_window(query: RunQuery) -> None:
    """A page must lie within the runs a list looks through: a 422 otherwise."""
    if query.offset + query.limit > WINDOW:
        problem = {
            "loc": ("query", "offset"),
            "msg": f"offset + limit must be at most {WINDOW}",
            "type": "value_error",
        }
        raise RequestValidationError([problem])


async def runs_for(node: NodeService, principal: Principal, query: RunQuery) -> RunList:
    """The page of runs ``query`` asks for, of those ``principal`` may see."""
    check_window(query)
    at = node.bus.clock()
    if not principal.is_ops:
        if query.user_id not in (None, principal.user_id):
            return RunList(runs=[], more=False, at=at)
        query = query.model_copy(update={"user_id": principal.user_id})
    runs, more = await node.query_runs(query)
    return RunList(runs=runs, more=more, at=at)


@router.get("/runs/{run_id}", response_model=RunInfo, responses=errors(404, 422, 503))
async def get_run(run_id: IdPath, node: Node, principal: CurrentPrincipal) -> RunInfo:
    """One run: status, owner, phase, the cancel's timestamps, output, end reason."""
    _, run = await _visible_run(node, principal, run_id)
    return run


@router.get("/runs/{run_id}/events", response_model=EventList, responses=errors(404, 422, 503))
async def run_events(run_id: IdPath, node: Node, principal: CurrentPrincipal) -> EventList:
    """The run's lifecycle: started, cancel requested/delivered, finished..."""
    bus, _ = await _visible_run(node, principal, run_id)
    return EventList(events=await bus.events(run_id), at=bus.clock())


@router.get("/nodes", response_model=NodeList, responses=errors(403, 503), tags=["ops"])
async def list_nodes(node: Node, principal: OpsPrincipal) -> NodeList:
    """The live nodes, by id, each with the state of its lease (a dying node is ``late``)."""
    return NodeList(nodes=await node.list_nodes(), at=node.bus.clock())


def _may_start(principal: Principal, body: StartRun, node: NodeService) -> None:
    if not principal.may_act_for(body.user_id):
        raise HTTPException(status_code=403, detail="a user token may start runs only as itself")
    if node.draining:
        raise HTTPException(status_code=503, detail="this node is draining")


async def _visible_run(
    node: NodeService, principal: Principal, run_id: str
) -> tuple[CancelBus, RunInfo]:
    found = await node.find_run(run_id)
    if found is None or not principal.may_see(found[1]):
        raise HTTPException(status_code=404, detail=f"run {run_id} not found")
    return found


def _cancel_response(result: CancelResult) -> JSONResponse:
    body = CancelAnswer(outcome=result.outcome, run=result.run)
    return JSONResponse(
        status_code=OUTCOME_STATUS[result.outcome], content=body.model_dump(mode="json")
    )
