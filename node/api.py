"""The /v1 HTTP API: start, stream, cancel and inspect runs across the cluster."""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from cancel_bus import (
    ID_PATTERN,
    MAX_ID_LENGTH,
    CancelBus,
    CancelResult,
    Outcome,
    RunCancelled,
    RunInfo,
    StopCause,
    Tombstone,
)

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
    SelectedRun,
    SelectorAnswer,
    SelectorCancel,
    StartRun,
    TombstoneList,
    ValidationProblem,
)
from .service import NodeService

router = APIRouter(prefix="/v1", tags=["runs"])

IdPath = Annotated[str, Path(pattern=ID_PATTERN, max_length=MAX_ID_LENGTH)]
OUTCOME_STATUS = {
    Outcome.CANCELLED: 200,
    Outcome.OWNER_LOST: 200,
    Outcome.STOPPING: 202,
    Outcome.NOT_FOUND: 404,
    Outcome.ALREADY_FINISHED: 409,
}
NOT_FOUND = CancelResult(outcome=Outcome.NOT_FOUND, run=None)
# Live tombstones one user token may hold: a namespace holds at most 1,000, for every caller.
MAX_USER_TOMBSTONES = 16
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


# 400: a body JSON cannot parse (malformed, not UTF-8, nested too deep, an integer of 4,300+
# digits); 413: a body larger than CANCEL_BUS_MAX_BODY_BYTES; 422: JSON that is not what the
# route takes; 503: Redis unreachable (or, to start a run, the node draining)
BODY_ERRORS = (400, 413, 422, 503)
CANCEL_ANSWERS: Responses = {
    **errors(*BODY_ERRORS),
    200: {"model": CancelAnswer, "description": "cancelled, or owner_lost"},
    202: {"model": CancelAnswer, "description": "stopping: recorded, not yet confirmed"},
    404: {"model": CancelAnswer, "description": "not_found"},
    409: {"model": CancelAnswer, "description": "already_finished"},
}


async def node_of(request: Request) -> NodeService:
    """The app's :class:`NodeService` (the ``Node`` dependency of every route)."""
    node: NodeService = request.app.state.node
    return node


Node = Annotated[NodeService, Depends(node_of)]
CancelBodyIn = Annotated[CancelBody | None, Body()]


START_ERRORS = errors(
    403,
    404,
    409,
    *BODY_ERRORS,
    e403="a user token starting a run as another user",
    e404="the parent run given does not exist (another user's answers the same)",
    e409="the session has an active run, the run id given cannot be used, or the run was "
    "cancelled at its start (its parent's cancel, or a tombstone)",
    e503="Redis is unreachable, or this node is draining (another replica takes it)",
)


@router.post("/runs", status_code=201, response_model=RunInfo, responses=START_ERRORS)
async def start_run(body: StartRun, node: Node, principal: CurrentPrincipal) -> RunInfo:
    """Start a run of the simulated agent on this node. A ``run_id`` given must be new, or name
    a queued run of the same app, user and session (it is claimed); any other is a 409 that
    says nothing of the run. With a ``parent`` (a run the caller may see), it is that run's
    child: cancelling the parent cancels it, and once the parent's cancel is accepted (or a
    tombstone matches it) it is recorded cancelled at its start, a 409 naming it."""
    return await _start(node, principal, body)


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
    info = await _start(node, principal, body)
    bus = node.bus_for_app(body.app_name)
    return sse.run_stream(
        bus,
        info,
        node.streams,
        from_start=True,
        on_disconnect=lambda: node.cancel_soon(bus, info.run_id, "client_disconnected"),
    )


@router.get(
    "/runs/{run_id}/stream",
    response_class=sse.EventStream,
    status_code=200,
    responses={**errors(404, 422, 503), **sse.SSE_OK},
)
async def follow_run(
    run_id: IdPath,
    node: Node,
    principal: CurrentPrincipal,
    from_start: Annotated[
        bool,
        Query(
            description="from the run's first output on (as much as its relay keeps), not "
            "from now on"
        ),
    ] = False,
) -> sse.EventStream:
    """Follow a run's events from now on (or ``from_start``), whichever node runs it."""
    bus, run = await _visible_run(node, principal, run_id)
    return sse.run_stream(bus, run, node.streams, from_start=from_start, closing=node.drain_started)


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
    take (session, phase, id prefix, age) look through the 1,000 most recent runs; a
    parent's children are read as such."""
    return await runs_for(node, principal, query)


def check_window(query: RunQuery) -> None:
    """A page must lie within the runs a list looks through: a 422 otherwise."""
    if query.offset + query.limit > WINDOW:
        invalid(("query", "offset"), f"offset + limit must be at most {WINDOW}")


def invalid(loc: tuple[str, str], msg: str) -> NoReturn:
    """A 422, as a field the schema itself refused."""
    raise RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error"}])


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


