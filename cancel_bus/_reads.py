"""The read-only queries: runs, nodes, events, relayed output, children, pending cancels, the
server — each translated at the Redis door, none changing anything."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from ._filter import RunFilter, recency
from ._keys import KeySpace
from ._protocol import (
    ClockField,
    EntryField,
    EventType,
    NodeField,
    NodeState,
    RunField,
    TombstoneField,
)
from ._redis import Client, info_of, translated
from ._types import (
    ACTIVE_STATUSES,
    CancelMode,
    NodeInfo,
    RunEvent,
    RunInfo,
    Tombstone,
)

_Entries = list[tuple[str, dict[str, str]]]
_LIST_PAGE = 500


class Reads:
    def __init__(self, redis: Client, keys: KeySpace) -> None:
        self._redis = redis
        self.keys = keys

    async def ping(self) -> None:
        with translated("ping"):
            await self._redis.ping()

    async def tombstones(self) -> list[Tombstone]:
        """The live tombstones, soonest to expire first."""
        with translated("tombstones"):
            ids = cast(
                list[str], await self._redis.zrangebyscore(self.keys.tombstones, "(0", "+inf")
            )
            async with self._redis.pipeline(transaction=False) as pipe:
                for tombstone_id in ids:
                    pipe.hgetall(self.keys.tombstone(tombstone_id))
                rows: list[dict[str, str]] = await pipe.execute()
        return [_tombstone(row) for row in rows if TombstoneField.SELECTOR in row]  # not lifted

    # -- reads --------------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> RunInfo | None:
        with translated("get_run"):
            fields = cast(dict[str, str], await self._redis.hgetall(self.keys.run(run_id)))
        return RunInfo.from_redis(fields) if fields else None

    async def session_run(self, session: tuple[str, str, str]) -> RunInfo | None:
        """The session key's active run, if any."""
        with translated("session_run"):
            run_id = cast(str | None, await self._redis.get(self.keys.session(*session)))
        run = await self.get_run(run_id) if run_id is not None else None
        return run if run is not None and run.is_active else None

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunInfo]:
        if not run_ids:
            return []
        with translated("get_runs"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.hgetall(self.keys.run(run_id))
                rows: list[dict[str, str]] = await pipe.execute()
        return [RunInfo.from_redis(row) for row in rows if row]

    async def list_runs(self, wanted: RunFilter, limit: int) -> list[RunInfo]:
        """The most recent first: an active run by its creation, a finished one by its end.
        Reads the narrowest indexes, each up to ``limit`` matches, then merges them."""
        found: dict[str, RunInfo] = {}
        for index in self._indexes_for(wanted):
            for run in await self._matching(index, wanted, limit):
                seen = found.get(run.run_id)  # ended between two reads: its later record
                if seen is None or recency(run) > recency(seen):
                    found[run.run_id] = run
        return sorted(found.values(), key=recency, reverse=True)[:limit]

    async def _matching(self, index: str, wanted: RunFilter, limit: int) -> list[RunInfo]:
        """Up to ``limit`` runs of ``index`` that match, most recent first."""
        if wanted.node_id is not None and index == self.keys.node_runs(wanted.node_id):
            with translated("list_runs"):
                members = cast(set[str], await self._redis.smembers(index))  # bounded: read whole
            runs = [r for r in await self.get_runs(list(members)) if wanted.matches(r)]
            return sorted(runs, key=recency, reverse=True)[:limit]
        found: list[RunInfo] = []
        offset = 0
        while len(found) < limit:
            with translated("list_runs"):
                ids = cast(
                    list[str],
                    await self._redis.zrange(index, offset, offset + _LIST_PAGE - 1, desc=True),
                )
            if not ids:
                break
            offset += len(ids)
            found += [r for r in await self.get_runs(ids) if wanted.matches(r)]
        return found[:limit]

    def _indexes_for(self, wanted: RunFilter) -> list[str]:
        k = self.keys
        active = wanted.status == "active" or wanted.status in ACTIVE_STATUSES
        if wanted.node_id is not None and active:
            return [k.node_runs(wanted.node_id)]
        if active:
            return [k.active]
        if wanted.status == "all":
            return [k.active, k.finished]
        return [k.finished]

    async def list_nodes(self, now: float) -> list[NodeInfo]:
        """The nodes holding a lease; ``now`` (server clock) tells which leases have expired.
        Leases are kept on the lease clock; ``lease_expires_at`` is when they would expire on
        the server clock if heartbeats kept reaching Redis."""
        with translated("list_nodes"):
            entries = cast(
                list[tuple[str, float]],
                await self._redis.zrange(self.keys.nodes, 0, -1, withscores=True),
            )
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.lease_clock, *ClockField)
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
                    epoch=fields.get(NodeField.EPOCH, ""),
                    started_at=float(fields.get(NodeField.STARTED_AT, 0)),
                    last_heartbeat=float(fields.get(NodeField.LAST_HEARTBEAT, 0)),
                    lease_expires_at=now + expires - lease_now,
                    active_runs=runs,
                    version=fields.get(NodeField.VERSION, ""),
                    expired=expires <= lease_now or fields.get(NodeField.STATE) != NodeState.ALIVE,
                    probe_at=_float_or_none(fields.get(NodeField.PROBE_AT)),
                    probe_latency_ms=_ms_or_none(fields.get(NodeField.PROBE_S)),
                    draining=fields.get(NodeField.DRAINING) == "1",
                )
            )
        return nodes

    async def events(self, run_id: str) -> list[RunEvent]:
        """The run's lifecycle events, oldest first. Queued and started are read off the record
        (the scripts do not log them: a run that just runs keeps no log)."""
        with translated("events"):
            async with self._redis.pipeline(transaction=False) as pipe:
                created_started_owner = (RunField.CREATED_AT, RunField.STARTED_AT, RunField.OWNER)
                pipe.hmget(self.keys.run(run_id), *created_started_owner)
                pipe.lrange(self.keys.events(run_id), 0, -1)
                (created, started, owner), entries = await pipe.execute()
        log: list[RunEvent] = []
        if created is not None and started != created:
            log.append(RunEvent(id="queued", type=EventType.QUEUED, at=float(created), data={}))
        if started is not None:
            data: dict[str, Any] = {"owner": owner}
            if started != created:
                data["claimed"] = True
            started_at = float(started)
            log.append(RunEvent(id="started", type=EventType.STARTED, at=started_at, data=data))
        for position, entry in enumerate(map(json.loads, entries)):
            log.append(
                RunEvent(
                    id=str(position),
                    type=entry[EntryField.TYPE],
                    at=float(entry[EntryField.AT]),
                    data=entry[EntryField.DATA] or {},
                )
            )
        return log

    async def pending_cancels(self, node_id: str) -> dict[str, CancelMode]:
        with translated("pending_cancels"):
            pending = cast(
                dict[str, str], await self._redis.hgetall(self.keys.node_pending(node_id))
            )
        return {run_id: CancelMode(mode) for run_id, mode in pending.items()}

    async def relay_position(self, run_id: str) -> tuple[RunInfo | None, str]:
        """The id of the last relayed entry ('0' if none), then the run. In that order, an end
        that comes in between is an entry after the position, so a follower still sees it."""
        with translated("relay_position"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrevrange(self.keys.relay(run_id), count=1)
                pipe.hgetall(self.keys.run(run_id))
                last, fields = await pipe.execute()
        return (RunInfo.from_redis(fields) if fields else None), (last[0][0] if last else "0")

    async def read_relay(
        self, run_id: str, after: str, block_ms: int | None, count: int = 500
    ) -> list[RunEvent]:
        """Entries after ``after``; waits up to ``block_ms`` for one (None: no wait)."""
        with translated("read_relay"):
            reply = await self._redis.xread(
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
            ids = cast(set[str], await self._redis.smembers(self.keys.children(run_id)))
        runs = await self.get_runs(sorted(ids))
        return sorted(runs, key=lambda run: run.created_at)

    async def server_info(self) -> dict[str, Any]:
        """``INFO`` of the server that holds the namespace (on a cluster: its shard's primary)."""
        with translated("info"):
            return await info_of(self._redis, self.keys.active)

    async def node_run_ids(self, node_id: str) -> set[str]:
        with translated("node_run_ids"):
            ids = await self._redis.smembers(self.keys.node_runs(node_id))
        return cast(set[str], ids)


def _event(entry_id: str, fields: dict[str, str]) -> RunEvent:
    return RunEvent(
        id=entry_id,
        type=fields.get(EntryField.TYPE, ""),
        at=float(fields.get(EntryField.AT, 0)),
        data=json.loads(fields.get(EntryField.DATA) or "{}"),
    )


def _tombstone(fields: dict[str, str]) -> Tombstone:
    selector = json.loads(fields[TombstoneField.SELECTOR])
    return Tombstone.model_validate({**fields, TombstoneField.SELECTOR: selector})


def _float_or_none(value: str | None) -> float | None:
    return float(value) if value else None


def _ms_or_none(seconds: str | None) -> float | None:
    return round(float(seconds) * 1000, 3) if seconds else None


def _lease_clock(clock: list[str | None], now: float) -> float:
    """The lease clock at ``now`` (server clock), as the scripts compute it (``_scripts.py``)."""
    last, at, cap = clock
    if last is None or at is None or cap is None:
        return now
    return float(at) + min(max(now - float(last), 0.0), float(cap))
