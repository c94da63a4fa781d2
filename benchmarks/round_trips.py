"""Round trips per path (issue 16: "count the round trips on each path: start, finish, cancel,
confirm"): the commands Redis received for one isolated operation of each kind, read off
``MONITOR`` on the stage's own server. These are counts, not timings: exact, not noisy.

* start: ``bus.run()`` entered on library node A (no session, no metadata), until it returned;
* finish: the same run's scope exited normally (``succeeded``);
* cancel: library node B's ``bus.cancel(run_id, wait=True)`` of a tight-loop run on A, from
  the call until A's run raised at its checkpoint (observed);
* confirm: from then until B's call returned ``cancelled``;
* HTTP start: ``POST /v1/runs`` on node service A (an agent that waits a minute before its
  first chunk, so no relayed output joins in), until its 201;
* HTTP cancel / confirm: ``POST /v1/runs/{id}/cancel`` (``wait=true``) on service B for a
  tight-loop run on library node A, split the same way, until its 200.

Counted for each: the commands the nodes sent (a round trip each: nothing here pipelines), by
process and command (a script call by the script's name), from the nodes' own connections —
less the lease's (its heartbeat has connections of its own) and the subscriber's (its pings);
the commands the scripts ran inside Redis; and the pub/sub messages sent (``PUBLISH`` in a
script or not: each is a hop to another process). An operation's window runs from a marker
command sent before it to one sent after it and a settling pause (what a node writes just after
the call, such as a delivery time, is in it). The cancel and confirm split at the time the run
raised (both clocks are the host's). Only the processes an operation involves count. Library
nodes sweep every hour here; still, background work of an involved node can fall in a window (a
service's sweep every 2 s, a node's probe of its own channel), so every operation is repeated
and the least count kept (the repeats' counts, and the most, are noted when they differ).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Monitor

from ._cluster import CANCEL_TIMEOUT, SAMPLE_TIMEOUT, Bench, new_namespace, script_name
from ._harness import Worker

SECTION = "round trips (commands Redis received, one operation at a time)"
SETTLE = 0.2  # seconds after an operation before its end marker
QUIET_SWEEP = 3600.0  # the library nodes' sweep interval here: no sweep within a window
MARK = "bench-round-trips:"
IDLE_AGENT = {"tokens": 1, "token_interval_ms": 60_000, "turns": 1}
PUBLISHING = frozenset({"PUBLISH", "SPUBLISH"})
SCRIPT_CALLS = frozenset({"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"})


@dataclass
class Count:
    """What Redis received in one window (or one part of it)."""

    sent: list[str] = field(default_factory=list)  # "<process>: <command>", in the order run
    in_scripts: int = 0
    published: int = 0

    @property
    def round_trips(self) -> int:
        return len(self.sent)

    def describe(self) -> str:
        sent = " → ".join(self.sent) or "nothing"
        return f"{sent}; in scripts: {self.in_scripts} commands; published: {self.published}"


class CommandLog:
    """Every command the server receives (``MONITOR``), with whose connection sent it."""

    def __init__(self, url: str) -> None:
        self.redis = Redis.from_url(url, decode_responses=True, client_name="bench-monitor")
        self.marker = Redis.from_url(url, decode_responses=True, client_name="bench-marker")
        self.entries: list[dict[str, Any]] = []
        self.clients: dict[str, tuple[str, str]] = {}  # "ip:port" -> (name, flags)
        self._monitor: Monitor | None = None
        self._reader: asyncio.Task[None] | None = None
        self._marks = 0
        self.lua_first = False  # whether the server logs a script's commands before its call

    async def __aenter__(self) -> CommandLog:
        self._monitor = self.redis.monitor()
        await self._monitor.__aenter__()
        self._reader = asyncio.create_task(self._read(self._monitor))
        probe = f"{MARK}probe"
        await self.marker.eval(f"return redis.call('ECHO', '{probe}')", 0)
        found = await self._wait_for(probe)
        before = self.entries[found - 1] if found > 0 else None
        self.lua_first = not (before is not None and probe in str(before["command"]))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._monitor is not None:
            with contextlib.suppress(Exception):
                await self._monitor.__aexit__()
        for client in (self.redis, self.marker):
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _read(self, monitor: Monitor) -> None:
        async for entry in monitor.listen():
            self.entries.append(dict(entry))

    async def window(self) -> Window:
        """Mark the start of a window (see :meth:`Window.close`)."""
        self._marks += 1
        mark = f"{MARK}{self._marks}"
        await self.marker.echo(f"{mark}:start")
        return Window(self, mark)

    async def _wait_for(self, text: str, timeout: float = 10.0) -> int:
        """The index of the entry ``ECHO text``, once MONITOR has delivered it."""
        async with asyncio.timeout(timeout):
            while True:
                for i in range(len(self.entries) - 1, -1, -1):
                    if self.entries[i]["command"] == f"ECHO {text}":
                        return i
                await asyncio.sleep(0.01)

    async def _client_list(self) -> None:
        for client in await self.marker.client_list():
            self.clients[str(client["addr"])] = (str(client["name"]), str(client["flags"]))


@dataclass
class Window:
    log: CommandLog
    mark: str

    async def close(
        self, involved: set[str], split_at_ns: int | None = None
    ) -> tuple[Count, Count]:
        """End the window (after a settling pause); -> what the ``involved`` nodes sent in it,
        before and after ``split_at_ns`` (``time.time_ns()``; all of it before when not given).
        The others' background work (a service's sweep) is not the operation's."""
        await asyncio.sleep(SETTLE)
        await self.log._client_list()  # connections opened meanwhile have their names by now
        await self.log.marker.echo(f"{self.mark}:end")
        first = await self.log._wait_for(f"{self.mark}:start")
        last = await self.log._wait_for(f"{self.mark}:end")
        parts = (Count(), Count())
        for entry, script in _attributed(self.log.entries[first + 1 : last], self.log.lua_first):
            sender = script if script is not None else entry
            late = split_at_ns is not None and sender["time"] * 1e9 >= split_at_ns
            _add(parts[1] if late else parts[0], entry, sender, self.log.clients, involved)
        return parts


