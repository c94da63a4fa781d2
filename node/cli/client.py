"""A typed client of a node's HTTP API: each call answers the API's own model (node/schemas.py,
cancel_bus), parsed with pydantic, or raises :class:`NodeError` in one line. An answer that is
not the model the API documents comes from a server that is no cancel-bus node (a wrong URL, a
proxy's page): it is named as such here, the one place such an answer is caught."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, RootModel, ValidationError

from cancel_bus import RunInfo, RunStatus, Tombstone

from ..queries import WINDOW, RunQuery
from ..schemas import (
    CancelAnswer,
    CancelBody,
    EventList,
    NodeList,
    Problem,
    RunList,
    SelectorAnswer,
    SelectorCancel,
    TombstoneList,
)

HTTP_TIMEOUT = 10.0  # seconds for a node's answer (beyond what a cancel waits on purpose)
KEEPALIVE = 15.0  # node/sse.py's KEEPALIVE_SECONDS: a stream says something at least this often
Model = TypeVar("Model", bound=BaseModel)


class NodeError(Exception):
    """The node could not be reached, answered an error, or did not answer as a node."""


class Output(BaseModel):
    """A run's ``output`` event: text it emitted."""

    text: str


class Finished(BaseModel):
    """A run's ``run.finished`` event."""

    status: RunStatus
    end_reason: str | None = None


class Draining(BaseModel):
    """``node.draining``: the node stopped streaming the run, which goes on elsewhere."""

    run_id: str


class AppEvent(RootModel[dict[str, Any]]):
    """An event of the run's own code (``tool_call``, ...): its data."""


@dataclass(frozen=True)
class StreamEvent:
    """One event of a run's stream: its name, its relay entry's id, and what it says."""

    event: str
    id: str | None
    body: RunInfo | Output | Finished | Draining | AppEvent


STREAM_BODIES: dict[str, type[RunInfo | Output | Finished | Draining | Problem]] = {
    "run": RunInfo,
    "output": Output,
    "run.finished": Finished,
    "node.draining": Draining,
    "unavailable": Problem,
}


def run_path(run_id: str, suffix: str = "") -> str:
    """The API path of the run ``run_id`` (quoted), then ``suffix``: ``/v1/runs/<id>/cancel``."""
    return f"/v1/runs/{quote(run_id, safe='')}{suffix}"


