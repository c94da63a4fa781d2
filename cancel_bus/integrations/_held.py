"""Cancel-before-start: a session cancel that finds no active run, held for a run of the session
that was asked for before the cancel and registers within a grace period.

A framework's run registers on the bus some time after the application asked for it (trpc-agent
loads the session first; a google-adk invocation registers when its stream is first read): a
cancel in that window finds nothing. :meth:`HeldCancels.cancel_session` then records the cancel
under the session key and waits up to ``grace`` seconds; the run's node calls
:meth:`HeldCancels.claim` right after registering, and a hold recorded after the run was asked
for is applied to it. Claim and withdrawal are atomic, so the canceller's answer is true: it names
the run the cancel reached, or ``not_found`` and no run is cancelled by it. A run asked for after
the cancel is never touched (a stop pressed on an idle session does not poison the next message).

"After the run was asked for" is best decided by Redis: the run's node reads the session's hold
(:meth:`HeldCancels.seen`) when the run is asked for, and the run claims only a hold other than
the one it saw. Holds are ordered against that read by Redis itself, on any node; a hold recorded
between the ask and the read counts as earlier (the cancel answers ``not_found``: it is missed,
never misapplied). Comparing dates instead would set two nodes' estimates of the Redis clock
against each other: each is off by up to half a heartbeat's round trip, more when the node's loop
stalled as the answer came, so a cancel and an ask a few milliseconds apart could be ordered
either way.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import cast

from cancel_bus import CancelBus, CancelMode, CancelRequest, CancelResult, Outcome, RunStatus
from cancel_bus._redis import failure_of

POLL_SECONDS = 0.02  # how often a held cancel looks for its claim

# KEYS[1] the hold; ARGV[1] the run's id, ARGV[2] the id of the hold it saw when it was asked
# for ('' if none).
# Returns the hold (JSON) if it is not claimed and not the one seen; it is then marked claimed by
# the run. Otherwise nil.
_CLAIM = """
local hold_key = KEYS[1]
local run_id, seen = ARGV[1], ARGV[2]
local raw = redis.call('GET', hold_key)
if not raw then return false end
local hold = cjson.decode(raw)
if hold.claimed or hold.id == seen then return false end
hold.claimed = run_id
redis.call('SET', hold_key, cjson.encode(hold), 'KEEPTTL')
return raw
"""

# KEYS[1] the hold; ARGV[1] the canceller's hold id.
# Deletes the hold if it is this canceller's and unclaimed; returns the run id that claimed it,
# else nil.
_WITHDRAW = """
local hold_key, hold_id = KEYS[1], ARGV[1]
local raw = redis.call('GET', hold_key)
if not raw then return false end
local hold = cjson.decode(raw)
if hold.id ~= hold_id then return false end
if hold.claimed then return hold.claimed end
redis.call('DEL', hold_key)
return false
"""


class HeldCancels:
    """Held session cancels of one bus (keys under its namespace)."""

    def __init__(self, bus: CancelBus) -> None:
        self._bus = bus
        self._redis, prefix = bus._adapter_store()
        self._prefix = f"{prefix}held:"
        self._claim = self._redis.register_script(_CLAIM)
        self._withdraw = self._redis.register_script(_WITHDRAW)

    def key(self, session: tuple[str, str, str]) -> str:
        """The hold of a session key (its parts are valid bus ids: no separator inside)."""
        return self._prefix + ":".join(session)

    async def cancel_session(
        self,
        session: tuple[str, str, str],
        *,
        mode: CancelMode = CancelMode.CHECKPOINT,
        reason: str | None = None,
        grace: float,
        wait: bool = False,
        timeout: float = 5.0,
    ) -> CancelResult:
        """``bus.cancel_session(...)``; if the session has no active run, hold the cancel up to
        ``grace`` seconds for one that registers. ``not_found`` only if none did. With ``wait``,
        the run the cancel reached is waited for as the bus waits (``timeout``, after the grace
        if the cancel was held)."""
        bus = self._bus
        result = await bus.cancel_session(
            *session, mode=mode, reason=reason, wait=wait, timeout=timeout
        )
        if result.outcome is not Outcome.NOT_FOUND or grace <= 0:
            return result
        hold_id = uuid.uuid4().hex
        hold = {"id": hold_id, "at": f"{bus.clock():.6f}", "mode": mode.value, "reason": reason}
        key = self.key(session)
        await self._redis.set(key, json.dumps(hold), px=int((grace + 1) * 1000))
        # a run that registered between the first look and the hold did not see it
        result = await bus.cancel_session(
            *session, mode=mode, reason=reason, wait=wait, timeout=timeout
        )
        if result.outcome is not Outcome.NOT_FOUND:
            await self._withdraw(keys=[key], args=[hold_id])
            return result
        claimed = await self._claimed(key, hold_id, grace)
        if claimed is None:
            return result
        return _reached(
            await bus.cancel(claimed, mode=mode, reason=reason, wait=wait, timeout=timeout)
        )

    async def seen(self, session: tuple[str, str, str]) -> str | None:
        """The id of the cancel held for the session now (``""`` if none; ``None`` if Redis
        could not say). Read when a run is asked for: that hold was recorded before it, the run
        does not claim it (:meth:`claim`'s ``seen``)."""
        try:
            raw = await self._redis.get(self.key(session))
        except Exception as exc:
            if failure_of(exc) is None:
                raise
            return None  # out of reach: the run claims nothing (its registration will tell)
        if raw is None:
            return ""
        return str(json.loads(raw)["id"])

    async def claim(
        self, session: tuple[str, str, str], run_id: str, seen: str
    ) -> CancelRequest | None:
        """For a run just registered: the cancel held for its session since the run was asked
        for, now claimed by it; the caller applies it. The run was asked for when :meth:`seen`
        answered ``seen`` (an order Redis decides)."""
        raw = await self._claim(keys=[self.key(session)], args=[run_id, seen])
        if raw is None:
            return None
        hold = json.loads(cast(str | bytes, raw))
        return CancelRequest(
            mode=CancelMode(hold["mode"]),
            reason=hold["reason"],
            requested_by=None,
            requested_at=float(hold["at"]),
        )

    async def _claimed(self, key: str, hold_id: str, grace: float) -> str | None:
        """The run that claimed the hold within ``grace``; else the hold is withdrawn."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while loop.time() < deadline:
            raw = await self._redis.get(key)
            hold = json.loads(raw) if raw is not None else None
            if hold is None or hold["id"] != hold_id:
                return None  # expired, or replaced by a later cancel of the session
            if hold.get("claimed"):
                return str(hold["claimed"])
            await asyncio.sleep(POLL_SECONDS)
        claimed = await self._withdraw(keys=[key], args=[hold_id])
        return _text(claimed) if claimed is not None else None


def _reached(result: CancelResult) -> CancelResult:
    """The answer for the run that claimed the hold: its claimer recorded the cancel, so a run
    that has ended cancelled since was stopped by it (the bus answers a second request for an
    ended run ``already_finished``)."""
    run = result.run
    if result.outcome is not Outcome.ALREADY_FINISHED or run is None:
        return result
    if run.status is not RunStatus.CANCELLED:
        return result
    outcome = Outcome.OWNER_LOST if run.end_reason == "owner_lost" else Outcome.CANCELLED
    return result.model_copy(update={"outcome": outcome})


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
