"""Typed calls of the Lua scripts: each call's arguments by name, its JSON answer decoded, and the
result codes no caller acts on turned into errors here, in one place (``Fenced``, ``SessionBusy``,
``RunExists``, ``RunCancelled``; ``missing``: Redis forgot this node, which re-registers within a
beat — :class:`BusUnavailable` until then). The calls of one script made together leave as one
batch (``_batcher.py``); on a signed bus, the notices a script kept are sealed and sent here.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Protocol

from ._errors import BusUnavailable, Fenced, Queued, RunExists, SessionBusy
from ._keys import KeySpace
from ._messages import MessageKind
from ._protocol import (
    CancelAnswer,
    CancelOrder,
    Code,
    Finish,
    Finished,
    Reasserted,
    Record,
    SyncItem,
)
from ._redis import translate, translated
from ._run_state import RunCancelled
from ._types import CancelMode, RunInfo, RunStatus, StopCause


class Batches(Protocol):
    """Where calls leave in batches (``_batcher.ScriptBatcher``)."""

    async def call(
        self, name: str, keys: list[str], args: dict[str, Any], timeout: float | None = None
    ) -> Any: ...

    def submit(
        self, name: str, keys: list[str], args: dict[str, Any], timeout: float | None = None
    ) -> asyncio.Future[Any]: ...


class Publisher(Protocol):
    """Where a signed bus's notices are sealed and sent (``_notices.Notices``)."""

    @property
    def script_pub(self) -> str: ...

    async def publish(self, notices: Sequence[Sequence[str]]) -> dict[str, list[int]]: ...