class NodeClient:
    """The API of the node at ``url``; ``timeout``: seconds to wait for an answer."""

    def __init__(self, url: str, token: str | None = None, timeout: float = HTTP_TIMEOUT) -> None:
        self.url, self.timeout = url, timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._http.close()

    # -- runs -------------------------------------------------------------------------------

    def runs(self, query: RunQuery) -> RunList:
        """One page of the runs ``query`` asks for."""
        params = query.model_dump(mode="json", exclude_none=True)
        return self._ask("GET", "/v1/runs", RunList, params=params)

    def run(self, run_id: str) -> RunInfo | None:
        """The run, or None if the node has no such run (or not one this token may see)."""
        return self._ask_if_found("GET", run_path(run_id), RunInfo)

    def runs_starting(self, prefix: str, limit: int) -> list[RunInfo]:
        """Runs whose id starts with ``prefix``, of the most recent."""
        return self.runs(RunQuery(status="all", id_prefix=prefix, limit=limit)).runs

    def children(self, run_id: str) -> list[RunInfo]:
        """The runs started as children of ``run_id`` (at most :data:`WINDOW`)."""
        return self.runs(RunQuery(status="all", parent=run_id, limit=WINDOW)).runs

    def events(self, run_id: str) -> EventList:
        """The run's recorded events."""
        return self._ask("GET", run_path(run_id, "/events"), EventList)

    def follow(self, run_id: str) -> Generator[StreamEvent]:
        """The run's stream from now on: ``run`` (its record), its events, ``run.finished`` and
        ``run`` again; or ``node.draining`` when the node stops streaming it. It may stay
        silent between keep-alives: a read waits one keep-alive more than an answer."""
        timeout = KEEPALIVE + self.timeout
        path = run_path(run_id, "/stream")
        with (
            _Calling(self.url, timeout),
            self._http.stream("GET", path, timeout=timeout) as response,
        ):
            if response.status_code != 200:
                response.read()
                raise self._refused(response)
            kind = response.headers.get("content-type", "no content type")
            if not kind.startswith("text/event-stream"):
                response.read()
                raise self._stranger(response, f"{kind}, not an event stream")
            for name, event_id, data in server_sent(response.iter_lines()):
                yield self._stream_event(response, name, event_id, data)

    # -- cancels ----------------------------------------------------------------------------

    def cancel(self, run_id: str, body: CancelBody) -> CancelAnswer:
        """Cancel the run ``run_id`` as ``body`` asks; every outcome is an answer."""
        return self._cancel(run_path(run_id, "/cancel"), body)

    def cancel_session(self, app: str, user: str, session: str, body: CancelBody) -> CancelAnswer:
        """Cancel the session's active run as ``body`` asks; every outcome is an answer."""
        parts = "/".join(quote(part, safe="") for part in (app, user, session))
        return self._cancel(f"/v1/sessions/{parts}/cancel", body)

    def _cancel(self, path: str, body: CancelBody) -> CancelAnswer:
        """Every outcome is an answer: cancelled, owner_lost (200), stopping (202), not_found
        (404), already_finished (409)."""
        waits = body.timeout if body.wait else 0.0
        sent = body.model_dump(mode="json")
        return self._ask("POST", path, CancelAnswer, (200, 202, 404, 409), waits, json=sent)

    def cancel_where(self, body: SelectorCancel) -> SelectorAnswer:
        """The runs a selector matches (``dry_run``: a preview), or their cancels and the tombstones
        laid."""
        waits = body.timeout if body.wait and not body.dry_run else 0.0
        sent = body.model_dump(mode="json", exclude_none=True)
        return self._ask("POST", "/v1/cancel-where", SelectorAnswer, (200,), waits, json=sent)

    def tombstones(self) -> TombstoneList:
        """The live tombstones this token may see."""
        return self._ask("GET", "/v1/tombstones", TombstoneList)

    def remove_tombstone(self, tombstone_id: str) -> Tombstone | None:
        """The tombstone lifted, or None if none such is live."""
        path = f"/v1/tombstones/{quote(tombstone_id, safe='')}"
        return self._ask_if_found("DELETE", path, Tombstone)

    # -- ops --------------------------------------------------------------------------------

    def nodes(self) -> NodeList:
        """The live nodes and their leases (an ops token)."""
        return self._ask("GET", "/v1/nodes", NodeList)

    # -- HTTP -------------------------------------------------------------------------------

    def _ask(
        self,
        method: str,
        path: str,
        answer: type[Model],
        ok: tuple[int, ...] = (200,),
        waits: float = 0.0,
        **kwargs: Any,
    ) -> Model:
        """The answer (a status in ``ok``); any other status is an error with the node's
        message. ``waits``: seconds the node takes on purpose, on top of the timeout."""
        response = self._request(method, path, waits, **kwargs)
        if response.status_code not in ok:
            raise self._refused(response)
        return self._decoded(response, answer)

    def _ask_if_found(self, method: str, path: str, answer: type[Model]) -> Model | None:
        """:meth:`_ask`, with None for the node's 404 (a stray page's 404 is an error)."""
        response = self._request(method, path, 0.0)
        if response.status_code == 404:
            self._decoded(response, Problem)
            return None
        if response.status_code != 200:
            raise self._refused(response)
        return self._decoded(response, answer)

    def _request(self, method: str, path: str, waits: float, **kwargs: Any) -> httpx.Response:
        timeout = self.timeout + waits
        with _Calling(self.url, timeout):
            return self._http.request(method, path, timeout=timeout, **kwargs)

    def _refused(self, response: httpx.Response) -> NodeError:
        problem = self._decoded(response, Problem)
        return NodeError(f"{self.url} answered HTTP {response.status_code}: {problem.detail}")

    def _decoded(self, response: httpx.Response, answer: type[Model]) -> Model:
        try:
            return answer.model_validate(response.json())
        except ValidationError as exc:
            raise self._stranger(response, _first_error(exc)) from None
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise self._stranger(response, f"{kind}, not JSON: {response.text[:60]!r}") from None

    def _stream_event(
        self, response: httpx.Response, name: str, event_id: str | None, data: str
    ) -> StreamEvent:
        try:
            body = STREAM_BODIES.get(name, AppEvent).model_validate(json.loads(data))
        except ValidationError as exc:
            raise self._stranger(response, f"event {name}: {_first_error(exc)}") from None
        except ValueError:
            raise self._stranger(response, f"event {name}: not JSON: {data[:60]!r}") from None
        if isinstance(body, Problem):  # unavailable: Redis went away, or the run's records
            raise NodeError(f"{self.url} stopped streaming: {body.detail}")
        return StreamEvent(name, event_id, body)

    def _stranger(self, response: httpx.Response, why: str) -> NodeError:
        request = response.request
        return NodeError(
            f"{self.url} did not answer as a cancel-bus node (HTTP {response.status_code} to "
            f"{request.method} {request.url.path}: {why})"
        )


class _Calling:
    """Turns httpx's failures into one-line :class:`NodeError` s."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.timeout = url, timeout

    def __enter__(self) -> None:
        pass

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, httpx.TimeoutException):
            raise NodeError(f"{self.url} did not answer within {self.timeout:g} s") from None
        if isinstance(exc, httpx.HTTPError):
            raise NodeError(f"cannot reach {self.url}: {exc or type(exc).__name__}") from None


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']}"


def server_sent(lines: Iterable[str]) -> Iterator[tuple[str, str | None, str]]:
    """The events of a ``text/event-stream`` (its name, id and data); comments (keep-alives)
    are skipped."""
    name, event_id, data = "message", None, list[str]()
    for line in lines:
        if not line:
            if data:
                yield name, event_id, "\n".join(data)
            name, event_id, data = "message", None, []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "id":
            event_id = value
        elif field == "data":
            data.append(value)