def _attributed(
    entries: list[dict[str, Any]], lua_first: bool
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each entry with the script call a command run inside a script belongs to (MONITOR shows
    it as ``lua``, right after its call — or right before it, where the server logs a command
    once it has run: ``lua_first``)."""
    out: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    script: dict[str, Any] | None = None
    waiting: list[dict[str, Any]] = []  # lua_first: the commands of a call not yet seen
    for entry in entries:
        if entry["client_type"] == "lua":
            if lua_first:
                waiting.append(entry)
            else:
                out.append((entry, script))
            continue
        script = entry if _is_script_call(entry) else None
        if lua_first:
            out.extend((lua, script) for lua in waiting)
            waiting = []
        out.append((entry, None))
    out.extend((lua, None) for lua in waiting)
    return out


def _is_script_call(entry: dict[str, Any]) -> bool:
    return str(entry["command"]).split(" ", 1)[0].upper() in SCRIPT_CALLS


def _add(
    count: Count,
    entry: dict[str, Any],
    sender: dict[str, Any],
    clients: dict[str, tuple[str, str]],
    involved: set[str],
) -> None:
    """Count ``entry`` if ``sender`` (itself, or the script call it ran in) is an involved
    node's."""
    if sender["client_type"] == "lua":
        return  # a script's command whose call is outside the window
    key = f"{sender['client_address']}:{sender['client_port']}"
    name, flags = clients.get(key, ("?", ""))
    node = name.removeprefix("cancel-bus.")
    if node not in involved or "P" in flags:
        return  # another's (a lease's heartbeat, the benchmark's own), or the subscriber's
    words = str(entry["command"]).split(" ", 2)
    command = words[0].upper()
    if command in PUBLISHING:
        count.published += 1
    if entry["client_type"] == "lua":
        count.in_scripts += 1
        return
    if command == "EVALSHA" and len(words) > 1:
        command = script_name(words[1])
    count.sent.append(f"{node}: {command}")


@dataclass
class Tally:
    """The counts of one path over its repeats; the least is reported."""

    name: str
    counts: list[Count] = field(default_factory=list)

    def least(self) -> Count:
        return min(self.counts, key=lambda c: (c.round_trips, c.published, c.in_scripts))


async def run(bench: Bench) -> None:
    repeats = bench.profile.round_trip_repeats
    paths = {
        key: Tally(name)
        for key, name in (
            ("start", "start: bus.run() entered (node A)"),
            ("finish", "finish: the run's scope exits, succeeded (node A)"),
            ("cancel", "cancel: B's bus.cancel(wait=True) until A's run raises"),
            ("confirm", "confirm: from A's run raising until B's call returns cancelled"),
            ("http_start", "HTTP start: POST /v1/runs on service A, until its 201"),
            ("http_cancel", "HTTP cancel: POST .../cancel on service B until A's run raises"),
            ("http_confirm", "HTTP confirm: from A's run raising until B's 200"),
        )
    }
    async with bench.stage("round trips") as (scope, server):
        namespace = new_namespace()
        quiet = {"sweep_interval": QUIET_SWEEP}
        a, b = await scope.nodes(server, namespace, ["node-a", "node-b"], quiet)
        service_a = await scope.service(server, namespace, "service-a")
        service_b = await scope.service(server, namespace, "service-b")
        client = await scope.worker("http-client")
        async with CommandLog(server.url) as log:
            for i in range(1 + repeats):  # the first is a warm-up: connections, scripts loaded
                taken = await _one_of_each(log, a, b, client, service_a.url, service_b.url, i)
                if i > 0:
                    for key, count in taken.items():
                        paths[key].counts.append(count)
    report = bench.report
    for key, path in paths.items():
        least = path.least()
        spread = sorted({c.round_trips for c in path.counts})
        note = f"({least.describe()}"
        if len(spread) > 1:
            most = max(path.counts, key=lambda c: c.round_trips)
            note += (
                f"; repeats: {[c.round_trips for c in path.counts]}, the most: {most.describe()}"
            )
        note += ")"
        report.figure(SECTION, path.name, least.round_trips, "round trips", note=note)
        if key == "finish":
            total = paths["start"].least().round_trips + least.round_trips
            report.figure(SECTION, "lifecycle: start + finish", total, "round trips")
        if key == "confirm":
            total = paths["cancel"].least().round_trips + least.round_trips
            hops = paths["cancel"].least().published + least.published
            name = "cross-node cancel: cancel + confirm"
            report.figure(SECTION, name, total, "round trips", note=f"({hops} pub/sub hops)")


async def _one_of_each(
    log: CommandLog,
    a: Worker,
    b: Worker,
    client: Worker,
    url_a: str,
    url_b: str,
    i: int,
) -> dict[str, Count]:
    taken: dict[str, Count] = {}
    window = await log.window()
    run_id = await a.call("hold_start")
    taken["start"], _ = await window.close({"node-a"})
    window = await log.window()
    status = await a.call("hold_finish", run_id=run_id)
    taken["finish"], _ = await window.close({"node-a"})
    if status != "succeeded":
        raise RuntimeError(f"a held run ended {status}")
    run_id = await a.call("run_start")
    window = await log.window()
    answer = await b.call("cancel", run_id=run_id, timeout=CANCEL_TIMEOUT, within=SAMPLE_TIMEOUT)
    end = await a.call("run_end", run_id=run_id, timeout=CANCEL_TIMEOUT)
    split = end["observed_ns"]
    taken["cancel"], taken["confirm"] = await window.close({"node-a", "node-b"}, split)
    if answer["outcome"] != "cancelled":
        raise RuntimeError(f"cancel of {run_id}: {answer['outcome']}")
    body = {"app_name": "bench", "user_id": "user", "session_id": f"rt{i}", "agent": IDLE_AGENT}
    window = await log.window()
    await client.call("http_start", url=url_a, body=body)
    taken["http_start"], _ = await window.close({"service-a"})
    run_id = await a.call("run_start")
    window = await log.window()
    answer = await client.call(
        "http_cancel", url=url_b, run_id=run_id, timeout=CANCEL_TIMEOUT, within=SAMPLE_TIMEOUT
    )
    end = await a.call("run_end", run_id=run_id, timeout=CANCEL_TIMEOUT)
    split = end["observed_ns"]
    taken["http_cancel"], taken["http_confirm"] = await window.close({"service-b", "node-a"}, split)
    if answer["code"] != 200:
        raise RuntimeError(f"HTTP cancel of {run_id} answered {answer['code']}")
    return taken
