"""Typed calls of the Lua scripts and the read-only queries: the bus's only door to Redis keys.

Every call goes through :func:`translated`, so no ``redis.exceptions`` error leaves this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._batcher import ScriptBatcher
from ._duties import Spawn
from ._errors import CancelBusError, RunExists, SessionBusy
from ._keys import KeySpace
from ._messages import Field, MessageKind, MessageSigner, decode, probe_body
from ._redis import translate, translated
from ._scripts import ALL_SCRIPTS, NOTIFYING
from ._types import (
    ACTIVE_STATUSES,
    CancelMode,
    NodeInfo,
    RunEvent,
    RunInfo,
    RunStatus,
    StatusFilter,
    StopCause,
    Tombstone,
)

log = logging.getLogger("cancel_bus")

_Entries = list[tuple[str, dict[str, str]]]
_LIST_PAGE = 500


def _fields(flat: Sequence[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """What ``request_cancel`` answered: a code (an Outcome value), the run, how many
    subscribers the cancel message reached (-1: none was sent, the caller is the owner), the
    descendants, whether some were left out (``MAX_DESCENDANTS``, ``MAX_WALK``), and how many of
    the tree's cancel messages no subscriber heard (the owners' sweeps deliver them)."""

    code: str
    run: RunInfo | None
    receivers: int = -1
    descendants: list[tuple[str, str, RunInfo | None]] = field(default_factory=list)
    truncated: bool = False
    unheard: int = 0


@dataclass(frozen=True, slots=True)
class CancelOrder:
    """What a cancel asks for: the run (``run:<id>``) or session (``session:...``) it targets,
    its mode, reason, requester and cause; with ``tree``, every run started below it too."""

    target: str
    run_id: str | None
    session: tuple[str, str, str] | None
    mode: CancelMode
    reason: str | None
    requested_by: str | None
    cause: StopCause
    tree: bool = True


@dataclass(frozen=True, slots=True)
class Finish:
    """A run's end, as its owner writes it. ``stop_cause``: why the node stopped the run without
    a request, if it did; ``record`` (the run as the owner knows it) is read only if Redis lost
    the run's record."""

    run_id: str
    node_id: str
    epoch: str
    status: RunStatus
    stop_cause: StopCause | None
    output: str
    output_truncated: bool
    error: str | None
    phase: str | None
    delivered_at: float | None
    observed_at: float | None
    record: Callable[[], dict[str, str]]
    notes: str = ""


FinishAnswer = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class SyncItem:
    """Owner-side updates of one active run, written together off the hot path."""

    run_id: str
    phase: str
    delivered_at: str
    relay_entries: list[tuple[str, str, str]]
    notes: str = ""


