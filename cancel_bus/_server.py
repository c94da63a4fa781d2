"""What a node checks of the Redis server that holds its namespace (``INFO``).

* At start: a version that runs the scripts (7.0: script flags), and an eviction policy that never
  drops a live run. Any ``maxmemory-policy`` but ``noeviction`` lets Redis evict run records, the
  session keys, the node leases: cancels answer ``not_found`` for running runs, finished records
  vanish, live nodes look dead. Such a server is refused (:class:`BusMisconfigured`) unless the
  bus accepts the risk (``accept_eviction``), which then stays a warning of the node.
* Every lease: the policy again (it can be changed at run time), and ``evicted_keys``: keys
  evicted since the last look make the node unready until a look finds none new.
* A server that hides ``INFO`` (a managed service, an ACL user without it) is said once, in the
  log; nothing is refused then.
"""

from __future__ import annotations

import logging
from typing import Any

from ._duties import Duty
from ._errors import BusMisconfigured, BusUnavailable
from ._reads import Reads
from ._redis import backoff
from ._types import BusStats

log = logging.getLogger("cancel_bus")

MIN_VERSION = (7, 0)
SAFE_POLICY = "noeviction"


class ServerCheck:
    def __init__(self, reads: Reads, stats: BusStats, *, accept_eviction: bool) -> None:
        self._reads = reads
        self._stats = stats
        self._accept_eviction = accept_eviction
        self.policy: str | None = None  # None: not known (hidden, or not read yet)
        self._evicted: int | None = None
        self._new_evictions = 0  # keys evicted between the last two looks
        self._hidden_said = False
        self.looks = 0  # times INFO was asked for

    @property
    def problem(self) -> str | None:
        """Why the node should not take traffic because of its server, or None."""
        if self._new_evictions:
            return (
                f"Redis evicted {self._new_evictions} key(s) since the last look (maxmemory-policy "
                f"{self.policy}): runs, leases or session keys may be lost"
            )
        if self.policy not in (None, SAFE_POLICY) and not self._accept_eviction:
            return f"Redis's maxmemory-policy is {self.policy}: it may evict live runs"
        return None

    @property
    def warning(self) -> str | None:
        """A risk the bus was told to accept, or None."""
        if self.policy not in (None, SAFE_POLICY) and self._accept_eviction:
            return (
                f"Redis's maxmemory-policy is {self.policy} (accepted): it may evict live runs, "
                "which then look unknown or ended"
            )
        return None

    async def at_start(self) -> None:
        """Refuse a server the bus cannot work with (:class:`BusMisconfigured`)."""
        info = await self._read()
        if info is None:
            return
        version = str(info.get("redis_version", ""))
        if version and _version(version) < MIN_VERSION:
            raise BusMisconfigured(
                f"Redis {version} is too old: cancel-bus needs {'.'.join(map(str, MIN_VERSION))} "
                "or later (its scripts declare flags), or Valkey 7.2 or later"
            )
        if self.policy not in (None, SAFE_POLICY) and not self._accept_eviction:
            raise BusMisconfigured(
                f"Redis's maxmemory-policy is {self.policy}: it would evict live runs (cancels "
                "answer not_found for running runs, records vanish, live nodes look dead). Set "
                "`CONFIG SET maxmemory-policy noeviction`, or accept the risk (accept_eviction, "
                "CANCEL_BUS_ACCEPT_EVICTION=true)"
            )

    async def look(self) -> None:
        """Read the policy and the evictions again (every lease); Redis away: the lease says so."""
        try:
            await self._read()
        except BusUnavailable as exc:  # refused access too: the heartbeat says so
            log.debug("cancel-bus: INFO not read: %s", exc)

    def duty(self, period: float) -> Duty:
        """A look every ``period`` seconds (the lease)."""
        return Duty("server check", self.look, lambda: period, backoff(1.0, period), at_once=False)

    async def _read(self) -> dict[str, Any] | None:
        self.looks += 1
        try:
            info = await self._reads.server_info()
        except BusMisconfigured as exc:
            if exc.code != "NOPERM":
                raise
            self._hidden(str(exc))  # INFO refused to this user: not ours to insist
            return None
        policy = info.get("maxmemory_policy")
        if policy is None:
            self._hidden("INFO has no maxmemory_policy")
        self.policy = None if policy is None else str(policy)
        evicted = info.get("evicted_keys")
        if isinstance(evicted, int):
            new = evicted - self._evicted if self._evicted is not None else 0
            self._new_evictions = max(0, new)
            self._stats.redis_keys_evicted += self._new_evictions
            if self._new_evictions:
                log.error("cancel-bus: %s", self.problem)
            self._evicted = evicted
        return info

    def _hidden(self, why: str) -> None:
        if not self._hidden_said:
            self._hidden_said = True
            log.warning(
                "cancel-bus: the server's eviction policy cannot be checked (%s): make sure it "
                "is noeviction",
                why,
            )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())