class ScriptCalls:
    """``batches``: where the calls leave (one batch per script per turn); ``notices``: where a
    signed bus's notices are sealed and sent (and what scripts are told to notify with)."""

    def __init__(
        self, batches: Batches, keys: KeySpace, *, retention: float, notices: Publisher
    ) -> None:
        self.keys = keys
        self.retention_ms = int(retention * 1000)
        self._notices = notices
        self._pub = notices.script_pub
        self._batcher = batches

    async def _call(
        self, name: str, key: str, args: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        with translated(name):
            answer: dict[str, Any] = json.loads(
                await self._batcher.call(name, [key], args, timeout)
            )
        return answer

    async def _call_notifying(
        self, name: str, key: str, args: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, list[int]]]:
        """A script that may notify nodes: -> its answer, and by kind of message the receivers of
        each notice sent here (none when the script published them itself)."""
        answer = await self._call(name, key, {**args, "pub": self._pub})
        notices = answer.get("notices")
        return answer, (await self._notices.publish(notices) if notices else {})

    # -- nodes --------------------------------------------------------------------------------

    async def register_node(
        self, node_id: str, lease_ttl: float, step: float, version: str, epoch: str,
        restore: bool,
    ) -> tuple[Code, float]:  # fmt: skip
        """-> (ok | in_use | busy | fenced (restore refused), server time)."""
        answer, _ = await self._call_notifying(
            "register_node",
            self.keys.node(node_id),
            {
                "node_id": node_id, "epoch": epoch, "lease_ms": _ms(lease_ttl),
                "step_ms": _ms(step), "version": version,
                "retention_ms": self.retention_ms, "restore": restore,
            },
        )  # fmt: skip
        return Code(answer["code"]), float(answer["now"])

    async def heartbeat(
        self,
        node_id: str,
        epoch: str,
        lease_ttl: float,
        step: float,
        probe: tuple[float, float] | None = None,
        draining: bool = False,
    ) -> tuple[Code, float, int]:
        """-> (ok | fenced | missing, server time, runs recorded for the node). ``step``: the
        most this beat advances the lease clock (the node's patience); ``draining``: the node
        says it takes no new runs. ``probe``: when
        its last probe of its own channel came back (server clock), and how long it took (s)."""
        probe_at, probe_s = ("", "") if probe is None else (f"{probe[0]:.6f}", f"{probe[1]:.6f}")
        answer = await self._call(
            "heartbeat",
            self.keys.node(node_id),
            {
                "node_id": node_id, "epoch": epoch, "lease_ms": _ms(lease_ttl),
                "step_ms": _ms(step), "probe_at": probe_at, "probe_s": probe_s,
                "draining": draining,
            },
        )  # fmt: skip
        return Code(answer["code"]), float(answer["now"]), int(answer.get("runs", 0))

    async def reap(self, budget: int) -> tuple[int, int, bool]:
        """-> (runs resolved, nodes reaped, more expired nodes left)."""
        answer, _ = await self._call_notifying(
            "reap", self.keys.nodes, {"budget": budget, "retention_ms": self.retention_ms}
        )
        return int(answer["resolved"]), int(answer["reaped"]), bool(answer["more"])

    async def leave_node(self, node_id: str, epoch: str) -> tuple[Code, bool]:
        """-> (ok | fenced, done: every run of the node resolved)."""
        answer, _ = await self._call_notifying(
            "leave_node",
            self.keys.node(node_id),
            {"node_id": node_id, "epoch": epoch, "retention_ms": self.retention_ms},
        )
        return Code(answer["code"]), bool(answer.get("done"))

    # -- runs ---------------------------------------------------------------------------------

    async def start_run(
        self,
        run_id: str,
        node_id: str,
        epoch: str,
        session: tuple[str, str, str] | None,
        metadata: dict[str, Any] | None,
        relay: bool,
        parent: str | None = None,
        queue: bool = False,
        interrupted: str | None = None,
    ) -> Record:
        """The run's record, registered (or claimed) as this incarnation's. Raises
        :class:`Fenced`, :class:`BusUnavailable` (Redis forgot this node), :class:`SessionBusy`,
        :class:`RunExists`, or :class:`RunCancelled` for a run that must not start (its parent's
        cancel, a tombstone). With ``queue``, a busy session's run is recorded queued behind
        its active run, or still waits there: :class:`Queued`."""
        app, user, sess = session or ("", "", "")
        answer, _ = await self._call_notifying(
            "start_run",
            self.keys.run(run_id),
            {
                "run_id": run_id, "node_id": node_id, "epoch": epoch, "app_name": app,
                "user_id": user, "session_id": sess, "metadata": _json_or_empty(metadata),
                "relay": relay, "parent": parent or "", "retention_ms": self.retention_ms,
                "queue": queue, "interrupted": interrupted or "",
            },
        )  # fmt: skip
        code = _refused(answer, f"node {node_id}")
        if code is Code.SESSION_BUSY:
            assert session is not None
            raise SessionBusy(session, answer["holder"])
        if code is Code.QUEUED:
            assert session is not None
            raise Queued(session, answer["holder"], answer["run"])
        record: Record = answer["run"]
        if code is Code.CANCELLED:  # its parent's cancel, or a tombstone: it never starts
            raise RunCancelled(run_id, RunInfo.from_redis(record).cancel_request)
        if code is Code.EXISTS:
            run = RunInfo.from_redis(record)
            if run.status is RunStatus.CANCELLED and run.started_at is None:
                raise RunCancelled(run.run_id, run.cancel_request)
            raise RunExists(run.run_id, run.status.value)
        return record

    async def enqueue_run(
        self,
        run_id: str,
        session: tuple[str, str, str] | None,
        metadata: dict[str, Any] | None,
        parent: str | None = None,
        request_id: str | None = None,
        queue: bool = False,
        interrupted: str | None = None,
    ) -> RunInfo:
        """The queued run (or, if it must never start — its parent's cancel, a tombstone — the
        run recorded cancelled at once); :class:`SessionBusy`, :class:`RunExists` if taken.
        With ``queue``, a busy session's run waits last in the session's queue instead."""
        app, user, sess = session or ("", "", "")
        answer = await self._call(
            "enqueue_run",
            self.keys.run(run_id),
            {
                "run_id": run_id, "app_name": app, "user_id": user, "session_id": sess,
                "metadata": _json_or_empty(metadata), "parent": parent or "",
                "retention_ms": self.retention_ms,
                "request": request_id or secrets.token_hex(12),
                "queue": queue, "interrupted": interrupted or "",
            },
        )  # fmt: skip
        code = Code(answer["code"])
        if code is Code.SESSION_BUSY:
            assert session is not None
            raise SessionBusy(session, answer["holder"])
        if code is Code.EXISTS:
            raise RunExists(run_id, answer["status"])
        return RunInfo.from_redis(answer["run"])

    async def request_cancel(
        self, order: CancelOrder, *, waiter: str, caller: str, request_id: str | None = None
    ) -> CancelAnswer:
        """The run (or the session's active run) and, with ``order.tree``, every run started
        below it: cancel requests recorded, owners told; ``waiter``: the node to ring at its end
        (``''``: none). The answer lists the descendants deepest first; ``recovering``: not
        found, but Redis lost the namespace's data lately (ask again). The call carries a
        request id (fresh unless given): if redis-py sends it again after its answer was lost,
        the script answers for the run the first send reached, as it now stands."""
        if order.run_id is not None:
            key = self.keys.run(order.run_id)
        else:
            key = self.keys.session(*(order.session or ("", "", "")))
        answer, sent = await self._call_notifying(
            "request_cancel",
            key,
            {
                "target": order.target, "run_id": order.run_id or "", "mode": order.mode.value,
                "reason": order.reason or "", "requested_by": order.requested_by or "",
                "waiter": waiter, "caller": caller, "retention_ms": self.retention_ms,
                "cause": order.cause.value, "tree": order.tree,
                "traceparent": order.traceparent,
                "request": request_id or secrets.token_hex(12),
            },
        )  # fmt: skip
        code = Code(answer["code"])
        below = [
            (str(entry["run_id"]), Code(entry["code"]), _run_or_none(entry.get("run")))
            for entry in _listed(answer.get("below"))
        ]
        scripted = [int(answer.get("receivers", -1))]
        scripted += [int(entry.get("receivers", -1)) for entry in _listed(answer.get("below"))]
        # receivers of each cancel message: sent here (sealed), else by the script
        heard = sent.get(MessageKind.CANCEL) or scripted
        return CancelAnswer(
            code,
            _run_or_none(answer.get("run")),
            sum(heard) if MessageKind.CANCEL in sent else scripted[0],
            below,
            bool(answer.get("truncated")),
            unheard=heard.count(0),
        )

    async def finish_runs(
        self, finishes: Sequence[Finish], timeout: float | None = None
    ) -> list[Finished | BaseException]:
        """Many runs' ends at once (a chunk of a burst): queued together, they leave in as few
        batches as the batcher allows; -> each one's answer or error (``missing``: Redis forgot
        this node, :class:`BusUnavailable` until it re-registers). A run whose record Redis lost
        is written again with the owner's ``record``. ``timeout``: for Redis's answer, from when
        the batch leaves (a finish is safe to repeat)."""
        answers = await self._finish_calls(finishes, [""] * len(finishes), timeout)
        lost = [
            i
            for i, a in enumerate(answers)
            if isinstance(a, Finished) and a.code is Code.RECORD_LOST
        ]
        if lost:
            records = [json.dumps(finishes[i].record()) for i in lost]
            again = await self._finish_calls([finishes[i] for i in lost], records, timeout)
            for i, answer in zip(lost, again, strict=True):
                answers[i] = answer
        return answers

    async def finish_run(self, finish: Finish, timeout: float | None = None) -> Finished:
        (answer,) = await self.finish_runs([finish], timeout)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def _finish_calls(
        self, finishes: Sequence[Finish], records: list[str], timeout: float | None
    ) -> list[Finished | BaseException]:
        calls = [
            self._batcher.submit(
                "finish_run", [self.keys.run(f.run_id)], self._finish_args(f, record), timeout
            )
            for f, record in zip(finishes, records, strict=True)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        replies = [
            translate("finish_run", r) if isinstance(r, BaseException) else json.loads(r)
            for r in results
        ]
        notices = [n for r in replies if isinstance(r, dict) for n in _listed(r.get("notices"))]
        if notices:
            await self._notices.publish(notices)
        return [r if isinstance(r, BaseException) else _finished(r) for r in replies]

    def _finish_args(self, f: Finish, record: str) -> dict[str, Any]:
        return {
            "run_id": f.run_id, "node_id": f.node_id, "epoch": f.epoch, "status": f.status.value,
            "cause": f.stop_cause.value if f.stop_cause is not None else "", "output": f.output,
            "truncated": f.output_truncated, "error": f.error or "", "phase": f.phase or "",
            "delivered_at": _time_or_empty(f.delivered_at),
            "observed_at": _time_or_empty(f.observed_at), "retention_ms": self.retention_ms,
            "pub": self._pub, "record": record, "notes": f.notes,
        }  # fmt: skip

    async def sync_runs(self, node_id: str, epoch: str, items: Sequence[SyncItem]) -> int:
        """Write the updates of many runs in one script call; -> how many runs took them."""
        answer = await self._call(
            "sync_runs",
            self.keys.nodes,
            {"node_id": node_id, "epoch": epoch, "items": [asdict(item) for item in items]},
        )
        return int(answer["updated"])

    async def set_waiting(self, run_id: str, node_id: str, epoch: str, waiting: bool) -> bool:
        """Mark the run waiting (or running again); False if it cannot go there (a cancel is
        pending on it, or it is in no state to: cancelled while it waited). :class:`Fenced` if
        it is no longer this incarnation's."""
        target = RunStatus.WAITING if waiting else RunStatus.RUNNING
        answer = await self._call(
            "set_waiting",
            self.keys.run(run_id),
            {"run_id": run_id, "node_id": node_id, "epoch": epoch, "target": target.value},
        )
        code = Code(answer["code"])
        if code is Code.FENCED:
            raise Fenced(f"run {run_id} is no longer owned by this node incarnation")
        return code is Code.OK

    async def add_waiter(self, run_id: str, node_id: str) -> str:
        """Record the node as waiting for the run's end; -> the run's status ('' if unknown)."""
        answer = await self._call(
            "add_waiter", self.keys.run(run_id), {"run_id": run_id, "node_id": node_id}
        )
        return str(answer.get("status", ""))

    async def reassert_run(
        self, run_id: str, node_id: str, epoch: str, record: Record
    ) -> Reasserted:
        answer = await self._call(
            "reassert_run",
            self.keys.run(run_id),
            {"run_id": run_id, "node_id": node_id, "epoch": epoch, "record": json.dumps(record)},
        )
        code = Code(answer["code"])
        return Reasserted(code, answer.get("status", ""), answer.get("owner", ""))

    # -- selectors and tombstones -------------------------------------------------------------

    async def select_runs(self, selector: dict[str, Any], page: int = 500) -> list[str]:
        """The active runs matching ``selector`` (newest first), a page of the index per call."""
        matched: list[str] = []
        offset = 0
        while offset >= 0:
            answer = await self._call(
                "select_runs",
                self.keys.active,
                {"selector": selector, "offset": offset, "count": page},
            )
            offset = int(answer["next"])
            matched += _listed(answer.get("matched"))
        return matched

    async def add_tombstone(
        self,
        tombstone_id: str,
        selector: dict[str, Any],
        mode: CancelMode,
        reason: str | None,
        requested_by: str | None,
        cause: StopCause,
        ttl: float,
    ) -> bool:
        """Hold later runs matching ``selector`` for ``ttl`` seconds; False if too many are."""
        answer = await self._call(
            "add_tombstone",
            self.keys.tombstones,
            {
                "tombstone_id": tombstone_id,
                "selector": json.dumps(selector, separators=(",", ":")),
                "mode": mode.value, "reason": reason or "", "requested_by": requested_by or "",
                "cause": cause.value, "ttl_ms": _ms(ttl),
            },
        )  # fmt: skip
        return Code(answer["code"]) is Code.OK

    async def remove_tombstone(self, tombstone_id: str, request_id: str | None = None) -> bool:
        """Lift a tombstone; False if it was not live."""
        answer = await self._call(
            "remove_tombstone",
            self.keys.tombstones,
            {"tombstone_id": tombstone_id, "request": request_id or secrets.token_hex(12)},
        )
        return bool(answer["lifted"])


def _refused(answer: dict[str, Any], who: str) -> Code:
    """The code of an answer, unless it says the node may not write: then the error."""
    code = Code(answer["code"])
    if code is Code.FENCED:
        raise Fenced(f"{who} has lost its lease")
    if code is Code.MISSING:
        raise BusUnavailable("Redis lost this node's record; it re-registers within a beat")
    return code


def _finished(answer: dict[str, Any]) -> Finished | BaseException:
    code = Code(answer["code"])
    if code is Code.MISSING:
        return BusUnavailable("Redis lost this node's record; retrying after it re-registers")
    return Finished(code, answer.get("status", ""), answer.get("end_reason", ""))


def _listed(value: Any) -> list[Any]:
    """A JSON list from Lua (an empty Lua table encodes as ``{}``)."""
    return list(value) if isinstance(value, list) else []


def _run_or_none(record: Record | None) -> RunInfo | None:
    return RunInfo.from_redis(record) if record else None


def _json_or_empty(value: dict[str, Any] | None) -> str:
    return "" if value is None else json.dumps(value, separators=(",", ":"))


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _time_or_empty(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"