class RunStore:
    """``signer``: on a signed bus the scripts hand their notices back, and the store seals each
    (bound to its recipient) and publishes it; otherwise the scripts publish them. ``spawn``:
    where batches of script calls are sent from (the node's background work)."""

    def __init__(
        self,
        redis: Redis | RedisCluster,
        keys: KeySpace,
        *,
        retention: float,
        pub_command: str,
        spawn: Spawn,
        signer: MessageSigner | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_ms = str(int(retention * 1000))
        self.pub_command = pub_command
        self._signer = signer if signer is not None and signer.enabled else None
        self._script_pub = "" if self._signer is not None else pub_command
        self._batcher = ScriptBatcher(redis, ALL_SCRIPTS, spawn)

    async def _eval(
        self, name: str, keys: list[str], args: list[str], timeout: float | None = None
    ) -> Any:
        with translated(name):
            return await self._batcher.call(name, keys, args, timeout)

    async def _eval_notifying(
        self, name: str, keys: list[str], args: list[str], timeout: float | None = None
    ) -> tuple[Any, dict[str, list[int]]]:
        """A script that may notify nodes: -> its answer, and by kind of message the receivers of
        each notice the store sent for it (none when the script published them itself)."""
        assert name in NOTIFYING
        notices, answer = await self._eval(name, keys, args, timeout)
        return answer, (await self._publish(notices) if notices else {})

    async def _publish(self, notices: list[list[str]]) -> dict[str, list[int]]:
        """Seal and send the notices a script kept; -> by kind of message, the receivers of each
        one sent. The state is already written: a notice that cannot be sent is left to the
        sweeps."""
        assert self._signer is not None
        signer = self._signer

        async def send(node_id: str, body: dict[str, Any]) -> int:
            with translated("publish"):
                count = await self.redis.execute_command(
                    self.pub_command, self.keys.channel(node_id), signer.seal(body)
                )
            return int(count)

        bodies = [(node_id, decode(message) or {}) for node_id, message in notices]
        counts = await asyncio.gather(
            *(send(node_id, body) for node_id, body in bodies), return_exceptions=True
        )
        receivers: dict[str, list[int]] = {}
        for (_, body), sent in zip(bodies, counts, strict=True):
            if isinstance(sent, CancelBusError):
                log.debug("cancel-bus: a notice was not sent: %s", sent)
            elif isinstance(sent, BaseException):
                raise sent
            else:
                receivers.setdefault(str(body.get(Field.KIND)), []).append(sent)
        return receivers

    # -- nodes --------------------------------------------------------------------------------

    async def register_node(
        self, node_id: str, lease_ttl: float, version: str, epoch: str, restore: bool
    ) -> tuple[str, float]:
        """-> (code, server time); code is ok | in_use | busy | fenced (restore refused)."""
        k = self.keys
        reply, _ = await self._eval_notifying(
            "register_node",
            [k.nodes, k.node(node_id)],
            [
                node_id, _ms(lease_ttl), version, self.retention_ms, self._script_pub,
                _ms(lease_ttl / 3), epoch, "1" if restore else "0",
            ],
        )  # fmt: skip
        return reply[0], float(reply[1])

    async def heartbeat(
        self, node_id: str, epoch: str, lease_ttl: float, probe: tuple[float, float] | None = None
    ) -> tuple[str, float, int]:
        """-> (code, server time, runs recorded for the node); code is ok | fenced | missing.
        ``probe``: when its last probe of its own channel came back (server clock), and how
        long it took (seconds), shown in the node list."""
        probe_at, probe_s = ("", "") if probe is None else (f"{probe[0]:.6f}", f"{probe[1]:.6f}")
        reply = await self._eval(
            "heartbeat",
            [self.keys.nodes, self.keys.node(node_id)],
            [node_id, epoch, _ms(lease_ttl), _ms(lease_ttl / 3), probe_at, probe_s],
        )
        return reply[0], float(reply[1]), int(reply[2]) if len(reply) > 2 else 0

    async def reap(self, budget: int) -> tuple[int, int, bool]:
        """-> (runs resolved, nodes reaped, more expired nodes left)."""
        reply, _ = await self._eval_notifying(
            "reap", [self.keys.nodes], [str(budget), self.retention_ms, self._script_pub]
        )
        return int(reply[0]), int(reply[1]), bool(reply[2])

    async def leave_node(self, node_id: str, epoch: str) -> tuple[str, bool]:
        reply, _ = await self._eval_notifying(
            "leave_node",
            [self.keys.node(node_id)],
            [node_id, epoch, self.retention_ms, self._script_pub],
        )
        return reply[0], len(reply) > 2 and bool(reply[2])

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
    ) -> tuple[str, dict[str, str] | None, str]:
        """-> (code, the run's fields, detail); code is ok | fenced | missing | exists (with the
        run: taken, or queued for another session) | session_busy (detail: the active run's
        id) | cancelled (with the run: it must not start — its parent's cancel, a tombstone).
        The fields are parsed by whoever needs them (most runs never do)."""
        app, user, sess = session or ("", "", "")
        reply, _ = await self._eval_notifying(
            "start_run",
            [self.keys.run(run_id)],
            [
                run_id, node_id, epoch, app, user, sess, _json_or_empty(metadata),
                "1" if relay else "0", parent or "", self.retention_ms, self._script_pub,
            ],
        )  # fmt: skip
        if reply[0] in ("ok", "exists", "cancelled"):
            return reply[0], _fields(reply[1]), ""
        return reply[0], None, reply[1] if len(reply) > 1 else ""

    async def enqueue_run(
        self,
        run_id: str,
        session: tuple[str, str, str] | None,
        metadata: dict[str, Any] | None,
        parent: str | None = None,
        request_id: str | None = None,
    ) -> RunInfo:
        """The queued run (or, if it must never start — its parent's cancel, a tombstone — the
        run recorded cancelled at once); :class:`SessionBusy`, :class:`RunExists` if taken."""
        app, user, sess = session or ("", "", "")
        reply = await self._eval(
            "enqueue_run",
            [self.keys.run(run_id)],
            [
                run_id, app, user, sess, _json_or_empty(metadata), parent or "",
                self.retention_ms, request_id or secrets.token_hex(12),
            ],
        )  # fmt: skip
        if reply[0] == "session_busy":
            assert session is not None
            raise SessionBusy(session, reply[1])
        if reply[0] == "exists":
            raise RunExists(run_id, reply[1])
        return RunInfo.from_redis(_fields(reply[1]))

    async def request_cancel(
        self, order: CancelOrder, *, waiter: str, caller: str, request_id: str | None = None
    ) -> CancelAnswer:
        """The run (or the session's active run) and, with ``order.tree``, every run started
        below it: cancel requests recorded, owners told; ``waiter``: the node to ring at its end
        (``''``: none). The answer lists the descendants deepest first; ``recovering``: not
        found, but Redis lost the namespace's data lately (ask again). The call carries a
        request id (fresh unless given): if redis-py sends it again after its answer was lost,
        the script answers for the run the first send reached, as it now stands."""
        session = order.session or ("", "", "")
        key = (
            self.keys.run(order.run_id) if order.run_id is not None else self.keys.session(*session)
        )
        reply, sent = await self._eval_notifying(
            "request_cancel",
            [key],
            [
                order.target,
                order.run_id or "",
                order.mode.value,
                order.reason or "",
                order.requested_by or "",
                waiter,
                caller,
                self.retention_ms,
                self._script_pub,
                order.cause.value,
                "1" if order.tree else "0",
                request_id or secrets.token_hex(12),
            ],
        )
        if len(reply) == 1:
            return CancelAnswer(reply[0], None)
        below = [(str(kid), str(code), _run_or_none(fields)) for kid, code, fields, _ in reply[3]]
        # receivers of each cancel message: sent by the store (sealed), else by the script
        heard = sent.get(MessageKind.CANCEL) or [
            int(reply[2]),
            *(int(entry[3]) for entry in reply[3]),
        ]
        return CancelAnswer(
            reply[0],
            _run_or_none(reply[1]),
            sum(heard) if MessageKind.CANCEL in sent else int(reply[2]),
            below,
            reply[4] == 1,
            unheard=heard.count(0),
        )

    async def finish_run(self, finish: Finish, timeout: float | None = None) -> FinishAnswer:
        """-> (code, final status, end reason); code is ok | done | fenced | missing.
        ``timeout``: for Redis's answer, from when the call leaves (it is safe to repeat)."""
        (answer,) = await self.finish_runs([finish], timeout)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def finish_runs(
        self, finishes: Sequence[Finish], timeout: float | None = None
    ) -> list[FinishAnswer | BaseException]:
        """Many runs' ends at once (a chunk of a burst): queued together, they leave in as few
        batches as the batcher allows; -> each one's answer (see :meth:`finish_run`) or error.
        A run whose record Redis lost is written again with the owner's ``record``."""
        answers = await self._finish_calls(finishes, [""] * len(finishes), timeout)
        lost = [i for i, answer in enumerate(answers) if _code(answer) == "record_lost"]
        if lost:
            records = [json.dumps(finishes[i].record()) for i in lost]
            again = await self._finish_calls([finishes[i] for i in lost], records, timeout)
            for i, answer in zip(lost, again, strict=True):
                answers[i] = answer
        return answers

    async def _finish_calls(
        self, finishes: Sequence[Finish], records: list[str], timeout: float | None
    ) -> list[FinishAnswer | BaseException]:
        answers = [
            self._batcher.submit(
                "finish_run", [self.keys.run(f.run_id)], self._finish_args(f, record), timeout
            )
            for f, record in zip(finishes, records, strict=True)
        ]
        replies = await asyncio.gather(*answers, return_exceptions=True)
        notices = [n for r in replies if not isinstance(r, BaseException) for n in r[0]]
        if notices:
            await self._publish(notices)
        return [
            translate("finish_run", r)
            if isinstance(r, BaseException)
            else (r[1][0], r[1][1], r[1][2] if len(r[1]) > 2 else "")
            for r in replies
        ]

    def _finish_args(self, f: Finish, record: str) -> list[str]:
        return [
            f.run_id, f.node_id, f.epoch, f.status.value,
            f.stop_cause.value if f.stop_cause is not None else "", f.output,
            "1" if f.output_truncated else "0", f.error or "", f.phase or "",
            _time_or_empty(f.delivered_at), _time_or_empty(f.observed_at),
            self.retention_ms, self._script_pub, record, f.notes,
        ]  # fmt: skip

    async def sync_runs(self, node_id: str, epoch: str, items: Sequence[SyncItem]) -> int:
        """Write the updates of many runs in one script call; -> how many runs took them."""
        batch = [[i.run_id, i.phase, i.delivered_at, i.relay_entries, i.notes] for i in items]
        updated = await self._eval(
            "sync_runs", [self.keys.nodes], [node_id, epoch, json.dumps(batch)]
        )
        return int(updated)

    async def set_waiting(
        self, run_id: str, node_id: str, epoch: str, target: RunStatus
    ) -> tuple[str, str]:
        """-> (code, detail); code is ok | cancel_pending | state | fenced."""
        reply = await self._eval(
            "set_waiting", [self.keys.run(run_id)], [run_id, node_id, epoch, target.value]
        )
        return reply[0], reply[1] if len(reply) > 1 else ""

    async def add_waiter(self, run_id: str, node_id: str) -> str:
        """Record the node as waiting for the run's end; -> the run's status ('' if unknown)."""
        return str(await self._eval("add_waiter", [self.keys.run(run_id)], [run_id, node_id]))

    async def reassert_run(
        self, run_id: str, node_id: str, epoch: str, record: dict[str, str]
    ) -> tuple[str, str]:
        """-> (code, detail); code is ok | recreated | finished | foreign | fenced."""
        reply = await self._eval(
            "reassert_run",
            [self.keys.run(run_id)],
            [run_id, node_id, epoch, json.dumps(record)],
        )
        return reply[0], reply[1] if len(reply) > 1 else ""

    async def publish_probe(self, node_id: str, epoch: str, nonce: str) -> int:
        """Send a probe to the node's own channel (sealed on a signed bus); -> subscribers that
        received it."""
        body = probe_body(nonce, node_id, epoch)
        message = self._signer.seal(body) if self._signer else json.dumps(body)
        with translated("probe"):
            receivers = await self.redis.execute_command(
                self.pub_command, self.keys.channel(node_id), message
            )
        return int(receivers)

    # -- selectors and tombstones -------------------------------------------------------------

    async def select_runs(self, selector: dict[str, Any]) -> list[str]:
        """The active runs matching ``selector`` (newest first), a page of the index per call."""
        matched: list[str] = []
        offset = 0
        encoded = json.dumps(selector, separators=(",", ":"))
        while offset >= 0:
            reply = await self._eval(
                "select_runs", [self.keys.active], [encoded, str(offset), str(_LIST_PAGE)]
            )
            offset = int(reply[0])
            matched += reply[1]
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
        reply = await self._eval(
            "add_tombstone",
            [self.keys.tombstones],
            [
                tombstone_id, json.dumps(selector, separators=(",", ":")), mode.value,
                reason or "", requested_by or "", cause.value, _ms(ttl),
            ],
        )  # fmt: skip
        return bool(reply[0] == "ok")

    async def remove_tombstone(self, tombstone_id: str, request_id: str | None = None) -> bool:
        """Lift a tombstone; False if it was not live."""
        args = [tombstone_id, request_id or secrets.token_hex(12)]
        return bool(await self._eval("remove_tombstone", [self.keys.tombstones], args))

    async def tombstones(self) -> list[Tombstone]:
        """The live tombstones, soonest to expire first."""
        with translated("tombstones"):
            ids = cast(
                list[str], await self.redis.zrangebyscore(self.keys.tombstones, "(0", "+inf")
            )
            async with self.redis.pipeline(transaction=False) as pipe:
                for tombstone_id in ids:
                    pipe.hgetall(self.keys.tombstone(tombstone_id))
                rows: list[dict[str, str]] = await pipe.execute()
        return [_tombstone(row) for row in rows if "selector" in row]  # not lifted meanwhile

    # -- reads --------------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        with translated("get_run"):
            fields = cast(dict[str, str], await self.redis.hgetall(self.keys.run(run_id)))
        return RunInfo.from_redis(fields) if fields else None

    async def session_run(self, session: tuple[str, str, str]) -> RunInfo | None:
        """The session key's active run, if any."""
        with translated("session_run"):
            run_id = cast(str | None, await self.redis.get(self.keys.session(*session)))
        run = await self.get_run(run_id) if run_id is not None else None
        return run if run is not None and run.is_active else None

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunInfo]:
        if not run_ids:
            return []
        with translated("get_runs"):
            async with self.redis.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.hgetall(self.keys.run(run_id))
                rows: list[dict[str, str]] = await pipe.execute()
        return [RunInfo.from_redis(row) for row in rows if row]

    async def list_runs(
        self,
        status: StatusFilter,
        node_id: str | None,
        app_name: str | None,
        user_id: str | None,
        limit: int,
    ) -> list[RunInfo]:
        """The most recent first: an active run by its creation, a finished one by its end.
        Reads the narrowest indexes, each up to ``limit`` matches, then merges them."""
        found: dict[str, RunInfo] = {}
        for index in self._indexes_for(status, node_id):
            for run in await self._matching(index, status, node_id, app_name, user_id, limit):
                seen = found.get(run.run_id)  # ended between two reads: its later record
                if seen is None or _recency(run) > _recency(seen):
                    found[run.run_id] = run
        return sorted(found.values(), key=_recency, reverse=True)[:limit]

    async def _matching(
        self,
        index: str,
        status: StatusFilter,
        node_id: str | None,
        app_name: str | None,
        user_id: str | None,
        limit: int,
    ) -> list[RunInfo]:
        """Up to ``limit`` runs of ``index`` that match, most recent first."""
        if node_id is not None and index == self.keys.node_runs(node_id):
            with translated("list_runs"):
                members = cast(set[str], await self.redis.smembers(index))  # bounded: read whole
            runs = [
                r
                for r in await self.get_runs(list(members))
                if _matches(r, status, node_id, app_name, user_id)
            ]
            return sorted(runs, key=_recency, reverse=True)[:limit]
        found: list[RunInfo] = []
        offset = 0
        while len(found) < limit:
            with translated("list_runs"):
                ids = cast(
                    list[str],
                    await self.redis.zrange(index, offset, offset + _LIST_PAGE - 1, desc=True),
                )
            if not ids:
                break
            offset += len(ids)
            found += [
                r
                for r in await self.get_runs(ids)
                if _matches(r, status, node_id, app_name, user_id)
            ]
        return found[:limit]

    def _indexes_for(self, status: StatusFilter, node_id: str | None) -> list[str]:
        k = self.keys
        if node_id is not None and (status == "active" or status in ACTIVE_STATUSES):
            return [k.node_runs(node_id)]
        if status == "active" or status in ACTIVE_STATUSES:
            return [k.active]
        if status == "all":
            return [k.active, k.finished]
        return [k.finished]

    async def list_nodes(self, now: float) -> list[NodeInfo]:
        """The nodes holding a lease; ``now`` (server clock) tells which leases have expired.
        Leases are kept on the lease clock; ``lease_expires_at`` is when they would expire on
        the server clock if heartbeats kept reaching Redis."""
        with translated("list_nodes"):
            entries = cast(
                list[tuple[str, float]],
                await self.redis.zrange(self.keys.nodes, 0, -1, withscores=True),
            )
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.lease_clock, "last", "at", "cap")
                for node_id, _ in entries:
                    pipe.hgetall(self.keys.node(node_id))
                    pipe.scard(self.keys.node_runs(node_id))
                clock, *rows = await pipe.execute()
        lease_now = _lease_clock(clock, now)
        nodes = []
        for (node_id, expires), fields, runs in zip(entries, rows[::2], rows[1::2], strict=True):
            if not fields:
                continue
            nodes.append(
                NodeInfo(
                    node_id=node_id,
                    epoch=fields.get("epoch", ""),
                    started_at=float(fields.get("started_at", 0)),
                    last_heartbeat=float(fields.get("last_heartbeat", 0)),
                    lease_expires_at=now + expires - lease_now,
                    active_runs=runs,
                    version=fields.get("version", ""),
                    expired=expires <= lease_now or fields.get("state") != "alive",
                    probe_at=_float_or_none(fields.get("probe_at")),
                    probe_latency_ms=_ms_or_none(fields.get("probe_s")),
                )
            )
        return nodes

    async def events(self, run_id: str) -> list[RunEvent]:
        """The run's lifecycle events, oldest first. Queued and started are read off the record
        (the scripts do not log them: a run that just runs keeps no log)."""
        with translated("events"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.run(run_id), "created_at", "started_at", "owner")
                pipe.lrange(self.keys.events(run_id), 0, -1)
                (created, started, owner), entries = await pipe.execute()
        log: list[RunEvent] = []
        if created is not None and started != created:
            log.append(RunEvent(id="queued", type="run.queued", at=float(created), data={}))
        if started is not None:
            data: dict[str, Any] = {"owner": owner}
            if started != created:
                data["claimed"] = True
            log.append(RunEvent(id="started", type="run.started", at=float(started), data=data))
        for position, entry in enumerate(map(json.loads, entries)):
            log.append(
                RunEvent(
                    id=str(position),
                    type=entry["type"],
                    at=float(entry["at"]),
                    data=entry["data"] or {},
                )
            )
        return log

    async def pending_cancels(self, node_id: str) -> dict[str, CancelMode]:
        with translated("pending_cancels"):
            pending = cast(
                dict[str, str], await self.redis.hgetall(self.keys.node_pending(node_id))
            )
        return {run_id: CancelMode(mode) for run_id, mode in pending.items()}

    async def relay_position(self, run_id: str) -> tuple[RunInfo | None, str]:
        """The id of the last relayed entry ('0' if none), then the run. In that order, an end
        that comes in between is an entry after the position, so a follower still sees it."""
        with translated("relay_position"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xrevrange(self.keys.relay(run_id), count=1)
                pipe.hgetall(self.keys.run(run_id))
                last, fields = await pipe.execute()
        return (RunInfo.from_redis(fields) if fields else None), (last[0][0] if last else "0")

    async def read_relay(
        self, run_id: str, after: str, block_ms: int | None, count: int = 500
    ) -> list[RunEvent]:
        """Entries after ``after``; waits up to ``block_ms`` for one (None: no wait)."""
        with translated("read_relay"):
            reply = await self.redis.xread(
                {self.keys.relay(run_id): after}, count=count, block=block_ms
            )
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3
            entries = cast(_Entries, next(iter(cast(dict[str, Any], reply).values()))[0])
        else:
            entries = cast(_Entries, cast(list[Any], reply)[0][1])
        return [_event(entry_id, fields) for entry_id, fields in entries]

    async def children(self, run_id: str) -> list[RunInfo]:
        """The runs started as the run's children (its ``kids:`` set), the oldest first."""
        with translated("children"):
            ids = cast(set[str], await self.redis.smembers(self.keys.children(run_id)))
        runs = await self.get_runs(sorted(ids))
        return sorted(runs, key=lambda run: run.created_at)

    async def ping(self) -> None:
        with translated("ping"):
            await self.redis.ping()

    async def server_info(self) -> dict[str, Any]:
        """``INFO`` of the server that holds the namespace (on a cluster: its shard's primary)."""
        with translated("info"):
            if isinstance(self.redis, RedisCluster):
                await self.redis.initialize()  # its map of the slots, once
                node = self.redis.get_node_from_key(self.keys.active)
                return await self.redis.info(target_nodes=node)
            return await self.redis.info()

    async def node_run_ids(self, node_id: str) -> set[str]:
        with translated("node_run_ids"):
            ids = await self.redis.smembers(self.keys.node_runs(node_id))
        return cast(set[str], ids)


def _event(entry_id: str, fields: dict[str, str]) -> RunEvent:
    return RunEvent(
        id=entry_id,
        type=fields.get("type", ""),
        at=float(fields.get("at", 0)),
        data=json.loads(fields.get("data") or "{}"),
    )


def _recency(run: RunInfo) -> float:
    """When the run last changed state (as its index orders it): its end, else its creation."""
    return run.finished_at if run.finished_at is not None else run.created_at


def _matches(
    run: RunInfo,
    status: StatusFilter,
    node_id: str | None,
    app_name: str | None,
    user_id: str | None,
) -> bool:
    if status == "active":
        if not run.is_active:
            return False
    elif status not in ("all", run.status):
        return False
    return (
        (node_id is None or run.owner == node_id)
        and (app_name is None or run.app_name == app_name)
        and (user_id is None or run.user_id == user_id)
    )


def _json_or_empty(value: dict[str, Any] | None) -> str:
    return "" if value is None else json.dumps(value, separators=(",", ":"))


def _tombstone(fields: dict[str, str]) -> Tombstone:
    return Tombstone.model_validate({**fields, "selector": json.loads(fields["selector"])})


def _float_or_none(value: str | None) -> float | None:
    return float(value) if value else None


def _ms_or_none(seconds: str | None) -> float | None:
    return round(float(seconds) * 1000, 3) if seconds else None


def _run_or_none(flat: Sequence[str]) -> RunInfo | None:
    return RunInfo.from_redis(_fields(flat)) if flat else None


def _lease_clock(clock: list[str | None], now: float) -> float:
    """The lease clock at ``now`` (server clock), as the scripts compute it (``_scripts.py``)."""
    last, at, cap = clock
    if last is None or at is None or cap is None:
        return now
    return float(at) + min(max(now - float(last), 0.0), float(cap))


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


def _code(answer: FinishAnswer | BaseException) -> str | None:
    return None if isinstance(answer, BaseException) else answer[0]


def _time_or_empty(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"