@router.post("/cancel-where", response_model=SelectorAnswer, responses=errors(*BODY_ERRORS))
async def cancel_where(
    body: SelectorCancel, node: Node, principal: CurrentPrincipal
) -> SelectorAnswer:
    """Every active run that matches the selector, from any node: a preview unless
    ``"dry_run": false`` (the count and the ids), then the cancel of each (with the runs below
    it), and with ``ttl`` or ``until`` a tombstone that cancels matching runs started later. A
    user token's selector is confined to its own runs."""
    at = node.bus.clock()
    if not principal.is_ops:
        if body.user_id not in (None, principal.user_id):
            return SelectorAnswer(
                matched=0, run_ids=[], dry_run=body.dry_run, results=[], tombstones=[], at=at
            )
        body = body.model_copy(update={"user_id": principal.user_id})
        holds = body.ttl is not None or body.until is not None
        if holds and not body.dry_run:
            held = await tombstones_for(node, principal)
            if len(held) >= MAX_USER_TOMBSTONES:
                invalid(
                    ("body", "ttl" if body.ttl is not None else "until"),
                    f"a user token holds at most {MAX_USER_TOMBSTONES} live tombstones: "
                    "remove some first",
                )
    answers = await node.cancel_where(body, principal.name)
    return SelectorAnswer(
        matched=sum(answer.matched for answer in answers),
        run_ids=[run_id for answer in answers for run_id in answer.run_ids],
        dry_run=body.dry_run,
        results=[
            SelectedRun.of(result, run_id)
            for answer in answers
            if not answer.dry_run
            for run_id, result in zip(answer.run_ids, answer.results, strict=True)
        ],
        tombstones=[answer.tombstone for answer in answers if answer.tombstone is not None],
        at=at,
    )


@router.get("/tombstones", response_model=TombstoneList, responses=errors(503))
async def list_tombstones(node: Node, principal: CurrentPrincipal) -> TombstoneList:
    """The live tombstones of selector cancels, soonest to expire first: every one for an ops
    token, those it laid for a user token."""
    return TombstoneList(tombstones=await tombstones_for(node, principal), at=node.bus.clock())


async def tombstones_for(node: NodeService, principal: Principal) -> list[Tombstone]:
    """The live tombstones ``principal`` may see (and remove)."""
    return [
        tombstone for _, tombstone in await node.tombstones() if principal.may_manage(tombstone)
    ]


@router.delete(
    "/tombstones/{tombstone_id}",
    response_model=Tombstone,
    responses=errors(404, 422, 503, e404="no such live tombstone (another's answers the same)"),
)
async def remove_tombstone(
    tombstone_id: IdPath, node: Node, principal: CurrentPrincipal
) -> Tombstone:
    """Lift a tombstone (runs started from now on are no longer held); answers it."""
    for bus, tombstone in await node.tombstones():
        if tombstone.tombstone_id == tombstone_id and principal.may_manage(tombstone):
            if await bus.remove_tombstone(tombstone_id):
                return tombstone
            break  # it expired meanwhile
    raise HTTPException(status_code=404, detail=f"no live tombstone {tombstone_id}")


async def _start(node: NodeService, principal: Principal, body: StartRun) -> RunInfo:
    if not principal.may_act_for(body.user_id):
        raise HTTPException(status_code=403, detail="a user token may start runs only as itself")
    if node.draining:
        raise HTTPException(status_code=503, detail="this node is draining")
    if body.parent is not None:
        await _check_parent(node, principal, body.parent, body.app_name)
    try:
        return await node.start_run(body)
    except RunCancelled as exc:
        if body.run_id is not None:
            raise  # it may be another's run: the one answer for a run id that cannot be used
        parent = exc.request is not None and exc.request.cause is StopCause.PARENT
        why = "its parent's cancel was accepted" if parent else "a tombstone holds runs like it"
        detail = f"run {exc.run_id} was cancelled at its start: {why}"
        raise HTTPException(status_code=409, detail=detail) from None


async def _check_parent(
    node: NodeService, principal: Principal, parent: str, app_name: str
) -> None:
    """A parent must be a run the caller may see, in the namespace of the child's app."""
    found = await node.find_run(parent)
    if found is None or not principal.may_see(found[1]):
        raise HTTPException(status_code=404, detail=f"parent run {parent} not found")
    if found[0] is not node.bus_for_app(app_name):
        invalid(("body", "parent"), f"the parent run is in another namespace than app {app_name}'s")


async def _visible_run(
    node: NodeService, principal: Principal, run_id: str
) -> tuple[CancelBus, RunInfo]:
    found = await node.find_run(run_id)
    if found is None or not principal.may_see(found[1]):
        raise HTTPException(status_code=404, detail=f"run {run_id} not found")
    return found


def _cancel_response(result: CancelResult) -> JSONResponse:
    body = CancelAnswer.of(result)
    return JSONResponse(
        status_code=OUTCOME_STATUS[result.outcome], content=body.model_dump(mode="json")
    )
